"""GDP's Table 1 analogue: operator placement of the paper's 12 graphs on P100-like GPUs (issue 18).

    python bench/gdp.py [--seeds 0,1,2] [--time 120] [--workers 2] [--graphs NAME,...]
                        [--methods M,...] [--machine p100-pcie] [--fresh]

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

Speed-ups are ``T_baseline / T_gdp - 1`` (spec §9.1); geomeans run over the graphs on which both are
valid; an invalid placement (out of memory, split co-location group) is listed with its reason. Runs
are cached in ``bench/results/gdp_runs.json`` keyed by graph, method, seed, budget and the code version
of the modules that method depends on (``CODE``); each records its commit and command. Writes
``bench/results/gdp.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GRAPHS = ("rnnlm-2", "rnnlm-4", "gnmt-2", "gnmt-4", "gnmt-8", "txl-2", "txl-4", "txl-8", "inception-v3",
          "amoebanet", "wavenet-2x18", "wavenet-4x36")
FAST = ("human", "metis", "m-topo", "m-etf", "m-sct")
METHODS = FAST + ("random", "gdp-one", "hdp", "gdp-noatt")
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
        "hdp": _GDP + ("archplace.algorithms.rl.hdp",) + _CORE, "gdp-noatt": _GDP + _CORE}
# GDP-one over HP and HDP (Table 1) and over the placer without attention (§4.4)
PAPER_GEOMEAN = {"human": 0.16, "hdp": 0.092, "gdp-noatt": 0.18}


def build(name: str, machine_name: str):
    """(graph, problem, GDPGraph) of a preset on its Table 1 device count."""
    from archplace.algorithms.rl.gdp_env import GDPGraph
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.simulators.gpu_placement import PlacementProblem
    from archplace.workloads.gdp_models import GDP_PRESETS, gdp_graph, node_features

    g = gdp_graph(name)
    problem = PlacementProblem.from_graph(g, gpu_machine(machine_name, GDP_PRESETS[name].devices))
    feats, _ = node_features(g)
    return g, problem, GDPGraph(problem, feats, name)


def run_one(name: str, method: str, seed: int, time_s: float, machine_name: str) -> dict:
    """One method on one graph (a Ray task, one CPU)."""
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.search import gdp_baselines
    from archplace.simulators.gpu_placement import simulate

    t0 = time.perf_counter()
    g, problem, gg = build(name, machine_name)
    t_build = time.perf_counter() - t0
    out: dict = {"graph": name, "method": method, "seed": seed, "nodes": problem.num_nodes,
                 "devices": problem.num_devices, "build_s": t_build}
    t1 = time.perf_counter()
    if method in FAST:
        p = gdp_baselines.human_from_graph(g, problem) if method == "human" else \
            gdp_baselines.BASELINES[method](problem, seed=0)
        r = simulate(problem, p)
        out.update(step_time_s=r.step_time_s, valid=r.valid, reason=r.reason, samples=1)
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
                   sampled_mean_step_time_s=[m[0] for m in run.sampled_mean_step_time_s],
                   curve=[[round(c[0], 2), c[1]] for c in run.curve])
    else:
        raise ValueError(f"run_one: method {method!r} is not a fast or learned placer (random: random_best)")
    out["search_s"] = time.perf_counter() - t1
    out.update(commit=git_state()["commit"], command=command())
    return out


def random_best(name: str, seed: int, samples: int, machine_name: str) -> dict:
    """The best valid of ``samples`` uniform placements (co-location groups kept whole)."""
    from archplace.algorithms.search.gdp_baselines import random_placement
    from archplace.simulators.gpu_placement import simulate_batch

    t0 = time.perf_counter()
    _, problem, _ = build(name, machine_name)
    rng = np.random.default_rng(seed)
    best, valid_any, chunk = float("inf"), False, 64
    done = 0
    while done < samples:
        k = min(chunk, samples - done)
        P = np.stack([random_placement(problem, seed=int(rng.integers(2**31))) for _ in range(k)])
        r = simulate_batch(problem, P)
        if r.valid.any():
            valid_any = True
            best = min(best, float(r.step_time_s[r.valid].min()))
        done += k
    return {"graph": name, "method": "random", "seed": seed, "samples": samples, "step_time_s": best,
            "valid": valid_any, "reason": "" if valid_any else f"none of {samples} samples valid",
            "search_s": time.perf_counter() - t0, "commit": git_state()["commit"], "command": command()}


def geomean(x) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(x, dtype=float)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time", type=float, default=120.0, help="wall seconds of GDP-one per graph and seed")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--machine", default="p100-pcie", choices=("p100-pcie", "v100-nvlink"))
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

    import ray

    versions = {m: code_version(*CODE[m]) for m in METHODS}
    cache_path = Path(args.cache)
    cache = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())

    def key(g, m, s):
        t = f"|{args.time}" if m in LEARNED + ("random",) else ""
        return f"{g}|{m}|{s if m in LEARNED + ('random',) else 0}{t}|{args.machine}|{versions[m]}"

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
    todo = [j for j in jobs if j[0] not in cache]
    print(f"{len(jobs)} runs, {len(todo)} to do (code versions {versions})", flush=True)
    t0 = time.perf_counter()
    if todo or "random" in methods:
        ray.init(num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False)
        task = ray.remote(num_cpus=1, max_retries=0)(run_one)
        pending = {task.remote(g, m, s, args.time, args.machine): k for k, g, m, s in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            cache[k] = ray.get(done[0], timeout=600)
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
                        pend[rtask.remote(g, s, cache[key(g, "gdp-one", s)]["samples"], args.machine)] = k
            while pend:
                done, _ = ray.wait(list(pend), num_returns=1)
                k = pend.pop(done[0])
                cache[k] = ray.get(done[0], timeout=600)
                save()
        ray.shutdown()

    out: dict = {**git_state(), "command": command(), "machine": machine(load), "code_versions": versions,
                 "gpu_machine": args.machine, "seeds": seeds, "time_s": args.time, "methods": methods,
                 "graphs": {}}
    cols = [m for m in ("human", "metis", "m-topo", "m-etf", "m-sct", "random") if m in methods]
    learned = [m for m in LEARNED if m in methods]
    print(f"\nStep time (ms) on {args.machine}; learned placers: best-seen mean over seeds {seeds} "
          f"[the greedy policy's], {args.time:g} s per seed")
    print(f"{'graph':<14}{'ops':>7}{'d':>3}" + "".join(f"{c:>10}" for c in cols)
          + "".join(f"{m:>18}" for m in learned))
    ref = "gdp-one" if "gdp-one" in learned else None
    others = cols + [m for m in learned if m != ref]
    speed: dict[str, list[float]] = {c: [] for c in others}

    def fmt(t: float) -> str:
        return f"{t * 1e3:.2f}" if np.isfinite(t) else "invalid"

    for g in graphs:
        row = {m: cache[key(g, m, 0)] for m in cols if m in FAST}
        runs = {m: [cache[key(g, m, s)] for s in seeds] for m in learned}
        rnd = [cache[key(g, "random", s)] for s in seeds] if "random" in methods else []
        any_run = next(iter(row.values()), next(iter(runs.values()), [None])[0])
        entry = {m: {"step_time_s": r["step_time_s"] if r["valid"] else float("inf"), "valid": r["valid"],
                     "reason": r["reason"]} for m, r in row.items()}
        if rnd:
            ok = [r for r in rnd if r["valid"]]
            t = float(np.mean([r["step_time_s"] for r in ok])) if len(ok) == len(rnd) else float("inf")
            entry["random"] = {"step_time_s": t, "valid": bool(np.isfinite(t)),
                               "per_seed": [r["step_time_s"] for r in rnd],
                               "samples": [r["samples"] for r in rnd]}
        cells = [f"{fmt(entry[c]['step_time_s']):>10}" for c in cols]
        for m, rs in runs.items():
            best = [r["step_time_s"] for r in rs]
            greedy = [r["greedy_step_time_s"] if r["greedy_valid"] else float("inf") for r in rs]
            tb = float(np.mean(best)) if all(np.isfinite(best)) else float("inf")
            tg = float(np.mean(greedy)) if all(np.isfinite(greedy)) else float("inf")
            entry[m] = {"step_time_s": tb, "per_seed": best, "greedy_step_time_s": tg,
                        "greedy_per_seed": greedy, "samples": [r["samples"] for r in rs],
                        "iterations": [r["iterations"] for r in rs], "search_s": [r["search_s"] for r in rs]}
            cells.append(f"{fmt(tb):>10} [{fmt(tg)}]".rjust(18))
        if ref:
            for c in others:
                tb, tr = entry[c]["step_time_s"], entry[ref]["step_time_s"]
                if np.isfinite(tb) and np.isfinite(tr):
                    speed[c].append(tb / tr)
        out["graphs"][g] = entry
        print(f"{g:<14}{any_run['nodes'] if any_run else 0:>7}{any_run['devices'] if any_run else 0:>3}"
              + "".join(cells))
    if ref:
        out["speedup_geomean"] = {}
        for c in others:
            if speed[c]:
                s = geomean(speed[c]) - 1
                out["speedup_geomean"][c] = {"value": s, "graphs": len(speed[c])}
                paper = f" (paper: {PAPER_GEOMEAN[c]:+.1%})" if c in PAPER_GEOMEAN else ""
                print(f"  gdp-one (best-seen) over {c}: {s:+.1%} geomean on {len(speed[c])} graphs where "
                      f"both are valid{paper}")
        best_fast = {g: min(out["graphs"][g][c]["step_time_s"] for c in cols if c in FAST) for g in graphs}
        vs = [best_fast[g] / out["graphs"][g][ref]["step_time_s"] for g in graphs
              if np.isfinite(best_fast[g]) and np.isfinite(out["graphs"][g][ref]["step_time_s"])]
        if vs:
            out["speedup_geomean"]["best fast placer per graph"] = {"value": geomean(vs) - 1,
                                                                     "graphs": len(vs)}
            print(f"  gdp-one (best-seen) over the best fast placer of each graph: {geomean(vs) - 1:+.1%}")
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
