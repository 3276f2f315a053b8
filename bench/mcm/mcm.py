"""MCM partitioning at equal wall time: samplers, CP-SAT neighbourhood search, and RL on both (issue 17).

    python bench/mcm/mcm.py [--seeds 0,1,2] [--time-test 10] [--time-small 20] [--workers 2]
                        [--methods M,...] [--graphs NAME,...] [--fresh]
                        [--split test|validation] [--pretrained W] [--out F]

Every method gets the same wall time per graph (``--time-test`` seconds on the 16 held-out test graphs
on ``mcm-36``, ``--time-small`` on the six 8-chip small graphs whose CP-SAT optimum is known), at every
seed (default 0, 1, 2), one CPU each (Ray tasks, ``--workers`` at a time). The budgets and every
method's settings were fixed before any test graph was run.

* ``random`` / ``sa``: the paper's baselines through SAMPLE repair, until the time is up;
* ``ppo``: the paper's PPO with FIX-repaired actions (``tune_configs/mcm_ppo.yaml``), from scratch;
* ``greedy+lns``: the greedy heuristic (after repair), then CP-SAT large-neighbourhood search
  (``mcm_lns.lns``, the non-learned bottleneck-window rule) for the rest of the time;
* ``random+lns`` / ``ppo+lns``: the sampler for half the time, then LNS from its best for the other half;
* every LNS variant's CP-SAT sub-solve gets the same ``mcm_lns.SUBSOLVE_S`` wall seconds (issue 31:
  PPO-LNS had 1 s against greedy+LNS's 2 s); wall-clock budgets are load-dependent (two identical 20 s
  LNS runs gave 0.00% and 3.82%), so the comparison at equal deterministic sub-solve budgets on large
  graphs, with untrained / uniform / rule controls, is ``bench/mcm/mcm_large.py``;
* ``ppo-lns``: LNS whose neighbourhoods a PPO policy picks (``mcm_lns_ppo``), from the weights of
  ``bench/mcm/mcm_lns_pretrain.py`` and fine-tuned on the graph; ``ppo-lns-scratch``: the same search (the
  weights' env reward mode) from random weights (the pre-training comparison).

Every method's result is the better of its own best and the greedy partition (as in ``archplace
partition``; a run whose own best is worse, e.g. paper PPO that finished no sample in time, is counted
in ``greedy_won``). Each run records its best throughput and partition (re-checked with the
simulator), the number of simulator calls (evaluated partitions: samples for the samplers, sub-solves
for LNS, both for the hybrids), the best-so-far curve over wall time, and its repair-stage counts. Results:

* test graphs: best / greedy per graph (mean over seeds), the geomean over graphs per seed, its mean
  and spread over seeds, graphs on which every LNS method ties reported apart, and each RL method
  against the best non-RL method with LNS;
* small graphs: the gap to the CP-SAT optimum (``bench/mcm/results/mcm_exact.json``, 120 s, 8 workers);
* pre-training: the wall time ``ppo-lns`` needs to reach ``ppo-lns-scratch``'s final result, against
  the time ``ppo-lns-scratch`` needed for it.

Runs are cached in ``bench/mcm/results/mcm_lns_runs.json`` keyed by graph, method, time, seed and the code
version of everything they depend on (``_meta.code_version`` plus the pre-trained weights' hash), each
with the commit and command that produced it. Writes ``bench/mcm/results/mcm_lns.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("random", "sa", "ppo", "greedy+lns", "random+lns", "ppo+lns", "ppo-lns", "ppo-lns-scratch")
NON_RL_LNS = ("greedy+lns", "random+lns")
RL = ("ppo", "ppo+lns", "ppo-lns", "ppo-lns-scratch")
LNS = ("greedy+lns", "random+lns", "ppo+lns", "ppo-lns", "ppo-lns-scratch")
SMALL_GRAPHS = ("cnn00_b2_i32", "dag00_n30_w7", "cnn23_b3_i32", "bert-l1-h256-s128")
SMALL_LSTMS = {"lstm-s0_t2_h256": (2, 256, 101, 32), "lstm-s1_t2_h512": (2, 512, 102, 64)}
EXACT_TIME_S = 120.0
BIG = 10**7  # sample cap of the time-limited samplers (the wall time binds first)


def run_one(problem, method: str, time_s: float, seed: int, pretrained: str) -> dict:
    """One search of ``time_s`` wall seconds; runs in a Ray task (one CPU)."""
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.search.mcm_baselines import greedy, random_search, simulated_annealing
    from archplace.algorithms.solvers.mcm_lns import lns
    from archplace.simulators.mcm import evaluate

    t0 = time.perf_counter()
    np.random.seed(seed)
    torch.manual_seed(seed)
    curve: list[tuple[float, float]] = []  # (wall s, best throughput so far)
    calls, extra, sampler = 0, {}, method.split("+")[0]
    part = None
    if method in ("ppo-lns", "ppo-lns-scratch"):
        from archplace.algorithms.rl.mcm_lns_ppo import env_settings, ppo_lns_search
        from archplace.algorithms.rl.mcm_ppo import load_state

        state, meta = load_state(pretrained)
        # scratch runs the pre-trained weights' env (reward mode) from random weights: the same search
        r = ppo_lns_search(problem, time_s, seed=seed, init_state=state if method == "ppo-lns" else None,
                           env=env_settings(meta))
        part, calls = r.partition, r.subsolves + 1
        curve = [(t, 1.0 / L) for t, L in zip(r.trace_t_s, r.trace_max_latency_s)]
        extra = r.summary()
    else:
        t_sampler = time_s if "+" not in method else (0.0 if sampler == "greedy" else time_s / 2)
        if sampler == "greedy":
            part, tp = greedy(problem, seed=seed)
            calls, curve = 1, [(time.perf_counter() - t0, tp)]
        elif sampler in ("random", "sa"):
            fn = random_search if sampler == "random" else simulated_annealing
            tr = fn(problem, BIG, seed=seed, time_limit_s=t_sampler)
            part, calls = tr.best_partition, tr.samples
            # the sampler's curve at sample resolution, on its own clock
            ts = np.linspace(0, tr.wall_s, tr.samples + 1)[1:]
            curve = [(float(t), float(b)) for t, b in zip(ts, tr.best_so_far)]
            extra = {k: v for k, v in tr.extra.items() if k.startswith("repair")}
        elif sampler == "ppo":
            from archplace.algorithms.rl.mcm_ppo import rl_search

            tr = rl_search(problem, BIG, seed=seed, time_limit_s=t_sampler, method="ppo").trace
            part, calls = tr.best_partition, tr.samples
            ts = np.linspace(0, tr.wall_s, tr.samples + 1)[1:]
            curve = [(float(t), float(b)) for t, b in zip(ts, tr.best_so_far)]
            extra = {k: v for k, v in tr.extra.items() if k.startswith("repair")}
        if part is None:  # no valid sample: LNS starts from greedy, which is always a candidate
            part = greedy(problem, seed=seed)[0]
        if method.endswith("+lns"):
            # the LNS half is fixed (time_s - t_sampler), so a sampler that overran its half (PPO's last
            # update runs past its deadline) does not eat into it; the run's wall_s shows the overrun
            spent = time.perf_counter() - t0 if sampler == "greedy" else t_sampler
            left = max(0.1, time_s - spent)
            off = time.perf_counter() - t0
            r = lns(problem, part, time_limit_s=left, seed=seed)
            part, calls = r.partition, calls + r.subsolves
            curve += [(off + float(t), float(b)) for t, b in zip(r.trace_t_s, r.trace_throughput)]
            extra.update(r.summary())
    own = float(evaluate(problem, part).throughput[0])
    g_part, g_tp = greedy(problem, seed=seed)  # the heuristic is always a candidate (as in the API)
    if g_tp > own:
        part = g_part
    ev = evaluate(problem, part)
    return {"throughput": float(ev.throughput[0]), "own_throughput": own, "greedy_won": g_tp > own,
            "valid": bool(ev.valid[0]),
            "partition": [int(v) for v in part], "simulator_calls": int(calls),
            "curve": [[round(t, 3), b] for t, b in curve], "wall_s": time.perf_counter() - t0, "extra": extra,
            "commit": git_state()["commit"], "command": command()}


def geomean(x) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(np.asarray(x, dtype=float), 1e-300)))))


def time_to_reach(curve, target: float) -> float | None:
    for t, b in curve:
        if b >= target * (1 - 1e-9):
            return float(t)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time-test", type=float, default=10.0, help="wall seconds per method and test graph")
    ap.add_argument("--time-small", type=float, default=20.0, help="wall seconds per method and small graph")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--graphs", default="", help="subset of graph names (test and small)")
    ap.add_argument("--split", default="test", choices=("test", "validation"),
                    help="validation: the corpus's held-out validation graphs in place of the test graphs "
                         "(for design choices before a test run; writes mcm_lns_validation.json)")
    ap.add_argument("--pretrained", default=str(RESULTS / "mcm_lns_pretrained.npz"))
    ap.add_argument("--cache", default=str(RESULTS / "mcm_lns_runs.json"))
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--out", default="",
                    help="results JSON (default: mcm_lns.json, or mcm_lns_validation.json for validation)")
    args = ap.parse_args()
    load = os.getloadavg()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS))
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; allowed: {list(METHODS)}")
    if "ppo-lns" in methods and not Path(args.pretrained).exists():
        raise SystemExit(f"{args.pretrained} does not exist: run bench/mcm/mcm_lns_pretrain.py first")

    import ray

    from archplace.algorithms.search.mcm_baselines import greedy
    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem
    from archplace.workloads.corpus import mcm_corpus, split_by_family
    from archplace.workloads.synthetic import rnn_graph

    corpus = mcm_corpus(seed=0)
    test = {g.name: MCMProblem.from_graph(g.graph, mcm_package(36))
            for g in split_by_family(corpus)[args.split]}
    small = {g.name: MCMProblem.from_graph(g.graph, mcm_package(8)) for g in corpus if g.name in SMALL_GRAPHS}
    for n, (steps, hidden, s, batch) in SMALL_LSTMS.items():
        g = rnn_graph(steps, hidden, s, batch=batch, cell="lstm", bytes_per_element=1)
        small[n] = MCMProblem.from_graph(g, mcm_package(8))
    if args.graphs:
        keep = set(args.graphs.split(","))
        unknown = sorted(keep - set(test) - set(small))
        if unknown:
            raise SystemExit(f"--graphs: unknown {unknown}; allowed: {sorted(test) + sorted(small)}")
        test = {k: v for k, v in test.items() if k in keep}
        small = {k: v for k, v in small.items() if k in keep}

    version = code_version("archplace.algorithms", "archplace.simulators", "archplace.workloads",
                           "archplace.hardware")
    weights = hashlib.sha256(Path(args.pretrained).read_bytes()).hexdigest()[:12] \
        if Path(args.pretrained).exists() else "none"
    cache_path = Path(args.cache)
    cache = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())

    from archplace.algorithms.rl.mcm_lns_ppo import env_settings
    from archplace.algorithms.rl.mcm_ppo import load_state

    env_tag = "" if not Path(args.pretrained).exists() else \
        "".join(f"|{k}={v}" for k, v in sorted(env_settings(load_state(args.pretrained)[1]).items())
                if (k, v) != ("reward", "rate"))

    def key(name, m, t, s):
        w = f"|{weights}" if m == "ppo-lns" else (env_tag if m == "ppo-lns-scratch" else "")
        return f"{name}|{m}|{t}|{s}|{version}{w}"

    jobs = []
    for _group, probs, t in (("small", small, args.time_small), ("test", test, args.time_test)):
        for s in seeds:
            for name, p in probs.items():
                for m in methods:
                    jobs.append((key(name, m, t, s), p, m, t, s))
    todo = [j for j in jobs if j[0] not in cache]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} cached, {len(todo)} to do (code version {version})",
          flush=True)
    if todo:
        ray.init(num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False)
        task = ray.remote(num_cpus=1, max_retries=0)(run_one)
        pending = {task.remote(p, m, t, s, args.pretrained): k for k, p, m, t, s in todo}
        t0 = time.perf_counter()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            cache[k] = ray.get(done[0], timeout=60)
            tmp = cache_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(cache))
            tmp.replace(cache_path)
            print(f"[{time.perf_counter() - t0:6.0f} s] {'|'.join(k.split('|')[:4])}: "
                  f"{cache[k]['throughput']:.1f} /s, {cache[k]['simulator_calls']} calls, "
                  f"{cache[k]['wall_s']:.1f} s ({len(pending)} left)", flush=True)
        ray.shutdown()

    out: dict = {**git_state(), "command": command(), "machine": machine(load), "code_version": version,
                 "pretrained_weights": weights, "seeds": seeds, "methods": methods,
                 "time_test_s": args.time_test, "time_small_s": args.time_small}
    for k, *_ in jobs:
        if not cache[k]["valid"]:
            raise SystemExit(f"run {k} returned an invalid partition")

    def tbl(name, m, t, s):
        return cache[key(name, m, t, s)]

    # ------------------------------------------------------------------ test graphs
    if test:
        T = args.time_test
        gtp = {n: greedy(p)[1] for n, p in test.items()}
        ratio = {m: np.array([[tbl(n, m, T, s)["throughput"] / gtp[n] for n in test] for s in seeds])
                 for m in methods}  # [seed, graph]
        lns_m = [m for m in methods if m in LNS]
        tied = [n for i, n in enumerate(test) if lns_m and
                np.ptp([ratio[m][:, i].mean() for m in lns_m]) <= 1e-6 * ratio[lns_m[0]][:, i].mean()]
        open_ = [i for i, n in enumerate(test) if n not in tied]
        print(f"\n{args.split.capitalize()} graphs on mcm-36, {T:g} s per method, seeds {seeds}: "
              "best / greedy (mean over seeds)")
        print(f"{'graph':<22}{'nodes':>6}" + "".join(f"{m:>16}" for m in methods))
        for i, n in enumerate(test):
            cells = "".join(f"{ratio[m][:, i].mean():>16.3f}" for m in methods)
            print(f"{n:<22}{test[n].num_nodes:>6}{cells}" + ("   (tie)" if n in tied else ""))
        per_graph = {n: {m: ratio[m][:, i].tolist() for m in methods} for i, n in enumerate(test)}
        res: dict = {"per_graph": per_graph, "tied_graphs": tied, "greedy_throughput": gtp}
        for label, idx in (("all", list(range(len(test)))), ("untied", open_)):
            if not idx:
                continue
            geo = {m: np.array([geomean(ratio[m][s, idx]) for s in range(len(seeds))]) for m in methods}
            res[f"geomean_{label}"] = {m: {"per_seed": geo[m].tolist(), "mean": float(geo[m].mean()),
                                           "min": float(geo[m].min()), "max": float(geo[m].max())}
                                       for m in methods}
            print(f"{'geomean ' + label + f' ({len(idx)})':<28}"
                  + "".join(f"{geo[m].mean():>10.3f} ±{geo[m].std():.3f}" for m in methods))
            base = [m for m in NON_RL_LNS if m in methods]
            for m in [m for m in RL if m in methods and base]:
                best_base = np.max([geo[b] for b in base], axis=0)  # the best non-RL LNS method, per seed
                d = geo[m] / best_base - 1
                res.setdefault(f"vs_best_non_rl_lns_{label}", {})[m] = {"per_seed": d.tolist(),
                                                                         "mean": float(d.mean())}
                print(f"  {m} vs the best non-RL method with LNS ({label}): {d.mean():+.2%} "
                      f"(seeds: {', '.join(f'{x:+.2%}' for x in d)})")
        calls = {m: float(np.median([tbl(n, m, T, s)["simulator_calls"] for n in test for s in seeds]))
                 for m in methods}
        res["median_simulator_calls"] = calls
        print("median simulator calls per run: " + ", ".join(f"{m} {c:.0f}" for m, c in calls.items()))
        won = {m: sum(tbl(n, m, T, s)["greedy_won"] for n in test for s in seeds) for m in methods}
        res["greedy_won"] = won
        print("runs whose own best lost to the greedy partition: "
              + ", ".join(f"{m} {c}" for m, c in won.items()))
        walls = {m: float(np.max([tbl(n, m, T, s)["wall_s"] for n in test for s in seeds])) for m in methods}
        res["max_wall_s"] = walls
        print("longest run (s, overheads included): " + ", ".join(f"{m} {w:.1f}" for m, w in walls.items()))
        if "ppo-lns" in methods and "ppo-lns-scratch" in methods:
            rows = []  # pre-trained's time to reach scratch's final, against scratch's own time to it and T
            for n in test:
                for s in seeds:
                    sc, pr = tbl(n, "ppo-lns-scratch", T, s), tbl(n, "ppo-lns", T, s)
                    target = sc["own_throughput"]  # on its own curve (the greedy candidate is not)
                    t_sc = time_to_reach(sc["curve"], target)
                    t_pr = time_to_reach(pr["curve"], target)
                    rows.append({"graph": n, "seed": s, "scratch_s": t_sc, "pretrained_s": t_pr})
            reached = [r for r in rows if r["pretrained_s"] is not None]
            ratios = [r["pretrained_s"] / max(r["scratch_s"], 1e-3) for r in reached]
            within_half = sum(r["pretrained_s"] <= 0.5 * max(r["scratch_s"], 1e-3) for r in reached)
            pre_s = [r["pretrained_s"] for r in reached]
            pt = {"runs": rows, "reached": len(reached), "total": len(rows),
                  "within_half_of_scratch_time": within_half,
                  "median_time_ratio": float(np.median(ratios)) if ratios else None,
                  "median_pretrained_s": float(np.median(pre_s)) if pre_s else None,
                  "median_scratch_s": float(np.median([r["scratch_s"] for r in rows]))}
            res["pretraining"] = pt
            print(f"pre-trained ppo-lns reaches the from-scratch result in {len(reached)}/{len(rows)} runs, "
                  f"in at most half the time scratch needed in {within_half}; time ratio median "
                  f"{pt['median_time_ratio']}; median seconds: pre-trained {pt['median_pretrained_s']}, "
                  f"scratch {pt['median_scratch_s']} (budget {T:g})")
        out["test"] = res

    # ------------------------------------------------------------------ small graphs
    if small:
        T = args.time_small
        exact = json.loads((RESULTS / "mcm_exact.json").read_text())
        opt = {}
        for n in small:
            ek = f"{n}|8|{EXACT_TIME_S}"
            if ek not in exact or exact[ek]["status"] != "optimal":
                raise SystemExit(f"no proven optimum for {n} in mcm_exact.json (run bench/mcm/mcm_table2.py "
                                 "--small-only)")
            opt[n] = exact[ek]["throughput"]
        print(f"\nSmall graphs on 8 chips, {T:g} s per method: gap to the CP-SAT optimum (worst over seeds)")
        print(f"{'graph':<22}{'nodes':>6}" + "".join(f"{m:>16}" for m in methods))
        res = {}
        for n in small:
            gaps = {m: [1 - tbl(n, m, T, s)["throughput"] / opt[n] for s in seeds] for m in methods}
            res[n] = {"optimum": opt[n], **{m: g for m, g in gaps.items()}}
            print(f"{n:<22}{small[n].num_nodes:>6}" + "".join(f"{max(gaps[m]):>16.2%}" for m in methods))
        for m in methods:
            ok = sum(max(res[n][m]) <= 0.03 for n in small)
            print(f"  {m}: within 3% of the optimum at every seed on {ok}/{len(small)} small graphs")
        out["small"] = res
    dest = Path(args.out) if args.out else \
        RESULTS / ("mcm_lns.json" if args.split == "test" else "mcm_lns_validation.json")
    out["split"] = args.split
    dest.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {dest}")


if __name__ == "__main__":
    main()
