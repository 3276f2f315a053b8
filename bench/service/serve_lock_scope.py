"""One owner's slow searcher against another owner's completions, in one service replica.

A replica is a ``StudyService`` over the database (``archplace serve`` runs one per Serve replica, its
request threads calling into it), so the bench drives it in-process with two threads:

* owner ``bob``: a small random study; the thread suggests one trial and completes it, over and over,
  timing each **complete** (the request the issue found 10x slower);
* owner ``alice``: an Optuna (TPE) study over bench/service/serve_memory.py's space (459,571 feasible
  architectures), suggesting and completing as fast as it can.

Reported: bob's complete latency p50/p99 alone, then with alice's loop running, and how many
rounds alice made meanwhile. With the searcher inside the process-wide SQLite write lock, every one
of bob's completes that arrives during alice's ask waits for the whole ask; outside it, bob waits only
for the write transactions themselves (and for Python's GIL, which both threads share).

    python bench/service/serve_lock_scope.py [--completes 200] [--out
        bench/service/results/serve_lock_scope.json]
                                     [--baseline OLD.json --baseline-commit SHA]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # measure this tree's archplace
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402
from serve_memory import SPACE, _warm_imports  # noqa: E402


def _bob_completes(svc, n: int) -> list[float]:
    from archplace.service.schemas import CompleteRequest, SuggestRequest

    out = []
    for k in range(n):
        t = svc.suggest("bob", "b", SuggestRequest(count=1, client_id="bob")).trials[0]
        t0 = time.perf_counter()
        svc.complete("bob", "b", t.number, CompleteRequest(value=float(k)))
        out.append(time.perf_counter() - t0)
    return out


def run(completes: int) -> dict:
    import numpy as np

    _warm_imports()
    from archplace.service.db import make_engine
    from archplace.service.schemas import CompleteRequest, StudyCreate, SuggestRequest
    from archplace.service.studies import StudyService

    with tempfile.TemporaryDirectory() as tmp:
        svc = StudyService(make_engine(str(Path(tmp) / "s.db")))
        svc.create("bob", StudyCreate(name="b", models=["bert-base"], searcher="random"))
        svc.create("alice", StudyCreate(name="a", models=["bert-base"], searcher="optuna", space=SPACE,
                                        max_area_mm2=10_000.0))
        _bob_completes(svc, 20)  # warm
        alone = _bob_completes(svc, completes)
        stop, rounds = threading.Event(), [0]

        def alice() -> None:
            while not stop.is_set():
                t = svc.suggest("alice", "a", SuggestRequest(count=1, client_id="alice")).trials[0]
                svc.complete("alice", "a", t.number, CompleteRequest(value=float(rounds[0] % 13)))
                rounds[0] += 1

        th = threading.Thread(target=alice)
        th.start()
        while rounds[0] < 3:  # alice's study is built and TPE has a history
            time.sleep(0.05)
        r0 = rounds[0]
        busy = _bob_completes(svc, completes)
        r1 = rounds[0]
        stop.set()
        th.join()

    def q(x: list[float]) -> dict:
        a = np.asarray(x) * 1e3
        pct = {f"p{p}_ms": round(float(np.percentile(a, p)), 2) for p in (50, 99)}
        return {**pct, "mean_ms": round(float(a.mean()), 2)}

    return {"completes": completes, "alone": q(alone), "beside_optuna": q(busy),
            "alice_rounds_meanwhile": r1 - r0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--completes", type=int, default=200)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_lock_scope.json"))
    ap.add_argument("--baseline", help="a result JSON of this script on an older tree, embedded")
    ap.add_argument("--baseline-commit", help="the commit the baseline tree was archived from")
    a = ap.parse_args()
    load = os.getloadavg()
    r = run(a.completes)
    result = {**git_state(), "command": command(), "machine": machine(load), **r}
    if a.baseline:
        base = json.loads(Path(a.baseline).read_text())
        base["commit"] = a.baseline_commit or base.get("commit")
        result["baseline"] = base
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
