"""The search directory's lock and schedule cache file (plain Python, no Ray)."""

import json
import subprocess
import sys

import pytest

from archplace.platform.lock import OutDirLock, OutDirLocked
from archplace.platform.schedule_cache import ScheduleCacheFile, code_versions


def test_second_lock_is_refused_and_a_dead_holder_leaves_none(tmp_path):
    with OutDirLock(tmp_path):
        with pytest.raises(OutDirLocked, match="is in use by another search"):
            OutDirLock(tmp_path).acquire()
    OutDirLock(tmp_path).acquire().release()   # released: free again
    # a holder killed with SIGKILL: the kernel drops the lock with the process
    code = (f"import os, signal; from archplace.platform.lock import OutDirLock; "
            f"OutDirLock({str(tmp_path)!r}).acquire(); os.kill(os.getpid(), signal.SIGKILL)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    OutDirLock(tmp_path).acquire().release()


def test_schedule_cache_round_trip_torn_line_and_other_versions(tmp_path):
    f = ScheduleCacheFile(tmp_path / "c.jsonl")
    assert f.load() == {}
    f.append({"a": [1.5, "optimal", 0.0, "optimal", 0.5],
              "b": [2.0, "feasible", 0.25, "deterministic_limit", 1.0]})
    # answers that depend on the machine's load are not written
    f.append({"c": [3.0, "fallback", None, "wall_limit", 0.2],
              "e": [1.0, "fallback", None, "solver_failed", 0.0],
              "g": [5.0, "trivial", 0.0, "closed_form", 0.0]})
    with open(f.path, "a") as fh:
        fh.write('["d", 4.')   # a line cut short by a crash
    assert ScheduleCacheFile(f.path).load() == {"a": [1.5, "optimal", 0.0, "optimal", 0.5],
                                                "b": [2.0, "feasible", 0.25, "deterministic_limit", 1.0],
                                                "g": [5.0, "trivial", 0.0, "closed_form", 0.0]}
    lines = f.path.read_text().splitlines()
    assert json.loads(lines[0]) == {"versions": code_versions()}
    old = json.dumps({"versions": {**code_versions(), "ortools": "0"}})
    f.path.write_text(old + "\n" + "\n".join(lines[1:]))
    g = ScheduleCacheFile(f.path)
    assert g.load() == {} and "other code versions" in g.note
    assert not f.path.exists() and (tmp_path / "c.jsonl.stale").exists()
