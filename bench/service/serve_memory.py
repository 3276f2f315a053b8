"""Memory and cold-read cost of a study over a ~1M-point search space in a service replica.

A replica is a ``StudyService`` over the shared database (``archplace serve`` runs one per Serve
replica), so the bench drives ``StudyService`` in-process, each scenario in a fresh Python process so
that one scenario's caches and freed-but-kept heap cannot flatter the next:

* **study** (per searcher): create a study over the space below, run 30 ask/tell rounds, then delete
  it. Reported: the replica's memory after the rounds and after the delete, as Python's tracemalloc
  sees it (numpy arrays included) and as RSS (after ``malloc_trim``, so freed heap goes back to the
  system), each as the increase over the same process before the study was created (with every
  module already imported).
* **cold listing**: a database holding the four studies (one per searcher), 30 rounds each, written
  by another process; a fresh replica lists them (``GET /v1/studies``), reads each (``GET``) and lists
  each one's trials. Reported: wall time of those reads and the memory they add (tracemalloc peak and
  current, RSS).

The space: every field a power-of-two axis, 958,035 grid points (16 x 17 x 15 x 17 x 13, the largest
such grid under the service's 1,000,000-point limit), and the largest area the service accepts
(10,000 mm2), so that as many points as possible are feasible (467,368).

    python bench/service/serve_memory.py [--out bench/service/results/serve_memory.json] [--rounds 30]
                                 [--baseline OLD.json --baseline-commit SHA]

``--baseline`` embeds the result of the same script run on an older tree (``git archive SHA``
unpacked elsewhere, where git cannot name the commit) under ``baseline``, with that commit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # measure this tree's archplace
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

SPACE = {
    "architecture": {
        "num_tc": {"pow2": [0, 15]},
        "num_vc": {"pow2": [0, 16]},
        "pe_x": {"pow2": [0, 14]},
        "pe_y": {"pow2": [0, 16]},
        "glb_mb": {"pow2": [0, 12]},
    },
    "constraints": {"area_min_fraction": 0.0},
}
SEARCHERS = ("phaze", "random", "grid", "optuna")


def _rss_mb() -> float:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def _warm_imports() -> None:
    """Everything a replica has imported before its first study, so it is not counted."""
    import optuna  # noqa: F401
    import ray.tune.search.optuna  # noqa: F401

    import archplace.service.studies  # noqa: F401

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _study_config(name: str, searcher: str) -> dict:
    return {"name": name, "models": ["bert-base"], "searcher": searcher, "space": SPACE,
            "max_area_mm2": 10_000.0, "seed": 0}


def _rounds(svc, owner: str, name: str, rounds: int) -> list[int]:
    from archplace.service.schemas import CompleteRequest, SuggestRequest

    archs = []
    for k in range(rounds):
        for t in svc.suggest(owner, name, SuggestRequest(count=1, client_id="bench")).trials:
            archs.append(t.arch_index)
            svc.complete(owner, name, t.number, CompleteRequest(value=float(k % 7) + t.arch_index * 1e-6))
    return archs


def scenario_study(db: str, searcher: str, rounds: int) -> dict:
    import gc
    import tracemalloc

    _warm_imports()
    from archplace.service.db import make_engine
    from archplace.service.schemas import StudyCreate
    from archplace.service.studies import StudyService

    svc = StudyService(make_engine(db))
    gc.collect()
    rss0 = _rss_mb()
    tracemalloc.start()
    t0 = time.perf_counter()
    study, _ = svc.create("bench", StudyCreate(**_study_config("s", searcher)))
    create_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    archs = _rounds(svc, "bench", "s", rounds)
    rounds_s = time.perf_counter() - t0
    gc.collect()
    cur, peak = tracemalloc.get_traced_memory()
    rss1 = _rss_mb()
    svc.delete("bench", "s")
    gc.collect()
    cur2, _ = tracemalloc.get_traced_memory()
    rss2 = _rss_mb()
    return {"searcher": searcher, "space_size": study.space_size, "trials": len(archs),
            "create_s": round(create_s, 3), "rounds_s": round(rounds_s, 3),
            "traced_mb_after_rounds": round(cur / 1e6, 1), "traced_peak_mb": round(peak / 1e6, 1),
            "rss_mb_after_rounds": round(rss1 - rss0, 1),
            "traced_mb_after_delete": round(cur2 / 1e6, 1), "rss_mb_after_delete": round(rss2 - rss0, 1)}


def scenario_fill(db: str, rounds: int) -> dict:
    _warm_imports()
    from archplace.service.db import make_engine
    from archplace.service.schemas import StudyCreate
    from archplace.service.studies import StudyService

    svc = StudyService(make_engine(db))
    for s in SEARCHERS:
        svc.create("bench", StudyCreate(**_study_config(f"cold-{s}", s)))
        _rounds(svc, "bench", f"cold-{s}", rounds)
    return {"studies": len(SEARCHERS)}


def scenario_cold(db: str) -> dict:
    import gc
    import tracemalloc

    _warm_imports()
    from archplace.service.db import make_engine
    from archplace.service.studies import StudyService

    svc = StudyService(make_engine(db))
    gc.collect()
    rss0 = _rss_mb()
    tracemalloc.start()
    t0 = time.perf_counter()
    listing = svc.list("bench")
    list_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    for st in listing.studies:
        svc.get("bench", st.name)
        svc.trials("bench", st.name)
    reads_s = time.perf_counter() - t1
    cur, peak = tracemalloc.get_traced_memory()
    return {"studies": len(listing.studies), "space_sizes": [s.space_size for s in listing.studies],
            "first_list_s": round(list_s, 3), "get_and_trials_s": round(reads_s, 3),
            "traced_peak_mb": round(peak / 1e6, 1), "traced_mb_after": round(cur / 1e6, 1),
            "rss_mb_after": round(_rss_mb() - rss0, 1)}


def _child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                         check=False, cwd=Path(__file__).resolve().parents[2])
    if out.returncode:
        raise RuntimeError(f"scenario {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "serve_memory.json"))
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--baseline", help="a result JSON of this script on an older tree, embedded")
    ap.add_argument("--baseline-commit", help="the commit the baseline tree was archived from")
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        kind, db, *rest = a.child
        if kind == "study":
            r = scenario_study(db, rest[0], a.rounds)
        elif kind == "fill":
            r = scenario_fill(db, a.rounds)
        else:
            r = scenario_cold(db)
        print(json.dumps(r))
        return
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        studies = [_child(["study", str(Path(tmp) / f"{s}.db"), s]) for s in SEARCHERS]
        cold_db = str(Path(tmp) / "cold.db")
        _child(["fill", cold_db])
        cold = _child(["cold", cold_db])
    result = {**git_state(), "command": command(), "machine": machine(load), "space": SPACE,
              "max_area_mm2": 10_000.0, "rounds": a.rounds, "study": studies, "cold_listing": cold}
    if a.baseline:
        base = json.loads(Path(a.baseline).read_text())
        base["commit"] = a.baseline_commit or base.get("commit")
        result["baseline"] = base
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
