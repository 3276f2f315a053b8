"""The search's content-keyed schedule cache on disk: ``OUT/schedule_cache.jsonl``.

A layer slice's ILP is keyed by ``schedule_cache_key`` (op kinds, latencies, edges, core counts,
solver settings), so a key names its answer whatever architecture or search asked for it. The
driver appends every slice a trial solved (one JSON line per slice, O(1) per trial) and loads the
file when a search starts, so ``--resume``, ``--retry-failed`` and a repeated search pointed at the
same file (``--schedule-cache``) reuse solved slices instead of solving them again.

Across *different* architectures of one search the keys almost never repeat (they hold the
architecture's latencies), which is why this replaced the central cache actor that every solve
used to consult: it answered nearly nothing and sat on every solve's path. The first line is a
header with the code versions that produced the makespans; a file from other versions is set
aside (renamed ``*.stale``), not trusted. Format 2 (work budgets, issue 28): a line is ``[key,
makespan_s, status, gap, stopped_by, dtime]``; a slice the wall-clock safety limit or a solver
failure stopped is not written, since its answer depends on the load of the machine that solved it
(a later search solves it again). Files of format 1 (wall-clock limits) are set aside.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..algorithms.solvers.layer_ilp.budget import LOAD_DEPENDENT

FORMAT = 2


def code_versions() -> dict[str, str]:
    from importlib.metadata import version

    return {"format": str(FORMAT), "archplace": version("archplace"), "ortools": version("ortools")}


class ScheduleCacheFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.note = ""

    def load(self) -> dict[str, list]:
        """key -> [makespan_s, status, gap, stopped_by, dtime] from the file (empty when missing or from
        other versions); gap is None where no bound was proven."""
        if not self.path.exists():
            return {}
        try:
            return self._load()
        except (OSError, UnicodeDecodeError) as e:   # a directory, no permission, binary junk
            raise ValueError(f"--schedule-cache {self.path}: cannot read it as the schedule cache "
                             f"({getattr(e, 'strerror', None) or e})") from None

    def _load(self) -> dict[str, list]:
        out: dict[str, list] = {}
        with open(self.path, encoding="utf-8") as fh:
            header = fh.readline()
            try:
                ok = json.loads(header).get("versions") == code_versions()
            except ValueError:
                ok = False
            if not ok:
                stale = self.path.with_suffix(".jsonl.stale")
                fh.close()
                os.replace(self.path, stale)
                self.note = f"{self.path.name} came from other code versions; set aside as {stale.name}"
                return {}
            for line in fh:
                try:
                    k, makespan, status, gap, stopped_by, dtime = json.loads(line)
                except ValueError:
                    continue   # a line cut short by a crash
                out[k] = [float(makespan), status, gap, stopped_by, dtime]
        return out

    def append(self, entries: dict[str, list]) -> None:
        """Write ``key -> [makespan_s, status, gap, stopped_by, dtime]``, less the load-dependent ones."""
        entries = {k: v for k, v in entries.items() if v[3] not in LOAD_DEPENDENT}
        if not entries:
            return
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            if new:
                fh.write(json.dumps({"versions": code_versions()}) + "\n")
            fh.write("".join(json.dumps([k, *v[:5]]) + "\n" for k, v in entries.items()))
