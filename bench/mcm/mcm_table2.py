"""MCM partitioning on held-out test graphs: the paper's Table 2 and the claims around it (issue 6).

    python bench/mcm/mcm_table2.py [--samples 600] [--graphs NAME,...] [--workers 2] [--pretrained PATH]

Under the analytical cost model on ``mcm-36`` for the 16 test graphs (LSTM + transformer families, never
seen in pre-training), every method gets the same budget of samples (evaluated partitions):

* Random (uniform distribution through SAMPLE repair), SA (through the solver), RL from scratch (PPO
  with FIX repair, trained on the sampled y: ``train_on: sampled``), RL on y' (the same, trained on the
  log-probability of the repaired partition: ``train_on: repaired``, the YAML's default since session
  4), RL zero-shot (the pre-trained policy sampled, no updates), RL fine-tuned (the pre-trained policy
  trained further on the graph, on y). The committed weights ``mcm_pretrained.npz`` come from
  ``bench/mcm/mcm_pretrain.py`` trained on y; every method pins its ``train_on``, so cached runs keep their
  meaning.
* Table 2: samples for the geomean (over graphs) best-so-far throughput / greedy to reach 1.6x, 1.7x,
  1.8x, with the reduction relative to RL from scratch in parentheses.
* Equal budgets: the geomean improvement of every method at 25%, 50% and 100% of the budget, and PPO's
  gain over Random and SA (paper: +4.36% and +6.49%).
* RL without repair (invalid -> reward 0) on the same graphs: valid partitions found.
* Small graphs (<= 48 nodes, 8 chips): every method's best against the CP-SAT optimum (target for PPO:
  within 3%). Four corpus graphs (two CNNs and a DAG from the training families, bert-l1 from the test
  set) and two held-out two-step LSTMs; the PPO variants include "PPO refine", an incumbent-anchored
  local search (:data:`REFINE`). ``--small-only`` runs and prints just this part (``mcm_small.json``).

Runs are Ray tasks (one CPU each). Finished runs are cached in ``bench/mcm/results/mcm_runs.json`` (or
``--cache``; every ``mcm_runs*.json`` there is read, so two bench processes with different ``--cache``
files can share the work), an interrupted bench resumes; ``--fresh`` ignores the caches. Writes
``bench/mcm/results/mcm.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("random", "sa", "rl", "rl_repaired", "rl_zeroshot", "rl_finetune")
# the same pair from weights pre-trained on y' (bench/mcm/mcm_pretrain.py --train-on repaired), fine-tuned
# on y'
TRANSFER_Y = ("rl_zeroshot_y", "rl_finetune_y")
PRETRAINED = ("rl_zeroshot", "rl_finetune") + TRANSFER_Y
LABELS = {"random": "Random", "sa": "SA", "rl": "RL", "rl_zeroshot": "RL Zeroshot",
          "rl_finetune": "RL Finetuning", "rl_repaired": "RL on y'", "rl_norepair": "RL w/o repair",
          "rl_prior": "PPO + keep-prior", "rl_refine": "PPO refine",
          "rl_zeroshot_y": "Zeroshot (y')", "rl_finetune_y": "Finetuning (y')"}
THRESHOLDS = (1.6, 1.7, 1.8)
SMALL_METHODS = ("random", "sa", "rl", "rl_repaired", "rl_prior", "rl_refine")
SMALL_PPO = ("rl", "rl_repaired", "rl_prior", "rl_refine")
SMALL_GRAPHS = ("cnn00_b2_i32", "dag00_n30_w7", "cnn23_b3_i32", "bert-l1-h256-s128")  # from the corpus
# held-out small graphs of a test family (LSTM, never trained on): two unrolled steps, <= 48 ops
SMALL_LSTMS = {"lstm-s0_t2_h256": (2, 256, 101, 32), "lstm-s1_t2_h512": (2, 512, 102, 64)}
# PPO as an incumbent-anchored local search (ours): trained on y', every episode starts from the best
# partition so far, the keep-prior on, the previous partition's per-chip loads in the observation
REFINE = {"env": {"train_on": "repaired", "init": "best", "load_features": True}, "model": {"prev_bias": 2.0}}


def run_one(problem, method: str, samples: int, seed: int, pretrained: str | None) -> dict:
    """One search; returns the best-so-far curve (samples/s) and counts. Runs in a Ray task."""
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.search.mcm_baselines import random_search, simulated_annealing

    t0 = time.perf_counter()
    if method == "random":
        tr = random_search(problem, samples, seed=seed)
    elif method == "sa":
        tr = simulated_annealing(problem, samples, seed=seed)
    else:
        from archplace.algorithms.rl.mcm_ppo import load_state, rl_search

        torch.manual_seed(seed)
        state = None
        if method in PRETRAINED:
            state, _ = load_state(pretrained)
        model = {"prev_bias": 2.0} if method == "rl_prior" else None
        # pinned, not the YAML's default, so a cached run keeps its meaning when the default changes
        env = {"train_on": "repaired" if method in ("rl_repaired", "rl_finetune_y") else "sampled"}
        if method == "rl_refine":
            env, model = REFINE["env"], REFINE["model"]
        tr = rl_search(problem, samples, seed=seed, init_state=state, train="zeroshot" not in method,
                       repair="none" if method == "rl_norepair" else "fix", method=method, model=model,
                       env=env).trace
    return {"best_so_far": [float(v) for v in tr.best_so_far], "valid_samples": int(tr.valid_samples),
            "raw_valid_samples": int(tr.extra.get("raw_valid_samples", tr.valid_samples)),
            "best_partition": None if tr.best_partition is None else [int(v) for v in tr.best_partition],
            "wall_s": time.perf_counter() - t0}


def geomean(x: np.ndarray, axis: int = 0) -> np.ndarray:
    return np.exp(np.log(np.maximum(x, 1e-12)).mean(axis=axis))


def first_reach(curve: np.ndarray, target: float) -> int | None:
    hit = np.flatnonzero(curve >= target - 1e-12)
    return int(hit[0]) + 1 if len(hit) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--samples", type=int, default=600, help="samples per method and graph")
    ap.add_argument("--graphs", default="", help="comma-separated test graph names (default: all 16)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help=f"subset of {','.join(METHODS + TRANSFER_Y)}")
    ap.add_argument("--workers", type=int, default=2, help="Ray tasks at a time (one CPU each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pretrained", default=str(RESULTS / "mcm_pretrained.npz"))
    ap.add_argument("--pretrained-y", default=str(RESULTS / "mcm_pretrained_repaired.npz"),
                    help="weights for rl_zeroshot_y / rl_finetune_y")
    ap.add_argument("--norepair-samples", type=int, default=200, help="samples for RL without repair")
    ap.add_argument("--small-samples", type=int, default=600, help="PPO samples on the small graphs")
    ap.add_argument("--exact-time-limit", type=float, default=120.0, help="CP-SAT seconds per small graph")
    ap.add_argument("--extra-thresholds", type=lambda v: [float(x) for x in v.split(",") if x],
                    default=[1.5, 1.55, 1.6], help="a second Table 2 at these geomean levels")
    ap.add_argument("--fresh", action="store_true", help="ignore cached runs")
    ap.add_argument("--runs-only", action="store_true",
                    help="only the --methods runs on the test graphs (no extras, no report)")
    ap.add_argument("--small-only", action="store_true", help="only the small graphs against CP-SAT")
    ap.add_argument("--cache", default=str(RESULTS / "mcm_runs.json"),
                    help="this process's run cache (all bench/results/mcm_runs*.json are read)")
    args = ap.parse_args()

    import ray

    from archplace.algorithms.search.mcm_baselines import greedy
    from archplace.algorithms.solvers.mcm_exact import solve_exact
    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem
    from archplace.workloads.corpus import mcm_corpus, split_by_family
    from archplace.workloads.synthetic import rnn_graph

    methods = [m for m in args.methods.split(",") if m]
    bad = sorted(set(methods) - set(METHODS + TRANSFER_Y))
    if bad:
        raise SystemExit(f"--methods: unknown {bad}; allowed: {list(METHODS + TRANSFER_Y)}")

    def weights(m: str) -> str | None:
        return args.pretrained_y if m in TRANSFER_Y else args.pretrained if m in PRETRAINED else None

    missing = sorted({weights(m) for m in methods if weights(m) and not Path(weights(m)).exists()})
    if missing:
        raise SystemExit(f"pre-trained weights {missing} do not exist: run bench/mcm/mcm_pretrain.py first, "
                         "or leave the zero-shot and fine-tuned methods out of --methods")
    corpus = mcm_corpus(seed=0)
    split = split_by_family(corpus)
    test_families = {g.family for g in split["test"]}
    test = split["test"]
    if args.graphs:
        names = args.graphs.split(",")
        unknown = sorted(set(names) - {g.name for g in test})
        if unknown:
            raise SystemExit(f"--graphs: {unknown} are not test graphs; allowed: {[g.name for g in test]}")
        test = [g for g in test if g.name in names]
    pkg = mcm_package(36)
    problems = {g.name: MCMProblem.from_graph(g.graph, pkg) for g in test}
    greedy_tp = {n: greedy(p)[1] for n, p in problems.items()}
    small = {g.name: MCMProblem.from_graph(g.graph, mcm_package(8)) for g in corpus if g.name in SMALL_GRAPHS}
    small_family = {g.name: g.family for g in corpus if g.name in SMALL_GRAPHS}
    for n, (steps, hidden, seed, batch) in SMALL_LSTMS.items():
        g = rnn_graph(steps, hidden, seed, batch=batch, cell="lstm", bytes_per_element=1)
        small[n], small_family[n] = MCMProblem.from_graph(g, mcm_package(8)), "lstm"

    cache_path = Path(args.cache)
    mine = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())
    cache: dict = {}
    if not args.fresh:  # runs cached by any bench process (each writes only its own file)
        for f in sorted(RESULTS.glob("mcm_runs*.json")):
            if f.resolve() != cache_path.resolve():
                cache.update(json.loads(f.read_text()))
    cache.update(mine)

    def key(graph, method, samples, chips=36):
        return f"{graph}|{method}|{samples}|{args.seed}|{chips}"

    small_jobs = [(key(n, m, args.small_samples, 8), p, m, args.small_samples) for n, p in small.items()
                  for m in SMALL_METHODS]
    if args.small_only:
        jobs = small_jobs
    else:
        jobs = [(key(n, m, args.samples), problems[n], m, args.samples) for n in problems for m in methods]
        if not args.runs_only:
            jobs += [(key(n, "rl_norepair", args.norepair_samples), problems[n], "rl_norepair",
                      args.norepair_samples) for n in problems] + small_jobs
    todo = [j for j in jobs if j[0] not in cache]
    print(f"{len(jobs)} runs, {len(jobs) - len(todo)} cached, {len(todo)} to do", flush=True)

    if todo:
        ray.init(num_cpus=max(args.workers, 1), include_dashboard=False, log_to_driver=False)
        task = ray.remote(num_cpus=1, max_retries=0)(run_one)
        pending = {task.remote(p, m, s, args.seed, weights(m)): k for k, p, m, s in todo}
        t0 = time.perf_counter()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            k = pending.pop(done[0])
            cache[k] = mine[k] = ray.get(done[0])
            tmp = cache_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(mine))
            tmp.replace(cache_path)
            print(f"[{time.perf_counter() - t0:7.0f} s] {k}: best {cache[k]['best_so_far'][-1]:.1f}, "
                  f"{cache[k]['wall_s']:.0f} s ({len(pending)} left)", flush=True)
        ray.shutdown()

    def small_report() -> dict:
        """The small graphs against the CP-SAT optimum: prints the table, returns its rows."""
        print(f"\nSmall graphs on 8 chips: every method {args.small_samples} samples, against the CP-SAT "
              "optimum (gap = 1 - best / optimum)")
        print(f"{'graph':<22}{'family':>12}{'nodes':>6}{'CP-SAT':>10}{'status':>9}{'s':>6}"
              + "".join(f"{LABELS[m]:>17}{'gap':>8}" for m in SMALL_METHODS))
        res: dict = {}
        ex_cache = RESULTS / "mcm_exact.json"
        exact = {} if args.fresh or not ex_cache.exists() else json.loads(ex_cache.read_text())
        for n, p in small.items():
            ek = f"{n}|8|{args.exact_time_limit}"
            if "partition" not in exact.get(ek, {}):
                ex = solve_exact(p, time_limit_s=args.exact_time_limit, num_workers=8)
                exact[ek] = {"throughput": ex.throughput, "status": ex.status, "gap": ex.gap,
                             "wall_s": ex.wall_s,
                             "partition": None if ex.partition is None else [int(v) for v in ex.partition]}
                ex_cache.write_text(json.dumps(exact, indent=1))
            ex = exact[ek]
            row = {"family": small_family[n], "nodes": p.num_nodes,
                   **{f"exact_{k}": v for k, v in ex.items() if k != "partition"}}
            cells = ""
            for m in SMALL_METHODS:
                best = cache[key(n, m, args.small_samples, 8)]["best_so_far"][-1]
                row[m], row[f"{m}_gap"] = best, 1 - best / ex["throughput"]
                cells += f"{best:>17.0f}{row[f'{m}_gap']:>8.2%}"
            res[n] = row
            print(f"{n:<22}{small_family[n]:>12}{p.num_nodes:>6}{ex['throughput']:>10.0f}{ex['status']:>9}"
                  f"{ex['wall_s']:>6.0f}{cells}")
        held = [n for n in res if small_family[n] in test_families]
        for m in SMALL_PPO:
            ok = [n for n in res if res[n][f"{m}_gap"] <= 0.03]
            print(f"{LABELS[m]}: within 3% of the optimum on {len(ok)}/{len(res)} small graphs "
                  f"({sum(n in ok for n in held)}/{len(held)} of the held-out ones)")
        return res

    if args.runs_only:
        return
    if args.small_only:
        (RESULTS / "mcm_small.json").write_text(json.dumps(small_report(), indent=1))
        print(f"\nwrote {RESULTS / 'mcm_small.json'}")
        return

    # ---------------------------------------------------------------- Table 2 and equal budgets
    curves = {m: np.array([np.asarray(cache[key(n, m, args.samples)]["best_so_far"]) / greedy_tp[n]
                           for n in problems]) for m in methods}
    geo = {m: geomean(c, axis=0) for m, c in curves.items()}
    out: dict = {"samples": args.samples, "seed": args.seed, "graphs": list(problems),
                 "greedy_throughput": greedy_tp, "methods": methods}
    for label, ths in (("table2", THRESHOLDS), ("table2_scaled", tuple(args.extra_thresholds))):
        if not ths:
            continue
        print(f"\n{'Table 2' if label == 'table2' else 'Table 2 at thresholds our test set reaches'} — "
              f"samples to reach a geomean improvement over greedy+FIX on {len(problems)} test graphs "
              f"(mcm-36, budget {args.samples}); (x) = RL-from-scratch samples / method samples")
        print(f"{'Method':<15}" + "".join(f"{'>= ' + format(t, '.2f') + 'x':>16}" for t in ths))
        table = {}
        for m in methods:
            row = {t: first_reach(geo[m], t) for t in ths}
            table[m] = row
            cells = []
            for t in ths:
                s, ref = row[t], (first_reach(geo["rl"], t) if "rl" in methods else None)
                cells.append("N.A." if s is None else f"{s}" if ref is None else f"{s} ({ref / s:.2f}x)")
            print(f"{LABELS[m]:<15}" + "".join(f"{c:>16}" for c in cells))
        out[label] = {m: {str(t): v for t, v in r.items()} for m, r in table.items()}

    fracs = (0.25, 0.5, 1.0)
    print("\nEqual budgets — geomean best-so-far / greedy")
    print(f"{'Method':<15}" + "".join(f"{'@' + str(int(f * args.samples)):>10}" for f in fracs)
          + f"{'max over graphs':>18}")
    out["equal_budget"] = {}
    for m in methods:
        vals = [float(geo[m][int(f * args.samples) - 1]) for f in fracs]
        out["equal_budget"][m] = dict(zip([int(f * args.samples) for f in fracs], vals))
        print(f"{LABELS[m]:<15}" + "".join(f"{v:>10.3f}" for v in vals) + f"{curves[m][:, -1].max():>18.3f}")
    for rl in [m for m in ("rl", "rl_repaired", "rl_finetune", "rl_finetune_y") if m in methods]:
        for base in [b for b in ("random", "sa") if b in methods]:
            gain = float(geo[rl][-1] / geo[base][-1] - 1)
            wins = int((curves[rl][:, -1] >= curves[base][:, -1] * (1 - 1e-9)).sum())
            out.setdefault("gains", {})[f"{rl}_vs_{base}"] = {"gain": gain, "graphs_at_or_above": wins}
            print(f"{LABELS[rl]} vs {LABELS[base]} at {args.samples} samples: {gain:+.2%} geomean, "
                  f"at or above on {wins}/{len(problems)} graphs")
    print("\nPer graph, best / greedy at the full budget; bound = 1 / (slowest single op) / greedy, an upper "
          "bound that a method reaching it meets exactly (optimal)")
    print(f"{'graph':<22}{'nodes':>6}{'bound':>8}" + "".join(f"{LABELS[m]:>15}" for m in methods))
    out["per_graph"] = {}
    for i, n in enumerate(problems):
        bound = 1.0 / float(problems[n].time_s.max()) / greedy_tp[n]
        out["per_graph"][n] = {"op_bound": bound, **{m: float(curves[m][i, -1]) for m in methods}}
        print(f"{n:<22}{problems[n].num_nodes:>6}{bound:>8.3f}"
              + "".join(f"{curves[m][i, -1]:>15.3f}" for m in methods))

    # ---------------------------------------------------------------- RL without repair
    nr = {n: cache[key(n, "rl_norepair", args.norepair_samples)] for n in problems}
    tot_valid = sum(r["raw_valid_samples"] for r in nr.values())
    print(f"\nRL without repair on mcm-36: {tot_valid} valid partitions in "
          f"{args.norepair_samples * len(nr)} samples ({args.norepair_samples} per graph, {len(nr)} graphs)")
    out["rl_norepair"] = {"samples_per_graph": args.norepair_samples, "valid": tot_valid,
                          "per_graph": {n: r["raw_valid_samples"] for n, r in nr.items()}}

    out["small"] = small_report()
    (RESULTS / "mcm.json").write_text(json.dumps(out, indent=1))
    print(f"\nwrote {RESULTS / 'mcm.json'}")


if __name__ == "__main__":
    main()
