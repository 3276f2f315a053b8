"""GDP-batch against GDP-one (Table 2 analogue), the superposition ablation, and held-out fine-tuning and
zero-shot (spec §5, §9.2, §9.4, §9.5; issue 18).

    python bench/gdp/gdp_batch.py [--seeds 0,1,2] [--time-per-graph 120] [--workers 2] [--finetune-iters 40]
                              [--parts batch,nosup,heldout] [--fresh]

The budgets were fixed before any of these runs was looked at:

* **batch** (Table 2): one policy trained on the paper's "Batch 2" (Appendix Table 3: inception-v3,
  amoebanet, rnnlm-2, gnmt-2, txl-2, wavenet-2x18) for ``--time-per-graph`` x 6 wall seconds per seed,
  the total that GDP-one spends on those six graphs one at a time (``bench/gdp/gdp.py``, 120 s each). Per
  graph it reports best-seen and the greedy policy's placement, and the speed-up of GDP-batch's
  best-seen over GDP-one's, ``T_one / T_batch - 1`` (paper Table 2: 0 to +15 %, -5 % on AmoebaNet).
* **nosup**: the same batch, budget and seeds with parameter superposition off (Eq. 4 removed); the
  ablation's number is ``T_nosup / T_batch - 1`` per graph and its geomean (paper: +6.5 %).
* **heldout**: one policy pre-trained (seed 0) on six graphs, none of them a target (inception-v3,
  amoebanet, gnmt-2, wavenet-2x18, rnnlm-4, txl-4: the paper holds out depth variants of trained
  families), for 6 x ``--time-per-graph`` seconds; then on each held-out target (rnnlm-2, txl-2)
  **zero-shot** (the pre-trained policy's greedy placement, no sample drawn) and **fine-tuned** for
  ``--finetune-iters`` PPO iterations (< 50 steps, as the paper's "< 50 steps") per seed, reported as
  best-seen and greedy with their wall time, against GDP-one and the fast placers.

GDP-one and the fast placers are read from ``bench/gdp/gdp.py``'s cache (``gdp_runs.json``) at the current
code version: run ``bench/gdp/gdp.py --graphs <Batch 2> --methods
human,metis,m-topo,m-etf,m-sct,random,gdp-one``
first (this script refuses to report a comparison it has no runs for). Runs are cached in
``bench/gdp/results/gdp_batch_runs.json`` keyed by part, seed, budget and the code version; each records
its commit and command. Writes ``bench/gdp/results/gdp_batch.json``.
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
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BATCH2 = ("inception-v3", "amoebanet", "rnnlm-2", "gnmt-2", "txl-2", "wavenet-2x18")
PRETRAIN = ("inception-v3", "amoebanet", "gnmt-2", "wavenet-2x18", "rnnlm-4", "txl-4")
TARGETS = ("rnnlm-2", "txl-2")
PAPER_TABLE2 = {"rnnlm-2": 0.0, "gnmt-2": 0.0, "txl-2": 0.076, "inception-v3": 0.0, "amoebanet": -0.05,
                "wavenet-2x18": 0.15}
PAPER_SUPERPOSITION = 0.065
PARTS = ("batch", "nosup", "heldout")


def train_task(names: list[str], seed: int, time_s: float | None, iterations: int | None,
               policy: dict | None, init_state: dict | None, keep_state: bool, machine_name: str) -> dict:
    """One PPO run on ``names`` (a Ray task, one CPU): best-seen and greedy per graph."""
    import torch

    torch.set_num_threads(1)
    from gdp import build

    from archplace.algorithms.rl.gdp_ppo import gdp_train

    graphs = [build(n, machine_name)[2] for n in names]
    t0 = time.perf_counter()
    run = gdp_train(graphs, time_limit_s=time_s, iterations=iterations, seed=seed, policy=policy,
                    init_state=init_state, keep_state=keep_state)
    out = {"graphs": names, "seed": seed, "time_s": time_s, "iterations_budget": iterations,
           "policy": policy or {}, "best_step_time_s": run.best_step_time_s,
           "greedy_step_time_s": [t if v else float("inf") for t, v in zip(run.greedy_step_time_s,
                                                                            run.greedy_valid)],
           "iterations": run.iterations, "samples": run.samples, "wall_s": time.perf_counter() - t0,
           "commit": git_state()["commit"], "command": command()}
    if keep_state:
        out["state"] = run.state
    return out


def geomean(x) -> float:
    return float(np.exp(np.mean(np.log(np.asarray(x, dtype=float)))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--time-per-graph", type=float, default=120.0)
    ap.add_argument("--finetune-iters", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--machine", default="p100-pcie", choices=("p100-pcie", "v100-nvlink"))
    ap.add_argument("--cache", default=str(RESULTS / "gdp_batch_runs.json"))
    ap.add_argument("--one-cache", default=str(RESULTS / "gdp_runs.json"), help="bench/gdp/gdp.py's cache")
    ap.add_argument("--out", default=str(RESULTS / "gdp_batch.json"))
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    load = os.getloadavg()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    parts = [p for p in args.parts.split(",") if p]
    if set(parts) - set(PARTS):
        raise SystemExit(f"--parts: unknown {sorted(set(parts) - set(PARTS))}; allowed: {list(PARTS)}")
    if args.finetune_iters >= 50:
        raise SystemExit(f"--finetune-iters is {args.finetune_iters}; the paper's fine-tuning is < 50 steps")

    import ray
    from gdp import CODE

    from archplace.algorithms.rl.mcm_ppo import save_state

    version = code_version(*CODE["gdp-one"])
    fast_version = code_version(*CODE["human"])
    cache_path = Path(args.cache)
    cache = {} if args.fresh or not cache_path.exists() else json.loads(cache_path.read_text())
    T = args.time_per_graph

    def save():
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "state"}
                                   for k, v in cache.items()}))
        tmp.replace(cache_path)

    def key(part: str, seed: int, extra: str = "") -> str:
        return f"{part}|{seed}|{T}|{extra}|{args.machine}|{version}"

    jobs: dict[str, tuple] = {}
    if "batch" in parts:
        jobs.update({key("batch", s): (list(BATCH2), s, T * len(BATCH2), None, None) for s in seeds})
    if "nosup" in parts:
        jobs.update({key("nosup", s): (list(BATCH2), s, T * len(BATCH2), None, {"superposition": False})
                     for s in seeds})
    pre_key = key("pretrain", 0)
    weights = RESULTS / "gdp_pretrained_heldout.npz"
    need_pre = "heldout" in parts and (pre_key not in cache or not weights.exists())
    todo = {k: v for k, v in jobs.items() if k not in cache}
    ft_keys = {key("finetune", s, t): (t, s) for t in TARGETS for s in seeds} if "heldout" in parts else {}
    zs_keys = {key("zeroshot", 0, t): t for t in TARGETS} if "heldout" in parts else {}
    print(f"{len(jobs) + len(ft_keys) + len(zs_keys) + ('heldout' in parts)} runs, "
          f"{len(todo) + need_pre + sum(k not in cache for k in (*ft_keys, *zs_keys))} to do "
          f"(code version {version})", flush=True)
    t0 = time.perf_counter()
    if todo or need_pre or any(k not in cache for k in (*ft_keys, *zs_keys)):
        ray.init(num_cpus=max(1, args.workers), include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parent)}})
        task = ray.remote(num_cpus=1, max_retries=0)(train_task)
        pending = {}
        if need_pre:
            pending[task.remote(list(PRETRAIN), 0, T * len(PRETRAIN), None, None, None, True,
                                args.machine)] = pre_key
        for k, (names, s, ts, its, pol) in todo.items():
            pending[task.remote(names, s, ts, its, pol, None, False, args.machine)] = k

        def finish(k, r):
            cache[k] = r
            if k == pre_key:
                save_state(weights, r["state"], graphs=list(PRETRAIN), seed=0, time_s=T * len(PRETRAIN),
                           samples=r["samples"], code_version=version, machine=args.machine)
            save()
            print(f"[{time.perf_counter() - t0:6.0f} s] {k.split('|')[0]} seed {r['seed']} "
                  f"{','.join(r['graphs'])}: best "
                  + ", ".join(f"{t * 1e3:.1f}" for t in r["best_step_time_s"])
                  + " ms, greedy " + ", ".join(f"{t * 1e3:.1f}" for t in r["greedy_step_time_s"])
                  + f" ms ({r['iterations']} iterations, {r['wall_s']:.0f} s)", flush=True)

        def drain(pend):
            while pend:
                done, _ = ray.wait(list(pend), num_returns=1)
                k = pend.pop(done[0])
                finish(k, ray.get(done[0], timeout=600))
                if k == pre_key:  # the held-out runs start once the pre-trained weights exist
                    start_heldout(pend)

        def start_heldout(pend):
            from archplace.algorithms.rl.mcm_ppo import load_state

            state = load_state(weights)[0]
            ref = ray.put(state)
            for k, t in zs_keys.items():
                if k not in cache:
                    pend[task.remote([t], 0, None, 0, None, ref, False, args.machine)] = k
            for k, (t, s) in ft_keys.items():
                if k not in cache:
                    pend[task.remote([t], s, None, args.finetune_iters, None, ref, False, args.machine)] = k

        if "heldout" in parts and not need_pre:
            start_heldout(pending)
        drain(pending)
        ray.shutdown()

    # ------------------------------------------------------------------------------------------ report
    one_cache = json.loads(Path(args.one_cache).read_text()) if Path(args.one_cache).exists() else {}

    def one(g: str, s: int) -> dict | None:
        return one_cache.get(f"{g}|gdp-one|{s}|{T}|{args.machine}|{version}")

    def fast(g: str, m: str) -> float:
        r = one_cache.get(f"{g}|{m}|0|{args.machine}|{fast_version}")
        return float("nan") if r is None else (r["step_time_s"] if r["valid"] else float("inf"))

    out: dict = {**git_state(), "command": command(), "machine": machine(load), "code_version": version,
                 "gpu_machine": args.machine, "seeds": seeds, "time_per_graph_s": T,
                 "finetune_iterations": args.finetune_iters, "batch2": list(BATCH2),
                 "pretrain_graphs": list(PRETRAIN), "targets": list(TARGETS)}

    def ms(t: float) -> str:
        return f"{t * 1e3:8.1f}" if np.isfinite(t) else ("   (none)" if np.isnan(t) else " invalid")

    def mean_over(rs, field, gi):
        v = [r[field][gi] for r in rs]
        return float(np.mean(v)) if all(np.isfinite(v)) else float("inf")

    missing_one = [g for g in BATCH2 + TARGETS for s in seeds if one(g, s) is None]
    if missing_one:
        print(f"\nGDP-one runs missing at code version {version} for {sorted(set(missing_one))}: run "
              f"bench/gdp/gdp.py --graphs {','.join(BATCH2)} --methods gdp-one (and the fast placers) first")
    if "batch" in parts or "nosup" in parts:
        table = {}
        print(f"\nTable 2 analogue: Batch 2 in one policy for {T * len(BATCH2):g} s per seed vs GDP-one "
              f"{T:g} s per graph; step time (ms), best-seen mean over seeds {seeds} [greedy policy]")
        print(f"{'graph':<14}{'GDP-one':>20}{'GDP-batch':>20}{'no superposition':>20}"
              f"{'batch vs one':>14}{'paper':>8}{'superposition':>15}")
        sp_one, sp_sup = [], []
        for gi, g in enumerate(BATCH2):
            ones = [one(g, s) for s in seeds]
            t_one = float(np.mean([r["step_time_s"] for r in ones])) if all(ones) else float("nan")
            g_one = float(np.mean([r["greedy_step_time_s"] for r in ones])) if all(ones) else float("nan")
            row = {"gdp-one": {"best": t_one, "greedy": g_one}}
            cells = f"{ms(t_one)} [{ms(g_one).strip()}]".rjust(20)
            for part in ("batch", "nosup"):
                rs = [cache.get(key(part, s)) for s in seeds]
                if part in parts and all(rs):
                    tb, tg = mean_over(rs, "best_step_time_s", gi), mean_over(rs, "greedy_step_time_s", gi)
                    row[part] = {"best": tb, "greedy": tg,
                                 "per_seed": [r["best_step_time_s"][gi] for r in rs],
                                 "samples": [r["samples"] for r in rs],
                                 "iterations": [r["iterations"] for r in rs]}
                    cells += f"{ms(tb)} [{ms(tg).strip()}]".rjust(20)
                else:
                    cells += f"{'—':>20}"
            b = row.get("batch", {}).get("best", float("nan"))
            vs_one = t_one / b - 1 if np.isfinite(t_one) and np.isfinite(b) else float("nan")
            ns = row.get("nosup", {}).get("best", float("nan"))
            sup = ns / b - 1 if np.isfinite(ns) and np.isfinite(b) else float("nan")
            if np.isfinite(vs_one):
                sp_one.append(t_one / b)
            if np.isfinite(sup):
                sp_sup.append(ns / b)
            row.update(speedup_batch_over_one=vs_one, superposition_gain=sup, paper=PAPER_TABLE2[g])
            table[g] = row
            print(f"{g:<14}{cells}{vs_one:>+14.1%}{PAPER_TABLE2[g]:>+8.1%}{sup:>+15.1%}")
        out["table2"] = table
        if sp_one:
            out["batch_over_one_geomean"] = geomean(sp_one) - 1
            print(f"  GDP-batch over GDP-one, geomean on {len(sp_one)} graphs: {geomean(sp_one) - 1:+.1%}")
        if sp_sup:
            out["superposition_geomean"] = geomean(sp_sup) - 1
            print(f"  superposition (no-superposition time / with - 1), geomean on {len(sp_sup)} graphs: "
                  f"{geomean(sp_sup) - 1:+.1%} (paper: {PAPER_SUPERPOSITION:+.1%})")
    if "heldout" in parts and pre_key in cache:
        pre = cache[pre_key]
        out["pretrain"] = {k: v for k, v in pre.items() if k != "state"}
        print(f"\nHeld out: pre-trained on {', '.join(PRETRAIN)} for {pre['wall_s']:.0f} s "
              f"({pre['iterations']} iterations, seed 0); on each target: zero-shot greedy, "
              f"fine-tuned {args.finetune_iters} iterations (mean over seeds {seeds})")
        print(f"{'target':<10}{'human':>9}{'best fast':>10}{'GDP-one':>10}{'(s)':>6}{'zero-shot':>10}"
              f"{'fine-tuned':>11}{'[greedy]':>10}{'(s)':>6}")
        held = {}
        for t in TARGETS:
            zs = cache.get(key("zeroshot", 0, t))
            fts = [cache.get(key("finetune", s, t)) for s in seeds]
            ones = [one(t, s) for s in seeds]
            t_one = float(np.mean([r["step_time_s"] for r in ones])) if all(ones) else float("nan")
            s_one = float(np.mean([r["search_s"] for r in ones])) if all(ones) else float("nan")
            best_fast = min(fast(t, m) for m in ("human", "metis", "m-topo", "m-etf", "m-sct"))
            z = zs["greedy_step_time_s"][0] if zs else float("nan")
            fb = mean_over(fts, "best_step_time_s", 0) if all(fts) else float("nan")
            fg = mean_over(fts, "greedy_step_time_s", 0) if all(fts) else float("nan")
            fw = float(np.mean([r["wall_s"] for r in fts])) if all(fts) else float("nan")
            held[t] = {"human": fast(t, "human"), "best_fast": best_fast, "gdp_one": t_one,
                       "gdp_one_search_s": s_one, "zero_shot_greedy": z, "finetune_best": fb,
                       "finetune_greedy": fg, "finetune_wall_s": fw,
                       "finetune_per_seed": [r["best_step_time_s"][0] for r in fts] if all(fts) else None}
            print(f"{t:<10}{ms(fast(t, 'human'))}{ms(best_fast):>10}{ms(t_one):>10}{s_one:6.0f}{ms(z):>10}"
                  f"{ms(fb):>11}{ms(fg):>10}{fw:6.0f}")
        out["heldout"] = held
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
