"""A clean stop at any moment: SIGTERM or Ctrl-C (SIGINT to the process group, as a terminal sends it)
while ``archplace serve``, ``search`` or ``place-ops --algo gdp`` starts Ray, works or shuts down ends
the command within 30 s with one line on stderr (``archplace CMD: stopped by SIGTERM``), exit status
128 + the signal (0 for a service that was up and shut down on request), no native stack trace from
Ray's core worker, nothing it started left running, and the service's port free.

Old: a SIGTERM soon after start-up aborted with Ray's C++ trace (exit -6, SIGABRT); a Ctrl-C while
``serve`` started Ray was swallowed and the service came up anyway; one while a search started Ray
could be swallowed too (the search ran to the end and exited 0); a SIGTERM while Ray started left
its dashboard and runtime-env agents running; a TERM-ed ``place-ops --algo gdp`` printed pages of
native frames.

The first tests drive the stop machinery (``ray_connect.install_stop_handlers``) in a plain Python
process, in about a second each; the ``system`` ones run the real commands with their own Ray."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from service_util import free_port

from archplace.platform.store import ResultStore

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 30.0   # the bound, from the first signal to the exit
NATIVE = re.compile(r"\*\*\* SIG|\*\*\* Signal|Stack trace|@\s+0x|Aborted|core dumped|logging\.cc|PC: @")


def _env(**extra: str) -> dict[str, str]:
    """No RAY_* variable (no RAY_ADDRESS to follow); status lines at once, so a phase can be waited for."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_") and k != "ARCHPLACE_FAULT_INJECT"}
    return {**env, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0", "ARCHPLACE_STATUS_DELAY": "0",
            **extra}


# ---------------------------------------------------------------------- processes
def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(root: int) -> dict[int, str]:
    children: dict[int, list[tuple[int, str]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (st := _stat(int(name))) is not None:
            children.setdefault(int(st[1]), []).append((int(name), st[19]))
    out, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), ()):
            out[pid] = start
            todo.append(pid)
    return out


def _alive(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[19] == start and st[0] not in ("Z", "X")


class Command:
    """A command in a session of its own (its process group): its stdout and stderr lines, and every
    process below it, polled while it runs."""

    def __init__(self, args: list[str], **env: str) -> None:
        self.proc = subprocess.Popen(args, cwd=REPO, env=_env(**env), stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self.tree: dict[int, str] = {}
        self._new = threading.Condition()
        for stream, lines in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, lines), daemon=True).start()
        threading.Thread(target=self._track, daemon=True).start()

    def _pump(self, stream, lines: list[str]) -> None:
        for line in stream:
            with self._new:
                lines.append(line.rstrip("\n"))
                self._new.notify_all()

    def _track(self) -> None:
        while self.proc.poll() is None:
            self.tree.update(_descendants(self.proc.pid))
            time.sleep(0.2)

    def wait_for(self, pattern: str, timeout_s: float = 240) -> None:
        """Until a line of stdout or stderr matches ``pattern``."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        with self._new:
            while not any(rx.search(ln) for ln in self.out + self.err):
                if self.proc.poll() is not None:
                    raise AssertionError(f"exited ({self.proc.returncode}) before {pattern!r}: "
                                         + "\n".join(self.err[-20:]))
                if time.monotonic() >= deadline:
                    raise AssertionError(f"no {pattern!r} in {timeout_s} s: " + "\n".join(self.err[-20:]))
                self._new.wait(0.2)

    def stop(self, *signals: int, group: bool = False, between_s: float = 1.0) -> float:
        """Send the signals (``between_s`` apart; to the process group with ``group``, as a terminal's
        Ctrl-C, or systemd's stop, is sent), wait for the exit; seconds from the first signal."""
        self.tree.update(_descendants(self.proc.pid))
        t0 = time.monotonic()
        for i, sig in enumerate(signals):
            if i:
                time.sleep(between_s)
            if self.proc.poll() is None:
                (os.killpg if group else os.kill)(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=BOUND_S + 30)
        finally:
            self.kill()
        took = time.monotonic() - t0
        time.sleep(0.5)   # the pumps take the last lines
        return took

    def kill(self) -> None:
        """Whatever is left (a failed test): the group, and every process seen below the command."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def survivors(self) -> list[str]:
        time.sleep(1.0)
        left = [pid for pid, start in self.tree.items() if _alive(pid, start)]
        names = []
        for pid in left:
            try:
                names.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
                os.kill(pid, signal.SIGKILL)   # not for the next test to meet
            except OSError:
                pass
        return names

    def check(self, took: float, rc: set[int], last: str) -> None:
        err = "\n".join(self.err)
        assert took < BOUND_S, f"{took:.1f} s after the signal:\n{err[-3000:]}"
        assert self.proc.returncode in rc, f"exit {self.proc.returncode}:\n{err[-3000:]}"
        lines = [ln for ln in self.err if ln.strip()]
        assert lines and lines[-1] == last, err[-3000:]
        native = [ln for ln in self.err + self.out if NATIVE.search(ln)]
        assert not native, "\n".join(native[:10])
        assert not any("Traceback" in ln or "Exception ignored" in ln for ln in self.err), err[-3000:]
        assert self.survivors() == []


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "archplace.cli", *args]


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# ---------------------------------------------------------------------- the stop machinery, no Ray
STOP_SCRIPT = """
import sys, time
from archplace.platform import ray_connect as rc
rc.install_stop_handlers("archplace demo", grace_s=float(sys.argv[2]))
try:
    {body}
except KeyboardInterrupt as e:
    rc.stopping()
    {cleanup}
    rc.say(rc.stop_line(rc.stop_signal()))
    sys.exit(128 + rc.stop_signal())
"""


READY = "print('ready', flush=True); "


def _demo(body: str, cleanup: str = "pass", grace_s: float = 10.0) -> Command:
    """``body`` prints "ready" where the signal is to come."""
    code = textwrap.dedent(STOP_SCRIPT).format(body=body, cleanup=cleanup)
    cmd = Command([sys.executable, "-c", code, "demo", str(grace_s)])
    cmd.wait_for("^ready$", timeout_s=60)
    return cmd


def test_sigterm_interrupts_the_work():
    cmd = _demo(READY + "time.sleep(60)")
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace demo: stopped by SIGTERM")


def test_an_interrupt_a_library_swallows_is_raised_again():
    """A bare ``except:`` (as in code Ray runs while it starts) ate the KeyboardInterrupt, and the command
    went on as if nothing had happened."""
    body = f"try:\n        {READY}time.sleep(60)\n    except BaseException:\n        pass\n    time.sleep(60)"
    cmd = _demo(body)
    took = cmd.stop(signal.SIGINT)
    cmd.check(took, {130}, "archplace demo: stopped by SIGINT")
    assert took >= 1.5   # raised again by the watchdog, RERAISE_S after the first


def test_a_second_signal_does_not_cut_the_clean_up_short():
    cmd = _demo(READY + "time.sleep(60)", cleanup="time.sleep(3); print('cleaned up', flush=True)")
    took = cmd.stop(signal.SIGTERM, signal.SIGTERM, signal.SIGINT, between_s=0.5)
    cmd.check(took, {143}, "archplace demo: stopped by SIGTERM")
    assert "cleaned up" in cmd.out


def test_a_clean_up_that_hangs_ends_at_the_grace_period():
    cmd = _demo(READY + "time.sleep(60)", cleanup="time.sleep(60)", grace_s=2.0)
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace demo: stopped by SIGTERM (its clean-up cut short after 2 s)")
    assert took < 10


# ---------------------------------------------------------------------- archplace serve
@pytest.mark.system
def test_serve_sigterm_while_ray_starts(tmp_path):
    port = free_port()
    cmd = Command(_cli("serve", "--auth", "none", "--port", str(port), "--db", str(tmp_path / "s.db")))
    cmd.wait_for("starting Ray")
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace serve: stopped by SIGTERM")
    assert _port_free(port)


@pytest.mark.system
def test_serve_ctrl_c_while_serve_starts(tmp_path):
    port = free_port()
    cmd = Command(_cli("serve", "--auth", "none", "--port", str(port), "--db", str(tmp_path / "s.db")))
    cmd.wait_for("starting the service on Ray Serve")
    took = cmd.stop(signal.SIGINT, group=True)
    cmd.check(took, {130}, "archplace serve: stopped by SIGINT")
    assert _port_free(port)


@pytest.mark.system
def test_serve_sigterm_while_serving_and_again_while_it_shuts_down(tmp_path):
    """The service was up: it shuts down cleanly on request, exit 0 (as before); the second SIGTERM,
    while it shuts down, changes nothing."""
    port = free_port()
    cmd = Command(_cli("serve", "--auth", "none", "--port", str(port), "--db", str(tmp_path / "s.db")))
    cmd.wait_for("^archplace service on ")
    took = cmd.stop(signal.SIGTERM, signal.SIGTERM)
    cmd.check(took, {0}, "archplace serve: stopped by SIGTERM")
    assert "shutting down" in cmd.err
    assert _port_free(port)


# ---------------------------------------------------------------------- archplace search
SEARCH = ["search", "bert-base", "--devices", "64", "--global-batch", "256", "--microbatches", "1",
          "--hbm", "32", "--schedule", "sequential", "--searcher", "grid"]


def _rows(out: Path) -> list[dict]:
    if not (out / "search.json").exists():
        return []
    s = ResultStore(out)
    s.load()
    return s.rows


@pytest.mark.system
def test_search_sigterm_while_ray_starts_leaves_no_out(tmp_path):
    out = tmp_path / "o"
    cmd = Command(_cli(*SEARCH, "--max-archs", "2", "--out", str(out)))
    cmd.wait_for("starting Ray")
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace search: stopped by SIGTERM")
    assert not out.exists()   # nothing was stored: nothing to resume, nothing in the way


@pytest.mark.system
def test_search_sigterm_while_evaluating_keeps_the_rows(tmp_path):
    """Every architecture finished before the SIGTERM is stored, and the line says how to go on."""
    out = tmp_path / "o"
    cmd = Command(_cli(*SEARCH, "--max-archs", "6", "--workers", "1", "--out", str(out)),
                  ARCHPLACE_FAULT_INJECT="slow:*:2")
    deadline = time.monotonic() + 240
    while not _rows(out):
        assert cmd.proc.poll() is None and time.monotonic() < deadline, "\n".join(cmd.err[-20:])
        time.sleep(0.2)
    before = {r["arch_key"] for r in _rows(out)}
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace search: stopped by SIGTERM, resume with --resume")
    after = {r["arch_key"] for r in _rows(out)}
    assert before <= after and len(after) < 6


# ---------------------------------------------------------------------- archplace place-ops --algo gdp
GDP = ["place-ops", "txl-2", "--algo", "gdp", "--max-evals", "200"]


@pytest.mark.system
def test_place_ops_gdp_sigterm_while_ray_starts():
    cmd = Command(_cli(*GDP))
    cmd.wait_for("starting Ray")
    took = cmd.stop(signal.SIGTERM)
    cmd.check(took, {143}, "archplace place-ops: stopped by SIGTERM")


@pytest.mark.system
def test_place_ops_gdp_ctrl_c_while_placing():
    cmd = Command(_cli(*GDP))
    cmd.wait_for(r"placing \d+ operators \(gdp\)")
    took = cmd.stop(signal.SIGINT, group=True)
    cmd.check(took, {130}, "archplace place-ops: stopped by SIGINT")
