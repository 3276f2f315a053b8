"""A screening sweep: `archplace search --schedule sequential --archs-per-trial N` against an
in-process loop over the same architectures, each run in its own process pinned to its cores.

Three runs over the same first ``--archs`` architectures of the grid order (``--searcher grid``):

  in_process  a plain Python loop: the graphs built once, then ``evaluate_sequential`` per
              architecture (the function the Ray task runs, so the numbers must agree exactly);
  ray_1_cpu   the search on a fresh embedded Ray with 1 CPU and at most 1 trial in flight
              (``--workers 1``): the same work plus everything Ray and Tune add (Ray's start-up,
              trial start-up, the task, reporting, the result store, the searcher);
  ray_2_cpu   the same on 2 cores, with the default sizing (2 trials in flight).

Each run is a child process pinned with ``os.sched_setaffinity`` before it imports anything, and
Ray's own processes (GCS, raylet, workers) inherit the pin: ``in_process`` and ``ray_1_cpu`` share
``--cores-1`` (default core 0), so neither gets a core the other lacks. (The first version ran the
loop unpinned and Ray with ``num_cpus=2`` even for "1 CPU": Ray's daemons and Tune's driver had the
second core for free, and ``ray.init`` was outside the timing, which gave "+1 %"; issue 29 measured
+10.4 %, +25.6 % with ``ray.init``, pinned to one core at 1,000 architectures.)

``wall_s`` of a Ray run counts ``ray.init`` (``ray_init_s``) and the search (``search_s``), not the
Python imports (``import_s``, recorded); the loop's counts graph building and the loop. Overhead =
ray_1_cpu wall / in_process wall - 1 (target <= 15 %), also without ``ray.init``.

    python bench/platform/sweep_scale.py [--archs 1000] [--archs-per-trial 100] [--out FILE.json]

The default settings are a screening configuration (microbatch 1, 80 GB HBM): at the search's full
defaults (4 microbatches x 3 HBM sizes x recomputation) one bert-large architecture costs ~0.5 s of
DP, and 10,000 would take 80 minutes in the loop alone.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

RUNS = ("in_process", "ray_1_cpu", "ray_2_cpu")


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


def on_ray(settings, n: int, archs_per_trial: int, cpus: int, workers: int | None) -> dict:
    import pyarrow.parquet as pq
    import ray

    from archplace.platform.search import connect, run_search

    t0 = time.perf_counter()
    connect(None, num_cpus=cpus)
    t_init = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        t1 = time.perf_counter()
        res = run_search(settings, Path(d) / "s", searcher="grid", budget=n, workers=workers,
                         archs_per_trial=archs_per_trial, progress=False, report=False)
        search = time.perf_counter() - t1
        rows = pq.read_table(Path(d) / "s" / "evaluations.parquet").to_pylist()
    ray.shutdown()
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(r["space_index"]), []).append(r["throughput"])
    st = res["stats"]
    return {"wall_s": t_init + search, "ray_init_s": t_init, "search_s": search,
            "evaluated": res["evaluated"], "trials": st["new_trials"],
            "in_flight_limits": st["in_flight_limits"], "trial_errors": st["trial_errors"],
            "values": {i: sum(v) / len(v) for i, v in by.items()}}


def worker(args) -> int:
    """One run in this (already pinned) process; its result as JSON on the last stdout line."""
    t0 = time.perf_counter()
    from archplace.algorithms.search import GridSearcher

    settings = settings_from(args)
    indices = [int(i) for i in GridSearcher(settings.space).order[:args.archs]]
    imports = time.perf_counter() - t0
    cores = sorted(os.sched_getaffinity(0))
    load = os.getloadavg()
    if args.worker == "in_process":
        res = in_process(settings, indices)
    else:
        res = on_ray(settings, args.archs, args.archs_per_trial, cpus=len(cores),
                     workers=1 if args.worker == "ray_1_cpu" else None)
    res.update(import_s=imports, cores=cores, loadavg_before=load, loadavg_after=os.getloadavg())
    print(json.dumps(res))
    return 0


def run_pinned(name: str, cores: list[int], args) -> dict:
    """``name`` in a child process pinned to ``cores`` (set before the child imports anything)."""
    argv = [sys.executable, __file__, "--worker", name, *args.passthrough]
    code = (f"import os, runpy, sys; os.sched_setaffinity(0, {cores!r}); sys.argv = {argv[1:]!r}; "
            f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed ({out.returncode}): {out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["values"] = {int(k): v for k, v in res["values"].items()}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert-large")
    ap.add_argument("--archs", type=int, default=1000)
    ap.add_argument("--archs-per-trial", type=int, default=100)
    ap.add_argument("--accelerators", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument("--microbatches", default="1")
    ap.add_argument("--hbm", default="80")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--cores-1", default="0", help="the cores of in_process and ray_1_cpu")
    ap.add_argument("--cores-2", default="0,1", help="the cores of ray_2_cpu")
    ap.add_argument("--worker", choices=RUNS, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sweep_scale.json"))
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    args.passthrough = ["--models", args.models, "--archs", str(args.archs), "--archs-per-trial",
                        str(args.archs_per_trial), "--accelerators", str(args.accelerators),
                        "--global-batch", str(args.global_batch), "--microbatches", args.microbatches,
                        "--hbm", args.hbm]

    import numpy as np

    load_before = os.getloadavg()
    cores = {"in_process": [int(c) for c in args.cores_1.split(",")],
             "ray_1_cpu": [int(c) for c in args.cores_1.split(",")],
             "ray_2_cpu": [int(c) for c in args.cores_2.split(",")]}
    runs = {}
    for name in args.runs.split(","):
        runs[name] = run_pinned(name, cores[name], args)
        r = runs[name]
        print(f"{name} on cores {cores[name]}: {r['wall_s']:.1f} s "
              f"(load {r['loadavg_before'][0]:.2f} -> {r['loadavg_after'][0]:.2f})", flush=True)

    per_min = {k: args.archs / v["wall_s"] * 60 for k, v in runs.items()}
    out = {"bench": "sweep_scale", "git": git_state(), "command": command(), "machine": machine(load_before),
           "settings": settings_from(args).to_dict(), "archs": args.archs,
           "archs_per_trial": args.archs_per_trial,
           "pinning": "each run a process pinned with os.sched_setaffinity before its imports; Ray's "
                      "processes inherit it",
           "runs": {k: {kk: vv for kk, vv in v.items() if kk != "values"} | {"archs_per_min": per_min[k]}
                    for k, v in runs.items()}}
    print(f"\n{'run':12s} {'cores':>6s} {'wall s':>9s} {'archs/min':>10s}")
    for k, v in runs.items():
        print(f"{k:12s} {len(v['cores']):6d} {v['wall_s']:9.1f} {per_min[k]:10.0f}")
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
        loop = runs["in_process"]["wall_s"]
        if "ray_1_cpu" in runs:
            r = runs["ray_1_cpu"]
            out["overhead_ray_1_cpu_vs_in_process"] = r["wall_s"] / loop - 1
            out["overhead_ray_1_cpu_vs_in_process_without_ray_init"] = r["search_s"] / loop - 1
            print(f"Tune/Ray overhead, 1 core each: {r['wall_s'] / loop - 1:+.1%} with ray.init "
                  f"({r['ray_init_s']:.1f} s), {r['search_s'] / loop - 1:+.1%} without (target <= 15%)")
        if "ray_2_cpu" in runs:
            sp = loop / runs["ray_2_cpu"]["wall_s"]
            out["speedup_ray_2_cpu_vs_in_process"] = sp
            print(f"2 cores vs the in-process loop on 1: {sp:.2f}x")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=str))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
