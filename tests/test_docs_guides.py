"""Every command the guides show runs and exits 0, so a guide cannot drift from the code.

The convention of ``docs/guides/*.md`` (one test per page, in page order):

* a fenced block tagged ``bash`` holds commands; each of its lines that is not blank and does not start
  with ``#`` is one command, run with ``bash -c`` (a line ending in a backslash continues on the next);
  output examples go in blocks tagged ``text``, which are never run;
* the commands of a page run one after another in one fresh temporary folder (so a command can read
  what an earlier one wrote), with the virtual environment's ``bin`` first on ``PATH`` and the test
  session's graph cache (``ARCHPLACE_CACHE_DIR``, see conftest.py);
* a line starting with ``export `` sets variables for the rest of its page, and ``cd DIR`` changes the
  folder the page's later commands run in;
* a line ending in `` &`` starts a background process (a server) in its own process group, which is
  killed, with everything it started, when the page ends;
* every other line must exit 0 within ``TIMEOUT_S`` seconds.

The pages are marked ``system`` (``make test-system``): their commands start Ray and servers of their own.
A fast test checks, in ``make test``, that the guides exist and each has commands.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDES = ROOT / "docs" / "guides"
TIMEOUT_S = 300
PAGES = sorted(p.name for p in GUIDES.glob("*.md")) if GUIDES.is_dir() else []
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([^\s`{]*)")
# what bash itself sets, not the page's commands
_BASH_OWN = {"_", "SHLVL", "PWD", "OLDPWD"}


def commands(text: str) -> list[tuple[int, str]]:
    """(line number, command) of every runnable line of the ``bash`` blocks of a Markdown page."""
    out: list[tuple[int, str]] = []
    fence, runnable, pending = "", False, None
    for no, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if not fence:
            if m:
                fence, runnable = m.group(1), m.group(2) == "bash"
            continue
        if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            fence, runnable = "", False    # the closing fence
            continue
        if not runnable:
            continue
        s = line.strip()
        if pending is not None:
            pending = (pending[0], pending[1] + "\n" + s)
        elif s and not s.startswith("#"):
            pending = (no, s)
        if pending is not None and not pending[1].endswith("\\"):
            out.append(pending)
            pending = None
    if pending is not None:
        out.append(pending)
    return out


def base_env() -> dict[str, str]:
    env = dict(os.environ)
    assert "ARCHPLACE_CACHE_DIR" in env, "conftest.py sets ARCHPLACE_CACHE_DIR for the session"
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def _tail(text: str, n: int = 3000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the process group (a server and what it started); SIGKILL to what is left of it
    after ``grace_s``."""

    def group_alive() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (proc.poll() is None or group_alive()) and time.monotonic() < deadline:
        time.sleep(0.2)
    if proc.poll() is None or group_alive():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


class Page:
    """The state of one page's run: its folder, its variables and its background processes."""

    def __init__(self, name: str, folder: Path) -> None:
        self.name, self.cwd, self.env = name, folder, base_env()
        self.background: list[tuple[int, str, subprocess.Popen, Path]] = []

    def where(self, no: int, cmd: str) -> str:
        return f"docs/guides/{self.name}:{no}: {cmd}"

    def bash(self, no: int, cmd: str) -> subprocess.CompletedProcess:
        proc = subprocess.Popen(["bash", "-c", cmd], cwd=self.cwd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc, grace_s=5.0)
            out, err = proc.communicate()
            pytest.fail(f"{self.where(no, cmd)}\ntimed out after {TIMEOUT_S} s\nstdout:\n{_tail(out)}\n"
                        f"stderr:\n{_tail(err)}{self.background_logs()}")
        if proc.returncode != 0:
            pytest.fail(f"{self.where(no, cmd)}\nexit status {proc.returncode}\nstdout:\n{_tail(out)}\n"
                        f"stderr:\n{_tail(err)}{self.background_logs()}")
        return subprocess.CompletedProcess(cmd, 0, out, err)

    def background_logs(self) -> str:
        return "".join(f"\nbackground {self.where(no, cmd)} (exit status {p.poll()}), its output:\n"
                       f"{_tail(log.read_text(errors='replace'))}" for no, cmd, p, log in self.background)

    def run(self, no: int, cmd: str) -> None:
        if cmd.startswith("export "):
            # the variables as bash leaves them, so quoting and $(...) work as on a terminal
            res = self.bash(no, cmd + "\nenv -0")
            self.env = dict(kv.split("=", 1) for kv in res.stdout.split("\0") if "=" in kv)
            for k in _BASH_OWN:
                self.env.pop(k, None)
        elif re.match(r"cd(\s|$)", cmd):
            self.cwd = Path(self.bash(no, cmd + "\npwd").stdout.strip().splitlines()[-1])
        elif cmd.endswith(" &"):
            log = Path(tempfile.mkstemp(prefix="background-", suffix=".log", dir=self.cwd.parent)[1])
            with log.open("w") as f:
                proc = subprocess.Popen(["bash", "-c", cmd[:-1].rstrip()], cwd=self.cwd, env=self.env,
                                        stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
            self.background.append((no, cmd, proc, log))
        else:
            self.bash(no, cmd)

    def close(self) -> None:
        for _, _, proc, _ in self.background:
            _kill_group(proc)


def test_guides_exist() -> None:
    """The guides are there and each shows commands (a guide without any would test nothing)."""
    assert PAGES, f"no guides in {GUIDES}"
    empty = [p for p in PAGES if not commands((GUIDES / p).read_text())]
    assert not empty, f"guides without a ```bash command: {empty}"


def test_commands_parse() -> None:
    text = "\n".join(["# t", "```bash", "# a comment", "", "archplace models", "archplace graph \\",
                      "  bert-base --seq 32", "```", "```text", "not run", "```", "~~~bash",
                      "export A=1", "~~~", "    ```bash", "    cd x", "    ```"])
    assert commands(text) == [(5, "archplace models"), (6, "archplace graph \\\nbert-base --seq 32"),
                              (13, "export A=1"), (16, "cd x")]


@pytest.mark.system
@pytest.mark.parametrize("page", PAGES or ["(no guides)"])
def test_guide(page: str) -> None:
    assert PAGES, f"no guides in {GUIDES}"
    cmds = commands((GUIDES / page).read_text())
    assert cmds, f"docs/guides/{page} has no ```bash command"
    with tempfile.TemporaryDirectory(prefix=f"archplace-guide-{Path(page).stem}-") as tmp:
        folder = Path(tmp) / "work"
        folder.mkdir()
        run = Page(page, folder)
        started = time.monotonic()
        try:
            for no, cmd in cmds:
                run.run(no, cmd)
        finally:
            run.close()
        print(f"docs/guides/{page}: {len(cmds)} commands in {time.monotonic() - started:.0f} s")
