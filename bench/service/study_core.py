"""CPU per suggest and per complete of the study service's core (``service.studies.StudyService``) in
this process, without HTTP or Serve: what issue 47's item 2 (one short transaction per request, statements
built once) changes, apart from the hop.

One StudyService on a fresh SQLite file (the service's settings: WAL, ``synchronous=NORMAL``), one study
(bert-large, the Phaze Table 1 space), ``--rounds`` rounds of ``suggest(count=1)`` then ``complete`` from
8 client ids in turn, after 10 warm-up rounds; CPU is the calling thread's (``time.thread_time``), so a
pool's background refill (``--pool``) is not counted in the request. The JSON records the suggested
architectures' hash, so runs of two commits can be checked to suggest the same.

    python bench/service/study_core.py [--searcher random] [--rounds 400] [--pool 0] [--out FILE.json]
    PYTHONPATH=<worktree of another commit> python bench/service/study_core.py --out ...  # before/after
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402


def run(searcher: str, rounds: int, pool: int) -> dict:
    import archplace
    from archplace.service.db import make_engine
    from archplace.service.schemas import CompleteRequest, StudyCreate, SuggestRequest
    from archplace.service.studies import StudyService

    kw = {"pool": pool} if pool else {}
    with tempfile.TemporaryDirectory() as d:
        svc = StudyService(make_engine(os.path.join(d, "s.db")), **kw)
        svc.create("o", StudyCreate(name="s", models=["bert-large"], searcher=searcher, seed=0))
        sug, com, seq = [], [], []
        for k in range(10 + rounds):
            a = time.thread_time()
            t = svc.suggest("o", "s", SuggestRequest(client_id=f"c{k % 8}", count=1)).trials[0]
            b = time.thread_time()
            svc.complete("o", "s", t.number, CompleteRequest(state="COMPLETED", value=float(k % 17)))
            c = time.thread_time()
            if k >= 10:
                sug.append(b - a)
                com.append(c - b)
            seq.append(int(t.arch_index))
    import subprocess

    where = Path(archplace.__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                          text=True).stdout.strip()
    return {"archplace_path": str(where), "archplace_commit": head, "searcher": searcher,
            "rounds": rounds, "pool": pool,
            "suggest_cpu_ms": {"mean": statistics.fmean(sug) * 1e3, "median": statistics.median(sug) * 1e3},
            "complete_cpu_ms": {"mean": statistics.fmean(com) * 1e3, "median": statistics.median(com) * 1e3},
            "suggested_sha256": hashlib.sha256(json.dumps(seq).encode()).hexdigest()[:16]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--searcher", default="random")
    ap.add_argument("--rounds", type=int, default=400)
    ap.add_argument("--pool", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "study_core.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    r = run(args.searcher, args.rounds, args.pool)
    doc = {"benchmark": "study_core", **git_state(), "command": command(), "machine": machine(load), **r}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{r['archplace_path']} ({r['archplace_commit'][:8]}): suggest "
          f"{r['suggest_cpu_ms']['mean']:.2f} ms, "
          f"complete {r['complete_cpu_ms']['mean']:.2f} ms of CPU (mean of {args.rounds}); suggested "
          f"{r['suggested_sha256']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
