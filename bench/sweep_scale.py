"""A 10,000-architecture screening sweep: `archplace search --schedule sequential --archs-per-trial N`
against an in-process loop over the same architectures.

Three runs over the same first ``--archs`` architectures of the grid order (``--searcher grid``):

  in_process  a plain Python loop: the graphs built once, then ``evaluate_sequential`` per
              architecture (the function the Ray task runs, so the numbers must agree exactly);
  ray_1_cpu   the search on an embedded Ray with at most 1 trial in flight (``--workers 1``): the
              same work on one core plus everything Ray and Tune add (trial start-up, the task,
              reporting, the result store, the searcher);
  ray_2_cpu   the search with the default sizing (2 trials in flight on this 2-core machine).

Overhead = ray_1_cpu wall / in_process wall - 1 (target <= 15 %); the 2-CPU run gives the
architectures per minute the machine reaches. Graph building is in every run's wall time.

    python bench/sweep_scale.py [--archs 10000] [--archs-per-trial 100] [--out FILE.json]

The default settings are a screening configuration (microbatch 1, 80 GB HBM): at the search's full
defaults (4 microbatches x 3 HBM sizes x recomputation) one bert-large architecture costs ~0.5 s of
DP on this machine, and 10,000 would take 80 minutes in the loop alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _meta import command, git_state, machine


def settings_from(args):
    from archplace.platform.trial import SearchSettings

    return SearchSettings(models=tuple(args.models.split(",")), num_devices=args.accelerators,
                          global_batch=args.global_batch,
                          microbatches=tuple(int(m) for m in args.microbatches.split(",")),
                          hbm_gb=tuple(float(h) for h in args.hbm.split(",")), schedule="sequential")


def in_process(settings, indices) -> dict:
    from archplace.hardware.space import enumerate_space
    from archplace.platform.evaluate import evaluate_sequential
    from archplace.workloads.models import build_graph

    space = enumerate_space(settings.space)
    t0 = time.perf_counter()
    graphs = {(m, mbs, t): build_graph(m, seq=settings.seq, mbs=mbs, tmp=t)
              for m, mbs, t in settings.graph_keys()}
    t_graphs = time.perf_counter() - t0
    values = {}
    for i in indices:
        values[int(i)] = evaluate_sequential(space.accelerator(int(i)).to_dict(), settings, graphs)["value"]
    return {"wall_s": time.perf_counter() - t0, "graphs_s": t_graphs, "values": values}


def on_ray(settings, n: int, archs_per_trial: int, workers: int | None) -> dict:
    import pyarrow.parquet as pq

    from archplace.platform.search import run_search

    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        res = run_search(settings, Path(d) / "s", searcher="grid", budget=n, workers=workers,
                         archs_per_trial=archs_per_trial, progress=False, report=False)
        wall = time.perf_counter() - t0
        rows = pq.read_table(Path(d) / "s" / "evaluations.parquet").to_pylist()
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(r["space_index"]), []).append(r["throughput"])
    st = res["stats"]
    return {"wall_s": wall, "search_wall_s": st["wall_s"], "evaluated": res["evaluated"],
            "trials": st["new_trials"], "in_flight_limits": st["in_flight_limits"],
            "trial_errors": st["trial_errors"], "values": {i: sum(v) / len(v) for i, v in by.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert-large")
    ap.add_argument("--archs", type=int, default=10000)
    ap.add_argument("--archs-per-trial", type=int, default=100)
    ap.add_argument("--accelerators", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument("--microbatches", default="1")
    ap.add_argument("--hbm", default="80")
    ap.add_argument("--runs", default="in_process,ray_1_cpu,ray_2_cpu")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep_scale.json"))
    args = ap.parse_args()

    import numpy as np
    import ray

    from archplace.algorithms.search import GridSearcher
    from archplace.platform.search import connect

    load_before = os.getloadavg()
    settings = settings_from(args)
    indices = [int(i) for i in GridSearcher(settings.space).order[:args.archs]]
    wanted = args.runs.split(",")
    runs = {}
    if "in_process" in wanted:
        runs["in_process"] = in_process(settings, indices)
        print(f"in_process: {runs['in_process']['wall_s']:.1f} s", flush=True)
    if {"ray_1_cpu", "ray_2_cpu"} & set(wanted):
        connect(None, num_cpus=2)
        for name, workers in (("ray_1_cpu", 1), ("ray_2_cpu", None)):
            if name in wanted:
                runs[name] = on_ray(settings, args.archs, args.archs_per_trial, workers)
                print(f"{name}: {runs[name]['wall_s']:.1f} s", flush=True)
        ray.shutdown()

    per_min = {k: args.archs / v["wall_s"] * 60 for k, v in runs.items()}
    out = {"bench": "sweep_scale", "git": git_state(), "command": command(), "machine": machine(load_before),
           "settings": settings.to_dict(), "archs": args.archs, "archs_per_trial": args.archs_per_trial,
           "runs": {k: {kk: vv for kk, vv in v.items() if kk != "values"} | {"archs_per_min": per_min[k]}
                    for k, v in runs.items()}}
    print(f"\n{'run':12s} {'wall s':>9s} {'archs/min':>10s}")
    for k, v in runs.items():
        print(f"{k:12s} {v['wall_s']:9.1f} {per_min[k]:10.0f}")
    if "in_process" in runs:
        base = runs["in_process"]["values"]
        for k in ("ray_1_cpu", "ray_2_cpu"):
            if k not in runs:
                continue
            got = runs[k]["values"]
            same = sorted(got) == sorted(base) and all(
                np.isclose(got[i], base[i], rtol=0, atol=0) or (np.isnan(got[i]) and np.isnan(base[i]))
                for i in base)
            out[f"{k}_results_identical"] = bool(same)
            print(f"{k}: the same {len(got)} architectures with identical throughputs: {same}")
        if "ray_1_cpu" in runs:
            ov = runs["ray_1_cpu"]["wall_s"] / runs["in_process"]["wall_s"] - 1
            out["overhead_ray_1_cpu_vs_in_process"] = ov
            print(f"Tune/Ray overhead (1 trial in flight vs the in-process loop): {ov:+.1%} (target <= 15%)")
        if "ray_2_cpu" in runs:
            sp = runs["in_process"]["wall_s"] / runs["ray_2_cpu"]["wall_s"]
            out["speedup_ray_2_cpu_vs_in_process"] = sp
            print(f"2 CPUs vs the in-process loop: {sp:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
