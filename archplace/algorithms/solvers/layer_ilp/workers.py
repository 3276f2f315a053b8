"""Process isolation for the backends.

OR-Tools and highspy each ship a different build of ``libhighs.so.1`` under the same soname; the
dynamic loader shares the first one loaded, so whichever of the two is imported second fails
(undefined symbols). HiGHS therefore always runs in a persistent worker subprocess that never
imports OR-Tools; CP-SAT runs in-process unless highspy was already loaded here, in which case it
gets its own worker too. Workers are plain ``python -c`` subprocesses speaking length-prefixed
pickles over pipes (no multiprocessing, so callers need no ``__main__`` guard). A call names its
function as ``"module.function"`` inside this package (``"milp._solve_milp"``).
"""

from __future__ import annotations

import importlib
import os
import time
import warnings
from pathlib import Path
from typing import Any

_WORKERS: dict[str, Any] = {}
_CPSAT_IN_PROCESS: list[bool] = []


def _cpsat_in_process() -> bool:
    if not _CPSAT_IN_PROCESS:
        try:
            from ortools.sat.python import cp_model  # noqa: F401

            _CPSAT_IN_PROCESS.append(True)
        except ImportError:
            _CPSAT_IN_PROCESS.append(False)
    return _CPSAT_IN_PROCESS[0]


def _worker_main() -> None:  # pragma: no cover - runs in the worker subprocess
    import pickle
    import struct
    import sys

    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # solver chatter on fd 1 must not corrupt the protocol
    while True:
        head = proto_in.read(8)
        if len(head) < 8:
            return
        (size,) = struct.unpack("<Q", head)
        fn_name, args = pickle.loads(proto_in.read(size))
        try:
            out = ("ok", _resolve(fn_name)(*args))
        except Exception as exc:  # report, keep serving
            out = ("err", f"{type(exc).__name__}: {exc}")
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        proto_out.write(struct.pack("<Q", len(data)) + data)
        proto_out.flush()
        sys.stderr.flush()


def _resolve(fn_name: str) -> Any:
    """``"module.function"`` inside this package -> the function (imported in the worker on first use)."""
    mod, _, attr = fn_name.rpartition(".")
    return getattr(importlib.import_module(f"{__package__}.{mod}"), attr)


def _drop_worker(name: str) -> None:
    proc = _WORKERS.pop(name, None)
    if proc is not None and proc.poll() is None:
        proc.kill()  # our own child, by its handle
        proc.wait()


def _call_isolated(name: str, fn_name: str, *args: Any, timeout_s: float) -> Any:
    """``fn_name(*args)`` in the persistent worker ``name``; None when it fails or overruns."""
    import pickle
    import select
    import struct
    import subprocess
    import sys

    proc = _WORKERS.get(name)
    if proc is None or proc.poll() is not None:
        root = str(Path(__file__).resolve().parents[4])  # the directory holding ``archplace``
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        _WORKERS[name] = proc
    deadline = time.monotonic() + timeout_s
    try:
        data = pickle.dumps((fn_name, args), protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.write(struct.pack("<Q", len(data)) + data)
        proc.stdin.flush()
        fd = proc.stdout.fileno()
        buf = b""
        need = 8
        size = None
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
            if size is None and len(buf) == 8:
                (size,) = struct.unpack("<Q", buf)
                buf, need = b"", size
        status, result = pickle.loads(buf)
    except (TimeoutError, EOFError, OSError, pickle.UnpicklingError):
        _drop_worker(name)
        return None
    if status != "ok":
        warnings.warn(f"layer ILP worker {name!r} failed: {result}", stacklevel=3)
        return None
    return result
