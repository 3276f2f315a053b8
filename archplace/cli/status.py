"""Status lines on stderr while a command works: no silent minute.

A command names each phase as it starts (``archplace search [0:03] starting Ray``); the layers below the
command line name theirs through the standard ``logging`` module, on the logger :data:`LOGGER`
(``archplace.status``): an INFO record is a phase, a WARNING record a note that stays on screen
(``note: config.json lacks num_key_value_heads, ...``). Nothing below the command line imports this
module; without a :class:`Status` the records go where the caller's logging sends them (nowhere for
INFO, stderr for a WARNING, Python's default).

* The first status line appears once the command has run :data:`DELAY_S` seconds (counted from the
  process start; ``ARCHPLACE_STATUS_DELAY`` overrides it), so a command or an error that is done sooner
  prints nothing more than before; after that every phase is printed as it starts.
* On a terminal the current phase's line is rewritten with the elapsed time every :data:`TICK_S` seconds;
  elsewhere (a file, a pipe) each phase is one plain line. A phase that hands the terminal over to a
  progress line of its own (``handover``: the search's per-architecture bar) is not rewritten.
* One clock: :func:`process_start` is when the process started; the elapsed times here, the search's
  progress line, its summary and its report.md all count from it.
* Status lines go to stderr only: ``--json`` output on stdout stays one JSON object.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

LOGGER = "archplace.status"
DELAY_ENV = "ARCHPLACE_STATUS_DELAY"
DELAY_S = 1.5
TICK_S = 5.0
_IMPORTED = time.time()


def process_start() -> float:
    """Epoch seconds at which this process started: Linux's ``/proc/self/stat`` against the boot clock
    (10 ms resolution), else the time this module was imported."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        start = time.time() - age
        if 0 <= age and start <= _IMPORTED:
            return start
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    return _IMPORTED


def hms(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour."""
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


_ACTIVE: Status | None = None


def active() -> Status | None:
    """The status printer of the command running in this process (None: none, or a caller of ``main``
    that passed its argv)."""
    return _ACTIVE


def phase(text: str, **extra: Any) -> None:
    """Announce a phase (what the command does from now on) through :data:`LOGGER`."""
    logging.getLogger(LOGGER).info(text, extra=extra or None)


def stages(texts: dict[str, Any]) -> Callable[[str, dict], None]:
    """An API ``progress`` function that names the next phase when a stage ends: ``texts`` maps a
    stage to the text (or to a function of the stage's info giving it, or None for nothing)."""
    def progress(stage: str, info: dict) -> None:
        text = texts.get(stage)
        text = text(info) if callable(text) else text
        if text:
            phase(text)
    return progress


def note(text: str) -> None:
    """A line that stays on screen (a default taken, the cluster joined)."""
    logging.getLogger(LOGGER).warning(text)


class _Handler(logging.Handler):
    def __init__(self, status: Status) -> None:
        super().__init__(logging.INFO)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must not end the command
            return
        if record.levelno >= logging.WARNING:
            self.status.note(text)
        else:
            self.status.phase(text, handover=bool(getattr(record, "handover", False)))


class Status:
    """The status printer of one command (a context manager). ``enabled=False``: the phases are
    dropped (``main(argv)`` called from Python: only results and errors, as before)."""

    def __init__(self, command: str, first_phase: str | None = None, *, stream: TextIO | None = None,
                 enabled: bool = True, start: float | None = None, delay_s: float | None = None,
                 tick_s: float = TICK_S) -> None:
        self.command, self.enabled = command, enabled
        self._owned = None
        if stream is None:
            stream = sys.stderr
            if enabled:
                # a file of its own on stderr's descriptor: the lines still reach the terminal while a
                # layer below points descriptor 2 elsewhere (Ray's attach captures what its C++ client
                # logs there, for as long as the attach takes)
                try:
                    stream = self._owned = os.fdopen(os.dup(stream.fileno()), "w", buffering=1,
                                                     encoding=getattr(stream, "encoding", None) or "utf-8",
                                                     errors="replace")
                except (AttributeError, OSError, ValueError):
                    pass
        self.stream = stream
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = process_start() if start is None else start
        if delay_s is None:
            try:
                delay_s = float(os.environ.get(DELAY_ENV, DELAY_S))
            except ValueError:
                delay_s = DELAY_S
        self.delay_s, self.tick_s = max(delay_s, 0.0), tick_s
        self._phase = first_phase
        self._visible = False     # the delay has passed: phases are printed
        self._open = False        # a terminal line without its newline (the current phase)
        self._paused = False      # a progress line of the layer below owns the terminal
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._handler: _Handler | None = None
        self._saved: tuple[int, bool] | None = None

    # ------------------------------------------------------------------ the clock
    def elapsed(self) -> float:
        return time.time() - self.start

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Status:
        if not self.enabled:
            return self
        log = logging.getLogger(LOGGER)
        self._saved = (log.level, log.propagate)
        self._handler = _Handler(self)
        log.addHandler(self._handler)
        log.setLevel(logging.INFO)
        log.propagate = False   # printed here once, not again by a handler the caller put on the root
        self._thread = threading.Thread(target=self._run, name="archplace-status", daemon=True)
        self._thread.start()
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop printing; a terminal's open status line is cleared, so the summary (or the error)
        starts on a clean line."""
        if not self.enabled or self._stop.is_set():
            return
        self._stop.set()
        self._wake.set()
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        log = logging.getLogger(LOGGER)
        if self._handler is not None:
            log.removeHandler(self._handler)
        if self._saved is not None:
            log.setLevel(self._saved[0])
            log.propagate = self._saved[1]
        with self._lock:
            if self._open:
                self._write("\r\x1b[K")
                self._open = False
            if self._owned is not None:
                try:
                    self._owned.close()
                except OSError:
                    pass
                self._owned = None

    # ------------------------------------------------------------------ what the command says
    def phase(self, text: str, handover: bool = False) -> None:
        if not self.enabled or self._stop.is_set():
            return
        with self._lock:
            if text == self._phase and not handover:
                return      # the same phase again (a graph read from the cache per timing): one line
            self._phase = text
            self._paused = False
            if self._visible:
                self._show(final=handover)
            self._paused = handover

    def note(self, text: str) -> None:
        """Printed at once, whatever the delay, and kept (a terminal's status line is redrawn below it)."""
        if not self.enabled or self._stop.is_set():
            print(text, file=sys.stderr, flush=True)
            return
        with self._lock:
            if self._open:
                self._write("\r\x1b[K")
                self._open = False
            self._write(text + "\n")
            if self._visible and self.tty and not self._paused and self._phase:
                self._show()

    # ------------------------------------------------------------------ printing
    def line(self) -> str:
        return f"archplace {self.command} [{hms(self.elapsed())}] {self._phase}"

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):   # stderr closed (a reader that left): nothing to say it to
            self._stop.set()

    def _show(self, final: bool = False) -> None:
        """The current phase: a new line (its own line on a terminal, kept open for the clock)."""
        if not self._phase:
            return
        if self.tty:
            if self._open:
                self._write("\n")
            self._write(self.line() + ("\n" if final else ""))
            self._open = not final
        else:
            self._write(self.line() + "\n")

    def _tick(self) -> None:
        """A terminal's open line with the clock moved on."""
        if self.tty and self._open and not self._paused:
            self._write("\r" + self.line() + "\x1b[K")

    def _run(self) -> None:
        wait = self.start + self.delay_s - time.time()
        if wait > 0 and self._stop.wait(wait):
            return
        with self._lock:
            if self._stop.is_set():
                return
            self._visible = True
            if not self._paused:
                self._show()
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self._tick()
