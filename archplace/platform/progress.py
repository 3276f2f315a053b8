"""The search's progress line and its one clock: every elapsed time (the progress line, the summary's
wall time, report.md) counts from the run's start, which the command line sets to its process start."""

from __future__ import annotations

import logging
import sys
import threading
import time

# Phases are named on this logger (an INFO record each; a WARNING is a note that stays on screen):
# the command line prints them on stderr (archplace/cli/status.py), a library caller's logging decides.
_status = logging.getLogger("archplace.status")

# The run's clock: epoch seconds the run started. The command line sets its process start
# (set_run_start), so the progress line, the summary's wall time and report.md count from the moment the
# user pressed enter; None: each run counts from its own call.
_RUN_START: float | None = None


def set_run_start(epoch_s: float | None) -> None:
    """The start of the run every elapsed time counts from (None: each run's own call)."""
    global _RUN_START
    _RUN_START = epoch_s


def run_start() -> float:
    return _RUN_START if _RUN_START is not None else time.time()


# an ETA only once it means something: this many units done, and this share of them
ETA_MIN_DONE, ETA_MIN_FRACTION = 2, 0.10


class _Progress:
    """The per-architecture progress line on stderr. The elapsed time counts from the run's start
    (``start``, the command's process start from the CLI); the rate for the ETA from this line's own
    start (the evaluations, not Ray's start-up), and an ETA is shown only after ``ETA_MIN_DONE``
    results and ``ETA_MIN_FRACTION`` of the units (a batched trial's architectures arrive as one
    result: its first batch alone says nothing of the rate). On a terminal the line is redrawn every
    ``tick_s`` seconds even when nothing finished (the clock moves); elsewhere one line per result."""

    def __init__(self, total: int, stream=None, start: float | None = None, unit: str = "architectures",
                 tick_s: float = 5.0, phase: str | None = None) -> None:
        # the phase this line shows, handed over: a status printer above stops redrawing its own line
        _status.info(phase or f"evaluating {total} {unit}", extra={"handover": True})
        self.total, self.done, self.failed, self.results = total, 0, 0, 0
        self.start = run_start() if start is None else start
        self.t_eval = time.time()
        self.best = 0.0
        self.unit = unit
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._lock = threading.Lock()
        self._drawn = False
        self._stop = threading.Event()
        self._ticker = None
        if self.tty:
            self._ticker = threading.Thread(target=self._tick, args=(tick_s,), daemon=True,
                                            name="archplace-progress")
            self._ticker.start()

    def elapsed(self) -> float:
        return time.time() - self.start

    def line(self) -> str:
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        eta = ""
        if self.results >= ETA_MIN_DONE and ETA_MIN_FRACTION * self.total <= self.done < self.total:
            rate = (time.time() - self.t_eval) / self.done
            eta = f"  ETA {_hms(rate * (self.total - self.done))}"
        best = f"  best avg {self.best:,.1f} samples/s" if self.done else ""
        return (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {self.unit}  "
                f"elapsed {_hms(self.elapsed())}{eta}{best}"
                + (f"  failed {self.failed}" if self.failed else ""))

    def _draw(self) -> None:
        try:
            self.stream.write(("\r" + self.line() + "\x1b[K") if self.tty else self.line() + "\n")
            self.stream.flush()
            self._drawn = True
        except (OSError, ValueError):   # stderr went away: the search goes on without its line
            self._stop.set()

    def _tick(self, tick_s: float) -> None:
        self._draw_locked()
        while not self._stop.wait(tick_s):
            self._draw_locked()

    def _draw_locked(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._draw()

    def update(self, value: float | None, failed: bool = False) -> None:
        self.update_many([value], failed)

    def update_many(self, values: list[float | None], failed: bool = False) -> None:
        """One result of one or more units (a batched trial's architectures), drawn once."""
        with self._lock:
            self.done += len(values)
            self.results += 1
            self.failed += len(values) if failed else 0
            for v in values:
                if v is not None:
                    self.best = max(self.best, v)
            self._draw()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=1.0)
        with self._lock:
            if self.tty and self._drawn:
                try:
                    self.stream.write("\n")
                    self.stream.flush()
                except (OSError, ValueError):
                    pass


def _hms(s: float) -> str:
    s = int(round(max(s, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
