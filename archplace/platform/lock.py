"""One driver per output directory: an advisory ``flock`` on ``OUT/.lock``.

The kernel drops the lock when the holding process exits however it exits (SIGKILL, OOM, a lost
SSH session), so a crashed driver never leaves a stale lock behind and ``--resume`` can follow it
at once, while a second driver on a live search's directory is refused with the holder's pid, host
and start time. (``flock`` is local to one machine: on NFS shared between hosts it may not exclude
a driver on another host.)
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path


class OutDirLocked(ValueError):
    """Another live driver holds the output directory."""


class OutDirLock:
    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / ".lock"
        self._fh = None

    def acquire(self) -> OutDirLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            try:
                who = json.loads(fh.read() or "{}")
            except ValueError:
                who = {}
            fh.close()
            since = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["since"])) if "since" in who
                     else "?")
            raise OutDirLocked(f"--out {self.path.parent} is in use by another search "
                               f"(pid {who.get('pid', '?')} "
                               f"on {who.get('host', '?')} since {since}); wait for it to finish or choose "
                               "another directory") from None
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> OutDirLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
