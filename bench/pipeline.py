"""What the pipeline DQN adds, at equal budgets: Auto-MAP's Table 7 cases and larger unpruned ones.

Budgets and settings, fixed in this docstring before any case was run (issue 16):

* **budget**: ``--plans`` = 250 completed plans per search (one simulator call each), i.e.
  250 × (K − 1) environment steps for the DQN, for every case, method and seed;
* **seeds**: 0, 1, 2; the DQN uses the YAML's settings (``tune_configs/pipeline_dqn.yaml``) unchanged;
* **cases**: the 12 Table 7 cases (bert-48, t5-base, t5-3b, t5-11b on V100 clusters A, B, C; K = servers;
  the pruned candidates of radius 3, the agent's action space there) and three cases no enumeration
  can reach, over every pivot (unpruned): bert-48 on 32 GPUs in 8 stages, t5-3b on 64 GPUs in 8
  stages, bert-48 on 64 GPUs in 16 stages.

Per case it reports (gaps relative to the exact optimum over the same action space):

* ``dp``: the exact DP (:func:`~archplace.algorithms.solvers.pipeline_dp.solve_dp`) over that space, and
  its wall time; for Table 7 also the unpruned DP optimum (the best plan the pruning hides);
* ``dqn``: the best plan among the DQN's (best-seen) and the final greedy-policy plan (ε = 0), with wall
  time; mean, min and max over the seeds;
* ``nolook``: the same DQN without the lookahead feature (the paper's three features only);
* ``n3``: the same DQN with 3-step returns (issue 16 item 5), truncated at the episode's end
  (:mod:`archplace.algorithms.rl.nstep_buffer`; RLlib's own buffer redraws every transition with fewer
  than n steps left, so on 2-3 stages it never returned a batch);
* ``argmax``: the lookahead feature's argmax, one plan, no network (the DQN's own input);
* ``argmax-eps``: the best of 250 rollouts of that rule with each cut random with probability 0.1;
* ``random``: the best of 250 uniformly random valid plans, and ``random-wall``: of as many as fit in
  the DQN's wall time (equal wall time).

What the committed results cover: ``bench/results/pipeline.txt`` (commit 1422596, DQNs replaying from
RLlib's unseeded buffer): every method and seed on Table 7, n3 only on its 4-stage cases (RLlib's
n-step, see above); on the large cases dqn, nolook, argmax, argmax-eps and random for all seeds, no n3,
and random at the DQN's wall time only for bert-48 on 32 GPUs, seeds 0 and 1 (2 cores: a large-case
DQN search takes 4-18 min). ``bench/results/pipeline_nstep.txt`` (commit 9a14aa2): dqn and n3 with the
truncated n-step on all of Table 7 (``--cases table7 --methods dqn,n3 --no-random-wall --cache
bench/results/pipeline_nstep_runs.json --out bench/results/pipeline_nstep``). The table names what is
missing.

Each (case, seed, method) runs as one Ray task on one CPU, two at a time on this machine; results are
cached in ``--cache`` under a key that includes the hash of the code they depend on, so an interrupted
run resumes and a code change re-runs. Writes ``bench/results/pipeline.{json,txt}``.

    python bench/pipeline.py                                  # everything (about 1 h on 2 cores)
    python bench/pipeline.py --cases table7 --methods dqn     # a subset
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _meta import code_version, command, git_state, machine

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("bert-48", "t5-base", "t5-3b", "t5-11b")
SEEDS = (0, 1, 2)
PLANS = 250
DQN_VARIANTS = {"dqn": ({}, {}), "nolook": ({}, {"lookahead": False}), "n3": ({"n_step": 3}, {})}
CODE = ("archplace.algorithms.rl", "archplace.algorithms.solvers.pipeline_dp",
        "archplace.algorithms.solvers.pipeline_exact", "archplace.simulators.pipeline",
        "archplace.hardware.presets")


@dataclass(frozen=True)
class Case:
    model: str
    servers: int          # 8 V100s each
    stages: int
    pruned: bool          # Table 7: radius-3 candidates; large cases: every pivot
    label: str

    @property
    def key(self) -> str:
        return f"{self.model}|{self.servers}x8|K{self.stages}|{'pruned' if self.pruned else 'all'}"


def cases(which: str) -> list[Case]:
    t7 = [Case(m, s, s, True, f"{m} {c}") for m in MODELS for c, s in (("A", 2), ("B", 3), ("C", 4))]
    large = [Case("bert-48", 4, 8, False, "bert-48 32 GPUs"), Case("t5-3b", 8, 8, False, "t5-3b 64 GPUs"),
             Case("bert-48", 8, 16, False, "bert-48 64 GPUs")]
    return {"table7": t7, "large": large, "all": t7 + large}[which]


def _setup(case: Case):
    from archplace.algorithms.rl.pipeline_env import PipelineCutEnv
    from archplace.algorithms.rl.pipeline_plan import model_profile
    from archplace.algorithms.solvers.pipeline_exact import candidate_pivots
    from archplace.hardware.presets import v100_servers

    prof = model_profile(case.model)
    cl = v100_servers(case.servers)
    cand = candidate_pivots(prof, cl, case.stages, 3 if case.pruned else None)
    env_opts = {"max_stages": 16} if case.stages > 8 else {}
    env = PipelineCutEnv({"profile": prof, "cluster": cl, "num_stages": case.stages, "candidates": cand,
                          **env_opts})
    return prof, cl, cand, env, env_opts


def run_dp(case: Case) -> dict:
    from archplace.algorithms.solvers.pipeline_dp import solve_dp

    prof, cl, cand, env, _ = _setup(case)
    t0 = time.perf_counter()
    dp = solve_dp(prof, cl, case.stages, candidates=cand if case.pruned else None)
    rec = {"length_s": dp.length_s, "oom": bool(dp.oom), "optimal": bool(dp.optimal),
           "cuts": dp.cuts.tolist(), "wall_s": time.perf_counter() - t0, "actions": len(env.pivots),
           "candidates_per_cut": [len(c) for c in cand.per_cut], "ops": prof.num_ops}
    if case.pruned:
        t0 = time.perf_counter()
        full = solve_dp(prof, cl, case.stages)
        rec["unpruned"] = {"length_s": full.length_s, "oom": bool(full.oom), "optimal": bool(full.optimal),
                           "wall_s": time.perf_counter() - t0}
    return rec


def run_method(case: Case, seed: int, method: str, plans: int, random_wall: bool = True) -> dict:
    """One search of ``plans`` simulator calls; DQN variants also time the equal-wall random baseline."""
    import torch

    from archplace.algorithms.rl.pipeline_rules import lookahead_rule, random_plans

    torch.set_num_threads(1)
    prof, cl, cand, env, env_opts = _setup(case)
    if method in DQN_VARIANTS:
        from archplace.algorithms.rl.pipeline_dqn import dqn_search

        dqn, extra = DQN_VARIANTS[method]
        r = dqn_search(prof, cl, case.stages, plans * (case.stages - 1), seed=seed, dqn=dqn or None,
                       radius=3 if case.pruned else None, env_options={**env_opts, **extra})
        rec = {"best_length_s": r.best_length_s if not r.best_oom else None,
               "greedy_length_s": r.greedy_length_s if not r.greedy_oom else None,
               "plans": r.plans, "env_steps": r.env_steps, "wall_s": r.wall_s,
               "history": [float(x) for x in r.history]}
        if method == "dqn" and random_wall:   # random search for the same wall time as this DQN took
            rw = random_plans(env, wall_s=r.wall_s, seed=seed)
            rec["random_wall"] = {"best_length_s": rw.best_length_s if not rw.best_oom else None,
                                  "plans": rw.plans, "wall_s": rw.wall_s}
        return rec
    if method == "argmax":
        r = lookahead_rule(env, 1)
    elif method == "argmax-eps":
        r = lookahead_rule(env, plans, epsilon=0.1, seed=seed)
    elif method == "random":
        r = random_plans(env, plans, seed=seed)
    else:
        raise ValueError(f"unknown method {method!r}")
    return {"best_length_s": r.best_length_s if not r.best_oom else None, "plans": r.plans,
            "wall_s": r.wall_s, "history": [float(x) for x in r.history]}


def _gap(x, opt):
    return None if x is None else x / opt - 1.0


def _stats(vals: list) -> str:
    if not vals:
        return "-"
    if any(v is None for v in vals):
        return "OOM" if all(v is None for v in vals) else f"{sum(v is None for v in vals)} OOM"
    v = 100 * np.asarray(vals)
    return f"{v.mean():+.2f}% [{v.min():+.2f},{v.max():+.2f}]" if len(v) > 1 else f"{v[0]:+.2f}%"


def summarise(case: Case, dp: dict, runs: dict[str, dict[int, dict]]) -> dict:
    opt = dp["length_s"]
    out: dict = {"case": case.label, "key": case.key, "stages": case.stages, "gpus": 8 * case.servers,
                 "pruned": case.pruned, "dp": dp}
    if dp["oom"]:
        out["infeasible"] = True
        return out
    for m, per_seed in runs.items():
        seeds = sorted(per_seed)
        row = {"seeds": seeds, "best_gap": [_gap(per_seed[s]["best_length_s"], opt) for s in seeds],
               "wall_s": [per_seed[s]["wall_s"] for s in seeds],
               "plans": [per_seed[s]["plans"] for s in seeds]}
        if m in DQN_VARIANTS:
            row["greedy_gap"] = [_gap(per_seed[s]["greedy_length_s"], opt) for s in seeds]
            row["env_steps"] = [per_seed[s]["env_steps"] for s in seeds]
        if m == "dqn":   # seeds run with --no-random-wall have no equal-wall random search
            rw = [per_seed[s]["random_wall"] for s in seeds if "random_wall" in per_seed[s]]
            row["random_wall_seeds"] = [s for s in seeds if "random_wall" in per_seed[s]]
            row["random_wall_gap"] = [_gap(r["best_length_s"], opt) for r in rw]
            row["random_wall_plans"] = [r["plans"] for r in rw]
        # plans until within 1% of the optimum (None: never)
        row["plans_to_1pct"] = []
        for s in seeds:
            h = np.asarray(per_seed[s]["history"])
            hit = np.flatnonzero(h <= opt * 1.01)
            row["plans_to_1pct"].append(int(hit[0]) + 1 if len(hit) else None)
        out[m] = row
    return out


def table(rows: list[dict], methods: list[str]) -> str:
    cols = []
    for m in methods:
        cols += [f"{m} best"] + ([f"{m} greedy"] if m in DQN_VARIANTS else [])
        if m == "dqn":
            cols.append("random@wall")
    head = (f"{'case':17s} {'K':>2s} {'act':>5s} {'L* (s)':>8s} {'dp s':>6s} {'dqn s':>6s} "
            + " ".join(f"{c:>27s}" for c in cols))
    lines = [head, "-" * len(head)]
    for r in rows:
        dp = r["dp"]
        base = f"{r['case']:17s} {r['stages']:>2d} {dp['actions']:>5d} "
        if r.get("infeasible"):
            lines.append(base + f"{'OOM':>8s}  no plan fits in 32 GiB")
            continue
        cells = []
        for m in methods:
            row = r.get(m)
            if row is None:
                cells += ["-"] + (["-"] if m in DQN_VARIANTS else []) + (["-"] if m == "dqn" else [])
                continue
            cells.append(_stats(row["best_gap"]))
            if m in DQN_VARIANTS:
                cells.append(_stats(row["greedy_gap"]))
            if m == "dqn":
                cells.append(_stats(row["random_wall_gap"]))
        dqn_s = f"{np.mean(r['dqn']['wall_s']):6.0f}" if "dqn" in r else f"{'-':>6s}"
        lines.append(base + f"{dp['length_s']:8.4f} {dp['wall_s']:6.2f} {dqn_s} "
                     + " ".join(f"{c:>27s}" for c in cells))
    all_seeds = sorted({s for r in rows for m in methods if m in r for s in r[m]["seeds"]})
    for r in rows:
        for m in methods:
            if m in r and m != "argmax" and r[m]["seeds"] != all_seeds:   # argmax: deterministic
                lines.append(f"{m} on {r['case']}: seeds {r[m]['seeds']} only")
        d = r.get("dqn")
        if d and d["random_wall_seeds"] and d["random_wall_seeds"] != d["seeds"]:
            lines.append(f"random@wall on {r['case']}: seeds {d['random_wall_seeds']} only "
                         f"(the others ran with --no-random-wall)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="all", choices=["table7", "large", "all"])
    ap.add_argument("--models", default=None, help="only these models (comma-separated)")
    ap.add_argument("--methods", default="dqn,nolook,n3,argmax,argmax-eps,random")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--plans", type=int, default=PLANS, help="simulator calls per search (fixed: 250)")
    ap.add_argument("--cpus", type=int, default=2, help="Ray tasks at a time (one CPU each)")
    ap.add_argument("--no-run", action="store_true",
                    help="only tabulate what the cache holds ('-' for the rest)")
    ap.add_argument("--no-random-wall", action="store_true",
                    help="skip the equal-wall-time random search after each DQN (it doubles a DQN task)")
    ap.add_argument("--cache", default=str(RESULTS / "pipeline_eval_runs.json"))
    ap.add_argument("--out", default=str(RESULTS / "pipeline"))
    args = ap.parse_args()
    load0 = os.getloadavg()
    methods = args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    todo_cases = [c for c in cases(args.cases) if args.models is None or c.model in args.models.split(",")]
    version = code_version(*CODE)
    cache_path = Path(args.cache)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    dp_task = ray.remote(num_cpus=1, max_retries=0)(run_dp)
    m_task = ray.remote(num_cpus=1, max_retries=0)(run_method)
    pending: dict = {}
    for case in todo_cases:
        k = f"{version}|{case.key}|dp"
        if k not in cache:
            pending[dp_task.remote(case)] = k
    dps = {}
    # DP first: a case whose every plan runs out of memory has nothing for the searches to find
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=3600)
        for ref in done:
            k = pending.pop(ref)
            cache[k] = {**ray.get(ref, timeout=60), "commit": git_state()["commit"], "command": command()}
            cache_path.write_text(json.dumps(cache))
    for case in todo_cases:
        dps[case] = cache[f"{version}|{case.key}|dp"]
    for case in todo_cases:
        if dps[case]["oom"]:
            continue
        for seed in seeds:
            for m in methods:
                if m == "argmax" and seed != seeds[0]:
                    continue  # deterministic
                k = f"{version}|{case.key}|seed{seed}|{m}|plans{args.plans}"
                if k not in cache and not args.no_run:
                    pending[m_task.remote(case, seed, m, args.plans, not args.no_random_wall)] = k
    t0 = time.perf_counter()
    n = len(pending)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=7200)
        for ref in done:
            k = pending.pop(ref)
            cache[k] = {**ray.get(ref, timeout=60), "commit": git_state()["commit"], "command": command()}
            cache_path.write_text(json.dumps(cache))
            print(f"[{n - len(pending)}/{n} {time.perf_counter() - t0:.0f} s] {k.split('|', 1)[1]}: "
                  f"wall {cache[k]['wall_s']:.1f} s", flush=True)
    ray.shutdown()

    rows = []
    for case in todo_cases:
        runs: dict[str, dict[int, dict]] = {}
        for m in methods:
            for seed in seeds:
                k = f"{version}|{case.key}|seed{seed}|{m}|plans{args.plans}"
                if k in cache:
                    runs.setdefault(m, {})[seed] = cache[k]
        rows.append(summarise(case, dps[case], runs))
    txt = table(rows, methods)
    feas = [r for r in rows if not r.get("infeasible")]

    def count(m, key, tol=0.01):
        vals = [g for r in feas if m in r for g in r[m][key]]
        return sum(g is not None and g <= tol for g in vals), len(vals)

    lines = [f"\n{args.plans} simulator calls per search; seeds {seeds}; gaps to the exact optimum over the "
             "agent's action space, mean [min, max] over seeds. Searches within 1% of the optimum:"]
    for m in methods:
        if any(m in r for r in feas):
            a, b = count(m, "best_gap")
            extra = ""
            if m in DQN_VARIANTS:
                c, d = count(m, "greedy_gap")
                extra = f"; greedy policy {c}/{d}"
            lines.append(f"  {m:10s} best {a}/{b}{extra}")
    if any("dqn" in r for r in feas):
        a, b = count("dqn", "random_wall_gap")
        lines.append(f"  random at the DQN's wall time: {a}/{b}")
    summary = "\n".join(lines)
    print("\n" + txt + summary)
    Path(args.out + ".txt").write_text(txt + summary + "\n")
    Path(args.out + ".json").write_text(json.dumps({
        "git": git_state(), "command": command(), "machine": machine(load0), "code_version": version,
        "plans": args.plans, "seeds": seeds, "methods": methods, "rows": rows}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
