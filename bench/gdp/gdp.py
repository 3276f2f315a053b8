"""GDP's Table 1 analogue: operator placement of the paper's 12 graphs on P100-like GPUs (issue 18).

    python bench/gdp/gdp.py [--seeds 0,1,2] [--time 120] [--budget 2000] [--workers 2] [--graphs NAME,...]
                        [--methods M,...] [--machine p100-pcie] [--op-model roofline|calibrated]
                        [--dtype fp32] [--compare OTHER.json] [--fresh]

Every graph is placed on its Table 1 device count by each method and scored by the event-driven
simulator (``simulators/gpu_placement.py``; the paper measured real P100s, so absolute times differ and
the comparison is relative, spec §12):

* ``human``, ``metis``, ``m-topo``, ``m-etf``, ``m-sct``: the fast placers (``gdp_baselines``), one
  placement each (deterministic, seed 0);
* ``random``: the best valid placement of as many uniform samples as GDP-one drew at the same seed (equal
  simulator calls);
* ``gdp-one``: PPO on the graph alone from random weights for ``--time`` wall seconds (the budget was
  fixed before any graph was run), per seed; reported as **best-seen** (the best sampled placement, what
  GDP reports) and **greedy** (the policy's argmax placement at the end) apart;
* ``hdp``: the HDP-style grouper + LSTM placer (``algorithms/rl/hdp.py``) trained by the same PPO loop
  with the same reward and budget, reported like gdp-one;
* ``gdp-noatt``: the attention ablation (spec §9.5), GDP-one whose placer has no attention (each node
  attends only to itself: a per-node residual MLP of the same depth), same loop, reward and budget.

**Issue 31, at equal samples** (``bench/gdp/_gdp_warm.py``): ``gdp-warm`` (``place-ops --algo gdp`` as
shipped: behaviour cloning of the best fast placer, PPO, the best of greedy / best sample / warm start;
the three and the shipped answer recorded apart), ``sa`` and ``lns`` from the best fast placer, and the
ablation ``warm`` (cloning alone) / ``warm+ppo`` (the policy's own answer, no fallback to the warm start)
/ ``warm+sa`` (SA in place of PPO after the cloning). Each gets ``--budget`` simulator calls per graph and
seed, the fast placers' five included: **2,000**, fixed before any test case was run, because it is the
``place-ops`` default of sa / lns / gdp (so the bench measures what a user gets), 124 PPO iterations of
16 samples, and about what GDP-one drew in 120 s on the mid-size graphs (the SA / LNS constants were
chosen at this budget on txl-2, rnnlm-2 and inception-v3, so those three are not held out for them).
Wall time is only an outer limit (``--safety-time``, 1 h per run; a run it cuts short says so). Every
method is reported as the step-time ratio ``T_method / T_best_fast`` to the run's own best fast placer,
with geomeans over graphs per seed and their mean over seeds. Cache keys carry the budget.

Speed-ups are ``T_baseline / T_gdp - 1`` (spec §9.1); geomeans run over the graphs on which both are
valid; an invalid placement (out of memory, split co-location group) is listed with its reason. Runs
are cached in ``bench/gdp/results/gdp_runs.json`` keyed by graph, method, seed, budget and the code version
of the modules that method depends on (``CODE``); each records its commit and command. Writes
``bench/gdp/results/gdp.json``.

**Machines and op models (issue 30).** ``--machine`` takes the GDP-era machines or any GPU preset of
``hardware/gpus.py`` (N of them on NVLink, ``gpu_machine``); ``--op-model`` times each op with the roofline
or the model calibrated on micro-benchmarks (``simulators/gpu_ops.py``, the same path as ``place-ops
--op-model``: ``gpu_op_times`` with the machine's launch floor, handed to the simulator as
``profiled_compute_s``). Giving ``--op-model`` (even ``roofline``) routes the op times through
``gpu_op_times``, so two runs on one machine that differ in ``--op-model`` differ in the op times alone.
Cache keys then carry machine, op model and dtype, and the code version also covers ``gpu_ops`` /
``gpus``. Each placement records how many GPUs it puts any op on (``gpus_used``) and how its compute
spreads: ``busiest_gpu_share`` (the busiest GPU's share of the summed op times; 1 = all on one GPU) and
``effective_gpus`` (summed op times / the busiest GPU's). A placement counts as *multi-GPU* when its
busiest GPU holds less than 90% of the compute (``MULTI_GPU_SHARE``, fixed before the re-run: one stray
op on a second GPU does not make a split). The output names the best method of each graph and whether
its placement is multi-GPU. ``--compare OTHER.json`` (a run
of the same graphs on another op model) adds, per graph, both step times per method, the best method
under each, the rank order under each and Kendall's tau-b between them (scipy; an invalid placement ranks
last, tied with the other invalid ones).

The issue-30 re-run (budgets fixed here before any result was seen, 2 shared cores, 1.5 h in all):
``--machine h100-sxm --dtype fp32`` (GDP's TensorFlow graphs are fp32; the calibration has fp32 data with
TF32 off), once with ``--op-model roofline`` and once with ``calibrated``; all 12 graphs; the fast placers;
GDP-one with seed 0 only and ``--time 30`` (a quarter of the paper-analogue budget); random with as many
samples as that GDP-one run drew; no HDP and no gdp-noatt. Results:
``bench/results/gdp_h100_{roofline,calibrated}.{json,txt}``, cache ``bench/gdp/results/gdp_h100_runs.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _gdp_warm import BUDGET_CALLS, run_warm  # noqa: E402
from _gdp_warm import DERIVED as WARM_DERIVED  # noqa: E402
from _gdp_warm import JOBS as WARM_JOBS  # noqa: E402
from _gdp_warm import METHODS as WARM_METHODS  # noqa: E402
from _gdp_warm import code as warm_code  # noqa: E402
from _gdp_warm import report as warm_report  # noqa: E402
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GRAPHS = ("rnnlm-2", "rnnlm-4", "gnmt-2", "gnmt-4", "gnmt-8", "txl-2", "txl-4", "txl-8", "inception-v3",
          "amoebanet", "wavenet-2x18", "wavenet-4x36")
FAST = ("human", "metis", "m-topo", "m-etf", "m-sct")
METHODS = FAST + ("random", "gdp-one", "hdp", "gdp-noatt") + WARM_METHODS
LEARNED = ("gdp-one", "hdp", "gdp-noatt")
# the attention ablation (spec §9.5): GDP-one with the placer's attention replaced by a per-node MLP of the
# same depth (gdp_policy's ``attention=False``), same PPO, reward and budget
POLICY = {"gdp-noatt": {"attention": False}}
# the code each method's runs depend on (cache keys): adding or changing one method keeps the others
# the simulator, graphs and machines every method's runs import (traced with sys.modules), not the whole
# simulators/hardware packages: a change to the Phaze cost model or its presets does not touch a placement
_CORE = ("archplace.simulators.gpu_placement", "archplace.simulators.gpu_placement_kernel",
         "archplace.workloads", "archplace.hardware.gpu_machines", "archplace.hardware.accelerator",
         "archplace.hardware.constants")
_GDP = ("archplace.algorithms.rl.gdp_env", "archplace.algorithms.rl.gdp_ppo",
        "archplace.algorithms.rl.gdp_module", "archplace.algorithms.rl.gdp_policy",
        "archplace.algorithms.rl.gnn_module", "archplace.algorithms.rl.callbacks")
CODE = {**{m: ("archplace.algorithms.search.gdp_baselines",) + _CORE for m in FAST},
        "random": ("archplace.algorithms.search.gdp_baselines",) + _CORE, "gdp-one": _GDP + _CORE,
        "hdp": _GDP + ("archplace.algorithms.rl.hdp",) + _CORE, "gdp-noatt": _GDP + _CORE,
        **warm_code(_GDP, _CORE)}
# GDP-one over HP and HDP (Table 1) and over the placer without attention (§4.4)
PAPER_GEOMEAN = {"human": 0.16, "hdp": 0.092, "gdp-noatt": 0.18}


def build(name: str, machine_name: str, op_model: str | None = None, dtype: str | None = None):
    """(graph, problem, GDPGraph, op-model note) of a preset on its Table 1 device count. ``op_model``
    None: the machine's own roofline inside ``PlacementProblem.from_graph`` (the old bench, bit for bit);
    else the op times of ``gpu_op_times`` as ``place-ops --op-model`` uses them."""
    from archplace.algorithms.rl.gdp_env import GDPGraph
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.simulators.gpu_ops import gpu_op_times
    from archplace.simulators.gpu_placement import PlacementProblem
    from archplace.workloads.gdp_models import GDP_PRESETS, gdp_graph, node_features

    g = gdp_graph(name)
    machine = gpu_machine(machine_name, GDP_PRESETS[name].devices, dtype)
    note = None
    if op_model is None and dtype is None:
        problem = PlacementProblem.from_graph(g, machine)
    else:
        times = gpu_op_times(g, machine.spec, dtype=machine.dtype, op_model=op_model,
                             launch_s=machine.kernel_launch_s, zero_inputs=True)
        problem = PlacementProblem.from_graph(g, machine, profiled_compute_s=times.time_s)
        note = times.to_dict()
    feats, _ = node_features(g)
    return g, problem, GDPGraph(problem, feats, name), note


MULTI_GPU_SHARE = 0.9   # a placement whose busiest GPU holds less than this share of compute is a split


def spread(problem, placement) -> dict:
    """How a placement spreads the compute: GPUs with any op, the busiest GPU's share of the summed op
    times, and the effective GPU count (their inverse). Empty for no placement."""
    if placement is None:
        return {"gpus_used": None, "busiest_gpu_share": None, "effective_gpus": None}
    p = np.asarray(placement, dtype=np.int64)
    busy = np.bincount(p, weights=np.asarray(problem.compute_s, float), minlength=problem.num_devices)
    share = float(busy.max() / busy.sum()) if busy.sum() > 0 else 1.0
    return {"gpus_used": int(len(np.unique(p))), "busiest_gpu_share": share, "effective_gpus": 1.0 / share}


def run_one(name: str, method: str, seed: int, time_s: float, machine_name: str,
            op_model: str | None = None, dtype: str | None = None) -> dict:
    """One method on one graph (a Ray task, one CPU)."""
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.search import gdp_baselines
    from archplace.simulators.gpu_placement import simulate

    t0 = time.perf_counter()
    g, problem, gg, note = build(name, machine_name, op_model, dtype)
    t_build = time.perf_counter() - t0
    out: dict = {"graph": name, "method": method, "seed": seed, "nodes": problem.num_nodes,
                 "devices": problem.num_devices, "build_s": t_build, "op_model": note}
    t1 = time.perf_counter()
    if method in FAST:
        p = gdp_baselines.human_from_graph(g, problem) if method == "human" else \
            gdp_baselines.BASELINES[method](problem, seed=0)
        r = simulate(problem, p)
        out.update(step_time_s=r.step_time_s, valid=r.valid, reason=r.reason, samples=1,
                   **spread(problem, p))
    elif method in LEARNED:
        if method == "hdp":
            from archplace.algorithms.rl.hdp import hdp_train as train
        else:
            from archplace.algorithms.rl.gdp_ppo import gdp_train as train

        kw = {"policy": POLICY[method]} if method in POLICY else {}
        run = train([gg], time_limit_s=time_s, seed=seed, **kw)
        best_valid = bool(np.isfinite(run.best_step_time_s[0]))
        greedy = simulate(problem, run.greedy_placement[0])
        out.update(step_time_s=run.best_step_time_s[0] if best_valid else float("inf"), valid=best_valid,
                   reason="" if best_valid else "no valid placement sampled", samples=run.samples,
                   iterations=run.iterations, greedy_step_time_s=greedy.step_time_s,
                   greedy_valid=greedy.valid, greedy_reason=greedy.reason,
                   **spread(problem, run.best_placement[0] if best_valid else None),
                   greedy_spread=spread(problem, run.greedy_placement[0]),
                   sampled_mean_step_time_s=[m[0] for m in run.sampled_mean_step_time_s],
                   curve=[[round(c[0], 2), c[1]] for c in run.curve])
    else:
        raise ValueError(f"run_one: method {method!r} is not a fast or learned placer (random: random_best)")
    out["search_s"] = time.perf_counter() - t1
    out.update(commit=git_state()["commit"], command=command())
    return out


def random_best(name: str, seed: int, samples: int, machine_name: str, op_model: str | None = None,
                dtype: str | None = None) -> dict:
    """The best valid of ``samples`` uniform placements (co-location groups kept whole)."""
    from archplace.algorithms.search.gdp_baselines import random_placement
    from archplace.simulators.gpu_placement import simulate_batch

    t0 = time.perf_counter()
    _, problem, _, _ = build(name, machine_name, op_model, dtype)
    rng = np.random.default_rng(seed)
    best, valid_any, chunk, best_p = float("inf"), False, 64, None
    done = 0
    while done < samples:
        k = min(chunk, samples - done)
        P = np.stack([random_placement(problem, seed=int(rng.integers(2**31))) for _ in range(k)])
        r = simulate_batch(problem, P)
        if r.valid.any():
            valid_any = True
            i = int(np.flatnonzero(r.valid)[np.argmin(r.step_time_s[r.valid])])
            if float(r.step_time_s[i]) < best:
                best, best_p = float(r.step_time_s[i]), P[i]
        done += k
    return {"graph": name, "method": "random", "seed": seed, "samples": samples, "step_time_s": best,
            "valid": valid_any, "reason": "" if valid_any else f"none of {samples} samples valid",
            **spread(problem, best_p),
            "search_s": time.perf_counter() - t0, "commit": git_state()["commit"], "command": command()}


def multi_gpu(entry: dict) -> bool:
    share = entry.get("busiest_gpu_share")
    return share is not None and share < MULTI_GPU_SHARE


def geomean(x) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(x, dtype=float)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time", type=float, default=120.0, help="wall seconds of GDP-one per graph and seed")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--budget", type=int, default=BUDGET_CALLS,
                    help="simulator calls per graph and seed of the issue-31 methods (gdp-warm, sa, lns, "
                         "warm, warm+ppo, warm+sa), the fast placers' included")
    ap.add_argument("--safety-time", type=float, default=3600.0,
                    help="gdp-warm: outer wall-clock limit of PPO in seconds (the budget is simulator calls; "
                         "a run it cuts short says stopped_by 'time limit')")
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--methods", default=",".join(METHODS))
    from archplace.hardware.gpu_machines import MACHINE_NAMES

    ap.add_argument("--machine", default="p100-pcie", choices=MACHINE_NAMES,
                    help="a GDP-era machine or a GPU preset (N of that GPU on NVLink)")
    ap.add_argument("--op-model", default=None, choices=("roofline", "calibrated"),
                    help="how each op is timed (simulators/gpu_ops.py); default: the machine's roofline "
                         "as the simulator always had it")
    ap.add_argument("--dtype", default=None, choices=("bf16", "fp16", "tf32", "fp32"),
                    help="the dtype of the op times and peaks (default fp32)")
    ap.add_argument("--compare", default=None,
                    help="a gdp.py JSON of the same graphs under another op model: adds per graph both "
                         "step times, the rankings and Kendall's tau")
    ap.add_argument("--cache", default=str(RESULTS / "gdp_runs.json"))
    ap.add_argument("--out", default=str(RESULTS / "gdp.json"))
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    load = os.getloadavg()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    graphs = [g for g in args.graphs.split(",") if g]
    methods = [m for m in args.methods.split(",") if m]
    for bad, allowed, what in ((set(graphs) - set(GRAPHS), GRAPHS, "--graphs"),
                               (set(methods) - set(METHODS), METHODS, "--methods")):
        if bad:
            raise SystemExit(f"{what}: unknown {sorted(bad)}; allowed: {list(allowed)}")
    if "random" in methods and "gdp-one" not in methods:
        raise SystemExit("--methods: random draws as many samples as gdp-one; include gdp-one")
    if args.budget < 7:
        raise SystemExit(f"--budget is {args.budget}; must be >= 7 simulator calls (5 fast placers, then "
                         "warm+sa's 2 starts or gdp-warm's greedy placement)")
    warm_jobs = [m for m in WARM_JOBS if m in methods or any(WARM_DERIVED.get(d) == m for d in methods)]

    import ray

    ops = args.op_model is not None or args.dtype is not None
    extra = ("archplace.simulators.gpu_ops", "archplace.hardware.gpus") if ops else ()
    versions = {m: code_version(*CODE[m], *extra) for m in METHODS}
    tag = f"|{args.op_model or 'default'}|{args.dtype or 'fp32'}" if ops else ""
    cache_path = Path(args.cache)
    cache = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())

    def key(g, m, s):
        if m in WARM_METHODS:
            return f"{g}|{m}|{s}|b{args.budget}|{args.machine}{tag}|{versions[m]}"
        t = f"|{args.time}" if m in LEARNED + ("random",) else ""
        return f"{g}|{m}|{s if m in LEARNED + ('random',) else 0}{t}|{args.machine}{tag}|{versions[m]}"

    def save():
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache))
        tmp.replace(cache_path)

    jobs = []
    for g in graphs:
        for m in methods:
            if m in FAST:
                jobs.append((key(g, m, 0), g, m, 0))
            elif m in LEARNED:
                jobs += [(key(g, m, s), g, m, s) for s in seeds]
        jobs += [(key(g, m, s), g, m, s) for m in warm_jobs for s in seeds]
    todo = [j for j in jobs if j[0] not in cache]
    print(f"{len(jobs)} runs, {len(todo)} to do (code versions {versions})", flush=True)
    t0 = time.perf_counter()
    if todo or "random" in methods:
        ray.init(num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False)
        task = ray.remote(num_cpus=1, max_retries=0)(run_one)
        wtask = ray.remote(num_cpus=1, max_retries=0)(run_warm)
        pending = {(wtask.remote(g, m, s, args.budget, args.machine, args.op_model, args.dtype,
                                 args.safety_time) if m in WARM_JOBS else
                    task.remote(g, m, s, args.time, args.machine, args.op_model, args.dtype)): k
                   for k, g, m, s in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            cache[k] = {**ray.get(done[0], timeout=600), "commit": git_state()["commit"],
                        "command": command()}
            save()
            r = cache[k]
            print(f"[{time.perf_counter() - t0:6.0f} s] {k.split('|')[0]} {r['method']} seed {r['seed']}: "
                  f"{r['step_time_s'] * 1e3:.2f} ms {'valid' if r['valid'] else r['reason']} "
                  f"({r['search_s']:.1f} s)", flush=True)
        if "random" in methods:
            rtask = ray.remote(num_cpus=1, max_retries=0)(random_best)
            pend = {}
            for g in graphs:
                for s in seeds:
                    k = key(g, "random", s)
                    if k not in cache:
                        pend[rtask.remote(g, s, cache[key(g, "gdp-one", s)]["samples"], args.machine,
                                          args.op_model, args.dtype)] = k
            while pend:
                done, _ = ray.wait(list(pend), num_returns=1)
                k = pend.pop(done[0])
                cache[k] = ray.get(done[0], timeout=600)
                save()
        ray.shutdown()

    out: dict = {**git_state(), "command": command(), "machine": machine(load), "code_versions": versions,
                 "gpu_machine": args.machine, "op_model": args.op_model, "dtype": args.dtype or "fp32",
                 "seeds": seeds, "time_s": args.time, "budget_calls": args.budget, "methods": methods,
                 "graphs": {}}
    cols = [m for m in ("human", "metis", "m-topo", "m-etf", "m-sct", "random") if m in methods]
    learned = [m for m in LEARNED if m in methods]
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text)
        lines.append(text)

    table = graphs if cols or learned else []   # the Table 1 analogue; the issue-31 methods report below
    if table:
        om = args.op_model or "default (the machine roofline)"
        say(f"Step time (ms) on {args.machine}, op model {om}, {args.dtype or 'fp32'}; learned placers: "
            f"best-seen mean over seeds {seeds} [the greedy "
            f"policy's], {args.time:g} s per seed; (n) = effective GPUs of the placement")
        say(f"{'graph':<14}{'ops':>7}{'d':>3}" + "".join(f"{c:>16}" for c in cols)
            + "".join(f"{m:>24}" for m in learned) + "   best")
    ref = "gdp-one" if "gdp-one" in learned else None
    others = cols + [m for m in learned if m != ref]
    speed: dict[str, list[float]] = {c: [] for c in others}

    def fmt(t: float) -> str:
        return f"{t * 1e3:.2f}" if np.isfinite(t) else "invalid"

    def sp(r: dict) -> dict:
        return {k: r.get(k) for k in ("gpus_used", "busiest_gpu_share", "effective_gpus")}

    def eff(e: dict) -> str:
        return "-" if e.get("effective_gpus") is None else f"{e['effective_gpus']:.1f}"

    def best_run(rs: list[dict]) -> dict:   # the seed whose best-seen placement is fastest
        return min(rs, key=lambda r: r["step_time_s"] if r["valid"] else float("inf"))

    for g in table:
        row = {m: cache[key(g, m, 0)] for m in cols if m in FAST}
        runs = {m: [cache[key(g, m, s)] for s in seeds] for m in learned}
        rnd = [cache[key(g, "random", s)] for s in seeds] if "random" in methods else []
        any_run = next(iter(row.values()), next(iter(runs.values()), [None])[0])
        entry = {m: {"step_time_s": r["step_time_s"] if r["valid"] else float("inf"), "valid": r["valid"],
                     "reason": r["reason"], **sp(r)} for m, r in row.items()}
        if rnd:
            ok = [r for r in rnd if r["valid"]]
            t = float(np.mean([r["step_time_s"] for r in ok])) if len(ok) == len(rnd) else float("inf")
            entry["random"] = {"step_time_s": t, "valid": bool(np.isfinite(t)),
                               "per_seed": [r["step_time_s"] for r in rnd],
                               "samples": [r["samples"] for r in rnd],
                               "spread_per_seed": [sp(r) for r in rnd], **sp(best_run(rnd))}
        cells = [f"{fmt(entry[c]['step_time_s'])} ({eff(entry[c])})".rjust(16) for c in cols]
        for m, rs in runs.items():
            best = [r["step_time_s"] for r in rs]
            greedy = [r["greedy_step_time_s"] if r["greedy_valid"] else float("inf") for r in rs]
            tb = float(np.mean(best)) if all(np.isfinite(best)) else float("inf")
            tg = float(np.mean(greedy)) if all(np.isfinite(greedy)) else float("inf")
            entry[m] = {"step_time_s": tb, "per_seed": best, "greedy_step_time_s": tg,
                        "greedy_per_seed": greedy, "samples": [r["samples"] for r in rs],
                        "iterations": [r["iterations"] for r in rs], "search_s": [r["search_s"] for r in rs],
                        "spread_per_seed": [sp(r) for r in rs],
                        "greedy_spread_per_seed": [r.get("greedy_spread") for r in rs], **sp(best_run(rs))}
            cells.append(f"{fmt(tb)} ({eff(entry[m])}) [{fmt(tg)}]".rjust(24))
        if ref:
            for c in others:
                tb, tr = entry[c]["step_time_s"], entry[ref]["step_time_s"]
                if np.isfinite(tb) and np.isfinite(tr):
                    speed[c].append(tb / tr)
        ms = [m for m in cols + learned if np.isfinite(entry[m]["step_time_s"])]
        tmin = min((entry[m]["step_time_s"] for m in ms), default=float("inf"))
        winners = [m for m in ms if entry[m]["step_time_s"] <= tmin * (1 + 1e-9)]
        entry["best"] = {"methods": winners, "step_time_s": tmin,
                         "effective_gpus": [entry[m]["effective_gpus"] for m in winners],
                         "multi_gpu": [multi_gpu(entry[m]) for m in winners]}
        entry["op_model"] = any_run.get("op_model") if any_run else None
        out["graphs"][g] = entry
        say(f"{g:<14}{any_run['nodes'] if any_run else 0:>7}{any_run['devices'] if any_run else 0:>3}"
            + "".join(cells) + "   "
            + ",".join(f"{m}({eff(entry[m])})" for m in winners))
    # the claim: a model that makes compute too cheap tilts placements toward one GPU
    multi = {"threshold_busiest_gpu_share": MULTI_GPU_SHARE,
             "best_is_multi_gpu": sum(any(out["graphs"][g]["best"]["multi_gpu"]) for g in table),
             "best_has_ops_on_more_than_one_gpu": sum(
                 any((out["graphs"][g][m]["gpus_used"] or 0) > 1 for m in out["graphs"][g]["best"]["methods"])
                 for g in table),
             "graphs": len(table),
             "per_method_multi_gpu": {m: sum(multi_gpu(out["graphs"][g][m]) for g in table)
                                      for m in cols + learned},
             "per_method_mean_effective_gpus": {m: float(np.mean([out["graphs"][g][m]["effective_gpus"] or 0
                                                                  for g in table])) for m in cols + learned}}
    out["multi_gpu"] = multi
    if table:
        say(f"  graphs whose best placement is multi-GPU (busiest GPU < {MULTI_GPU_SHARE:.0%} of compute): "
            f"{multi['best_is_multi_gpu']}/{len(graphs)} (ops on more than one GPU at all: "
            f"{multi['best_has_ops_on_more_than_one_gpu']}/{len(graphs)}); multi-GPU placements per method: "
            + ", ".join(f"{m} {n}" for m, n in multi["per_method_multi_gpu"].items()))
        say("  mean effective GPUs (summed op time / busiest GPU's) per method: "
            + ", ".join(f"{m} {v:.2f}" for m, v in multi["per_method_mean_effective_gpus"].items()))
    if ref:
        out["speedup_geomean"] = {}
        for c in others:
            if speed[c]:
                s = geomean(speed[c]) - 1
                out["speedup_geomean"][c] = {"value": s, "graphs": len(speed[c])}
                paper = f" (paper: {PAPER_GEOMEAN[c]:+.1%})" if c in PAPER_GEOMEAN else ""
                say(f"  gdp-one (best-seen) over {c}: {s:+.1%} geomean on {len(speed[c])} graphs where "
                    f"both are valid{paper}")
        best_fast = {g: min(out["graphs"][g][c]["step_time_s"] for c in cols if c in FAST) for g in graphs}
        vs = [best_fast[g] / out["graphs"][g][ref]["step_time_s"] for g in graphs
              if np.isfinite(best_fast[g]) and np.isfinite(out["graphs"][g][ref]["step_time_s"])]
        if vs:
            out["speedup_geomean"]["best fast placer per graph"] = {"value": geomean(vs) - 1,
                                                                     "graphs": len(vs)}
            say(f"  gdp-one (best-seen) over the best fast placer of each graph: {geomean(vs) - 1:+.1%}")
    if warm_jobs:
        runs = {(g, m, s): cache[key(g, m, s)] for g in graphs for m in warm_jobs for s in seeds}
        out["issue31"] = warm_report(runs, graphs, methods, seeds, args.budget, say)
    if args.compare:
        other = json.loads(Path(args.compare).read_text())
        out["comparison"] = compare(other, out, graphs, cols + learned)
        out["comparison"]["other_file"] = args.compare
        say()
        for ln in out["comparison"]["lines"]:
            say(ln)
    Path(args.out).write_text(json.dumps(out, indent=1))
    Path(args.out).with_suffix(".txt").write_text("\n".join(lines) + "\n")
    print(f"\nwrote {args.out} and {Path(args.out).with_suffix('.txt')}")


def ranks(times: list[float]) -> list[int]:
    """Competition ranks (1 = fastest; ties share the lower rank; invalid = inf ranks last)."""
    from scipy.stats import rankdata

    return [int(r) for r in rankdata(np.asarray(times, float), method="min")]


def compare(a: dict, b: dict, graphs: list[str], methods: list[str]) -> dict:
    """Per graph, run ``a`` (e.g. roofline) against run ``b`` (e.g. calibrated): both step times per
    method, the best methods and rank order under each, Kendall's tau-b between the two rankings.
    ``regret``: where ``a``'s best method is a deterministic fast placer, its placement (re-made on ``a``'s
    problem) simulated under ``b``'s op model, against ``b``'s best: what placing with the wrong model
    costs (both problems rebuilt here, a minute or two per op model on 2 cores)."""
    from scipy.stats import kendalltau

    from archplace.algorithms.search import gdp_baselines
    from archplace.simulators.gpu_placement import simulate

    name_a, name_b = a.get("op_model") or "default", b.get("op_model") or "default"
    res: dict = {"a": name_a, "b": name_b, "graphs": {}}
    lines = [f"Ranking of the methods under {name_a} vs {name_b} (1 = fastest; tau = Kendall tau-b; "
             "best changes: the set of fastest methods differs)"]
    taus, changed_best, changed_order, regrets = [], 0, 0, []
    for g in graphs:
        if g not in a["graphs"]:
            continue
        ms = [m for m in methods if m in a["graphs"][g] and m in b["graphs"][g]]
        ta = [a["graphs"][g][m]["step_time_s"] for m in ms]
        tb = [b["graphs"][g][m]["step_time_s"] for m in ms]
        ra, rb = ranks(ta), ranks(tb)
        big = 1e30   # invalid placements tie with each other, behind every valid one
        tau = kendalltau([t if np.isfinite(t) else big for t in ta],
                         [t if np.isfinite(t) else big for t in tb])
        tau_v = float(tau.statistic) if np.isfinite(tau.statistic) else None
        best_a = sorted(m for m, r in zip(ms, ra) if r == 1)
        best_b = sorted(m for m, r in zip(ms, rb) if r == 1)
        res["graphs"][g] = {"methods": ms, f"step_time_s_{name_a}": ta, f"step_time_s_{name_b}": tb,
                            f"rank_{name_a}": ra, f"rank_{name_b}": rb, "kendall_tau_b": tau_v,
                            f"best_{name_a}": best_a, f"best_{name_b}": best_b,
                            "best_changes": best_a != best_b, "order_changes": ra != rb,
                            f"best_effective_gpus_{name_a}": a["graphs"][g]["best"]["effective_gpus"],
                            f"best_effective_gpus_{name_b}": b["graphs"][g]["best"]["effective_gpus"],
                            f"best_multi_gpu_{name_a}": a["graphs"][g]["best"]["multi_gpu"],
                            f"best_multi_gpu_{name_b}": b["graphs"][g]["best"]["multi_gpu"]}
        fast_a = [m for m in best_a if m in FAST]
        if fast_a:
            g_a, prob_a, _, _ = build(g, a["gpu_machine"], a.get("op_model"), a.get("dtype"))
            _, prob_b, _, _ = build(g, b["gpu_machine"], b.get("op_model"), b.get("dtype"))
            m = fast_a[0]
            pa = gdp_baselines.human_from_graph(g_a, prob_a) if m == "human" else \
                gdp_baselines.BASELINES[m](prob_a, seed=0)
            r = simulate(prob_b, pa)
            t_best_b = b["graphs"][g]["best"]["step_time_s"]
            reg = float(r.step_time_s) / t_best_b - 1.0 if r.valid else None
            # the re-made placement under a's own model equals a's recorded time (deterministic placers)
            t_a = float(simulate(prob_a, pa).step_time_s)
            res["graphs"][g]["regret"] = {"method": m, f"step_time_s_under_{name_b}": float(r.step_time_s),
                                          f"step_time_s_under_{name_a}": t_a, "valid": bool(r.valid),
                                          "regret": reg}
            regrets.append(reg)
        taus += [tau_v] if tau_v is not None else []
        changed_best += best_a != best_b
        changed_order += ra != rb
        tau_s = "n/a" if tau_v is None else f"{tau_v:.3f}"
        lines.append(f"  {g:<14} tau {tau_s:>6}  best {','.join(best_a)} -> {','.join(best_b)}  "
                     f"ranks {name_a} {ra} {name_b} {rb}")
        if "regret" in res["graphs"][g]:
            rg = res["graphs"][g]["regret"]
            lines.append(f"  {'':14} {name_a}'s best ({rg['method']}) under {name_b}: "
                         + (f"{rg[f'step_time_s_under_{name_b}'] * 1e3:.2f} ms, {rg['regret']:+.1%} over "
                            f"{name_b}'s best" if rg["valid"] else "invalid"))
    res["summary"] = {"graphs": len(res["graphs"]), "best_changes": changed_best,
                      "order_changes": changed_order,
                      "kendall_tau_b_mean": float(np.mean(taus)) if taus else None,
                      "kendall_tau_b_min": float(np.min(taus)) if taus else None,
                      "regret_max": max((x for x in regrets if x is not None), default=None),
                      "regret_graphs": len(regrets)}
    lines.append(f"  rank lists are in the method order {ms}")
    lines.append(f"  best method changes on {changed_best}/{len(res['graphs'])} graphs, rank order on "
                 f"{changed_order}/{len(res['graphs'])}; Kendall tau-b mean "
                 f"{res['summary']['kendall_tau_b_mean']}, min {res['summary']['kendall_tau_b_min']}; "
                 f"{name_a}'s best placement loses at most {res['summary']['regret_max']} under {name_b}")
    res["lines"] = lines
    return res


if __name__ == "__main__":
    main()
