"""What the pipeline DQN adds, at equal budgets: Auto-MAP's Table 7 cases and larger unpruned ones.

**Budgets in cost-model evaluations (issue 31; this section supersedes the budget below).** The DQN's
"250 simulator calls" left out its features, which score the cost model at every candidate pivot of
every step. Every method now gets the same budget in cost-model evaluations, counted as the env counts
them (:mod:`archplace.algorithms.rl.pipeline_env`): one per completed plan scored by the simulator
(``sim_calls``) and one per open pivot whose feature row is scored (``feature_calls``). Fixed before
any case was run: per case, ``budget = (--plans + 1) x plan_cost`` with ``plan_cost`` = the sum of the
cuts' candidate windows + 1 (the most one episode can cost), i.e. at least 250 agent plans and the
greedy rollout's reserve; methods:

* ``dqn``: the DQN at that budget (it stops there and says so); ``seen`` is the best plan it evaluated,
  ``greedy`` the final ε = 0 plan, ``best`` the better of the two;
* ``dqn-off``: the learning-off control, the same search with no Q update (the seeded initial network);
* ``argmax``: one rollout of the lookahead argmax (its evaluations reported, far below the budget);
* ``argmax-eps``: rollouts of that rule, each cut random with probability 0.1, until the budget;
* ``random``: uniformly random valid plans, one simulator call each, until the budget (so many more
  plans than the agent completes);
* ``dp``: the exact DP, unbudgeted, with its own spending: ``plan_evaluations`` (complete plans the
  simulator scored) and ``dp_states`` (per-stage costs).

Reported per case: each method's L / L* (time per iteration over the exact optimum of the agent's action
space), mean [min, max] over seeds, and its evaluations. ``nolook`` / ``n3`` still run on request. The
equal-wall-time random search is gone (wall time is no budget). The issue-31 run:
``--cases table7 --methods dqn,dqn-off,argmax,argmax-eps,random --out bench/results/pipeline_evals
--cache bench/automap/results/pipeline_evals_runs.json`` (the large cases take 4-18 min per DQN search on
this shared 2-core machine and were left out). Committed: ``bench/results/pipeline_evals.{txt,json}``,
all 11 feasible Table 7 cases (t5-11b / A: no plan fits), seeds 0, 1, 2, every method, at commit
66f5c2a in one invocation (143 tasks, 26 min; each task's load average in ``_runs.json``). The same
run at the code before 66f5c2a (whose only change is that an exhausted env scores nothing more) gave
identical plans and counts. Every pruned Table 7 episode scores its whole windows, so the DQN completes
exactly 250 plans and spends exactly its budget; random search completes one plan per evaluation.

The budget before issue 31:

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

What the committed results cover: ``bench/automap/results/pipeline.txt`` (commit 1422596, DQNs replaying from
RLlib's unseeded buffer): every method and seed on Table 7, n3 only on its 4-stage cases (RLlib's
n-step, see above); on the large cases dqn, nolook, argmax, argmax-eps and random for all seeds, no n3,
and random at the DQN's wall time only for bert-48 on 32 GPUs, seeds 0 and 1 (2 cores: a large-case
DQN search takes 4-18 min). ``bench/automap/results/pipeline_nstep.txt`` (commit 9a14aa2): dqn and n3 with the
truncated n-step on all of Table 7 (``--cases table7 --methods dqn,n3 --no-random-wall --cache
bench/automap/results/pipeline_nstep_runs.json --out bench/results/pipeline_nstep``). The table names what is
missing.

Each (case, seed, method) runs as one Ray task on one CPU, two at a time on this machine; results are
cached in ``--cache`` under a key that includes the hash of the code they depend on, so an interrupted
run resumes and a code change re-runs. Writes ``bench/results/pipeline.{json,txt}``.

    python bench/automap/pipeline.py                                  # everything (about 1 h on 2 cores)
    python bench/automap/pipeline.py --cases table7 --methods dqn     # a subset

**Op models (issue 30).** ``--op-model roofline|calibrated`` times each op of the V100 graph with
``simulators/gpu_ops.py`` (the V100 at fp16, Auto-MAP's; no V100 measurement exists, so ``calibrated``
scales the H200's efficiencies by peak ratios and says so in ``op_model``) and hands the times to
``profile_from_graph`` as ``op_times``, as ``archplace pipeline --op-model`` does; the cluster (V100
servers, NVLink, 25 Gbps) stays. Without the flag: the profile as before (``model_profile``, the
roofline; ``--op-model roofline`` gives the same times through ``gpu_op_times``). The op model is part of
the cache key and the code version then covers ``gpu_ops`` / ``gpus``. ``--compare OTHER.json`` (a run of
the same cases under another op model) adds per case both optima (cuts, length), whether the DP's cuts
change, the methods' mean gaps under each, their rank order and Kendall's tau-b.

The issue-30 re-run (budgets fixed here before any result was seen): ``--cases table7 --methods
argmax,argmax-eps,random`` with seeds 0, 1, 2 and 250 plans (as above), once per op model; the DQN with
seed 0 only and ``--no-random-wall``, on both op models, only if the cheap runs and the GDP re-run are done
by 13:20 UTC (2 shared cores); no nolook / n3. Results: ``bench/results/pipeline_calibrated_v100*``
(``_roofline`` for the roofline side, ``_runs.json`` the cache).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("bert-48", "t5-base", "t5-3b", "t5-11b")
SEEDS = (0, 1, 2)
PLANS = 250
DQN_VARIANTS = {"dqn": ({}, {}, True), "dqn-off": ({}, {}, False), "nolook": ({}, {"lookahead": False}, True),
                "n3": ({"n_step": 3}, {}, True)}
SAFETY_WALL_S = 3600.0   # outer limit only; a search it stops says so (stopped: safety_wall_s)
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


def op_model_profile(model: str, op_model: str | None):
    """(pipeline profile, op-model note) of a model preset at micro-batch 16 on the V100 (fp16): the
    profile of ``model_profile`` when ``op_model`` is None, else with op times from ``gpu_op_times``."""
    from archplace.algorithms.rl.pipeline_plan import model_profile, training_setup
    from archplace.hardware.presets import V100
    from archplace.simulators.gpu_ops import gpu_op_times
    from archplace.simulators.pipeline import PipelineSetup, profile_from_graph
    from archplace.workloads.models import build_graph

    if op_model is None:
        return model_profile(model), None
    g = build_graph(model, mbs=PipelineSetup().micro_batch)
    fwd = ~g.nodes["is_backward"]
    params = float(g.nodes["weight_bytes"][fwd].sum()) / int(g.meta.get("bytes_per_element", 2))
    times = gpu_op_times(g, V100.spec, dtype=V100.dtype, op_model=op_model)
    return profile_from_graph(g, V100, training_setup(model, params), times.time_s), times.to_dict()


def _setup(case: Case, op_model: str | None = None):
    from archplace.algorithms.rl.pipeline_env import PipelineCutEnv
    from archplace.algorithms.solvers.pipeline_exact import candidate_pivots
    from archplace.hardware.presets import v100_servers

    prof, note = op_model_profile(case.model, op_model)
    cl = v100_servers(case.servers)
    cand = candidate_pivots(prof, cl, case.stages, 3 if case.pruned else None)
    env_opts = {"max_stages": 16} if case.stages > 8 else {}
    env = PipelineCutEnv({"profile": prof, "cluster": cl, "num_stages": case.stages, "candidates": cand,
                          **env_opts})
    return prof, cl, cand, env, env_opts, note


def case_budget(env, plans: int) -> int:
    """The budget of every search on a case, in cost-model evaluations (the docstring's rule)."""
    from archplace.algorithms.rl.pipeline_dqn import plan_cost

    return (plans + 1) * plan_cost(env)


def run_dp(case: Case, op_model: str | None = None) -> dict:
    from archplace.algorithms.solvers.pipeline_dp import solve_dp

    prof, cl, cand, env, _, note = _setup(case, op_model)
    t0 = time.perf_counter()
    dp = solve_dp(prof, cl, case.stages, candidates=cand if case.pruned else None)
    rec = {"length_s": dp.length_s, "oom": bool(dp.oom), "optimal": bool(dp.optimal),
           "cuts": dp.cuts.tolist(), "wall_s": time.perf_counter() - t0, "actions": len(env.pivots),
           "plan_evaluations": dp.plan_evaluations, "dp_states": dp.evaluated,
           "candidates_per_cut": [len(c) for c in cand.per_cut], "ops": prof.num_ops,
           "op_model": note}
    if case.pruned:
        t0 = time.perf_counter()
        full = solve_dp(prof, cl, case.stages)
        rec["unpruned"] = {"length_s": full.length_s, "oom": bool(full.oom), "optimal": bool(full.optimal),
                           "cuts": full.cuts.tolist(), "wall_s": time.perf_counter() - t0,
                           "plan_evaluations": full.plan_evaluations, "dp_states": full.evaluated}
    return rec


def run_method(case: Case, seed: int, method: str, plans: int, op_model: str | None = None) -> dict:
    """One search of :func:`case_budget` cost-model evaluations (``argmax``: one rollout)."""
    import torch

    from archplace.algorithms.rl.pipeline_rules import lookahead_rule, random_plans

    torch.set_num_threads(1)
    prof, cl, cand, env, env_opts, _ = _setup(case, op_model)
    budget = case_budget(env, plans)
    if method in DQN_VARIANTS:
        from archplace.algorithms.rl.pipeline_dqn import dqn_search

        dqn, extra, learning = DQN_VARIANTS[method]
        r = dqn_search(prof, cl, case.stages, budget, seed=seed, dqn=dqn or None,
                       radius=3 if case.pruned else None, env_options={**env_opts, **extra},
                       learning=learning, safety_wall_s=SAFETY_WALL_S)
        return {"best_length_s": r.best_length_s if not r.best_oom else None,
                "greedy_length_s": r.greedy_length_s if not r.greedy_oom else None,
                "seen_length_s": r.best_seen_length_s if not r.best_seen_oom else None,
                "plans": r.plans, "env_steps": r.env_steps, "wall_s": r.wall_s, "budget": budget,
                "sim_calls": r.env_step_calls, "feature_calls": r.feature_calls,
                "greedy_calls": r.greedy_calls,
                "budget_exhausted": r.budget_exhausted, "stopped": r.stopped, "learning": r.learning,
                "history_best": best_points(r.history)}
    if method == "argmax":
        r = lookahead_rule(env, 1)
    elif method == "argmax-eps":
        r = lookahead_rule(env, None, epsilon=0.1, seed=seed, budget=budget)
    elif method == "random":
        r = random_plans(env, seed=seed, budget=budget)
    else:
        raise ValueError(f"unknown method {method!r}")
    return {"best_length_s": r.best_length_s if not r.best_oom else None, "plans": r.plans,
            "wall_s": r.wall_s, "budget": None if method == "argmax" else budget, "sim_calls": r.sim_calls,
            "feature_calls": r.feature_calls, "budget_exhausted": r.budget_exhausted,
            "history_best": best_points(r.history)}


def best_points(history) -> list[list[float]]:
    """The plans at which the best length so far improved, as [plan index, length]: all that
    ``plans_to_1pct`` needs (the first plan within 1% is the first improvement within it), at a few
    dozen numbers a run instead of one per plan (random search scores 100k+ plans at equal evaluations,
    and the full histories made the cache 326 MB)."""
    out, best = [], float("inf")
    for i, x in enumerate(history):
        if not out or float(x) < best:
            best = float(x)
            out.append([i, best])
    return out


def _first_within(r: dict, limit: float) -> int | None:
    """1-based index of the first plan at most ``limit`` long (None: never), from either record form."""
    if "history_best" in r:
        hit = [int(i) for i, x in r["history_best"] if x <= limit]
        return hit[0] + 1 if hit else None
    h = np.asarray(r["history"])
    hit = np.flatnonzero(h <= limit)
    return int(hit[0]) + 1 if len(hit) else None


def _gap(x, opt):
    return None if x is None else x / opt - 1.0


def _stats(vals: list) -> str:
    """L / L* over seeds: mean [min, max] (OOM: no plan that fits)."""
    if not vals:
        return "-"
    if any(v is None for v in vals):
        return "OOM" if all(v is None for v in vals) else f"{sum(v is None for v in vals)} OOM"
    v = 1.0 + np.asarray(vals)
    return f"{v.mean():.4f} [{v.min():.4f},{v.max():.4f}]" if len(v) > 1 else f"{v[0]:.4f}"


def summarise(case: Case, dp: dict, runs: dict[str, dict[int, dict]]) -> dict:
    opt = dp["length_s"]
    out: dict = {"case": case.label, "key": case.key, "stages": case.stages, "gpus": 8 * case.servers,
                 "pruned": case.pruned, "dp": dp}
    if dp["oom"]:
        out["infeasible"] = True
        return out
    for m, per_seed in runs.items():
        seeds = sorted(per_seed)
        rec = [per_seed[s] for s in seeds]
        row = {"seeds": seeds, "best_gap": [_gap(r["best_length_s"], opt) for r in rec],
               "best_ratio": [None if r["best_length_s"] is None else r["best_length_s"] / opt for r in rec],
               "wall_s": [r["wall_s"] for r in rec], "plans": [r["plans"] for r in rec],
               "budget": [r.get("budget") for r in rec], "sim_calls": [r.get("sim_calls") for r in rec],
               "feature_calls": [r.get("feature_calls") for r in rec],
               "evaluations": [r["sim_calls"] + r["feature_calls"] if "sim_calls" in r else None
                               for r in rec],
               "budget_exhausted": [r.get("budget_exhausted") for r in rec]}
        if m in DQN_VARIANTS:
            row["greedy_gap"] = [_gap(r["greedy_length_s"], opt) for r in rec]
            row["seen_gap"] = [_gap(r.get("seen_length_s"), opt) for r in rec]
            row["env_steps"] = [r["env_steps"] for r in rec]
            row["greedy_calls"] = [r.get("greedy_calls") for r in rec]
            row["stopped"] = [r.get("stopped") for r in rec]
        # plans until within 1% of the optimum (None: never)
        row["plans_to_1pct"] = []
        for r in rec:
            row["plans_to_1pct"].append(_first_within(r, opt * 1.01))
        out[m] = row
    return out


def _mean_int(xs: list) -> str:
    xs = [x for x in xs if x is not None]
    return f"{np.mean(xs):,.0f}" if xs else "-"


def table(rows: list[dict], methods: list[str]) -> str:
    """Two blocks: L / L* per method (DQN variants: best-seen and greedy), then evaluations per method
    (simulator calls + feature rows, mean over seeds) against the budget and the DP's own spending."""
    cols = []
    for m in methods:
        cols += [f"{m} seen", f"{m} greedy"] if m in DQN_VARIANTS else [m]
    head = f"{'case':17s} {'K':>2s} {'act':>5s} {'L* (s)':>8s} " + " ".join(f"{c:>25s}" for c in cols)
    lines = ["L / L* (time per iteration over the exact optimum), mean [min, max] over seeds", head,
             "-" * len(head)]
    for r in rows:
        dp = r["dp"]
        base = f"{r['case']:17s} {r['stages']:>2d} {dp['actions']:>5d} "
        if r.get("infeasible"):
            lines.append(base + f"{'OOM':>8s}  no plan fits in 32 GiB")
            continue
        cells = []
        for m in methods:
            row = r.get(m)
            if m in DQN_VARIANTS:
                cells += ([_stats(row["seen_gap"]), _stats(row["greedy_gap"])] if row else ["-", "-"])
            else:
                cells.append(_stats(row["best_gap"]) if row else "-")
        lines.append(base + f"{dp['length_s']:8.4f} " + " ".join(f"{c:>25s}" for c in cells))
    head2 = (f"{'case':17s} {'budget':>10s} {'dp sims':>8s} {'dp states':>10s} "
             + " ".join(f"{m + ' evals (sim)':>26s}" for m in methods))
    lines += ["", "Cost-model evaluations spent (sim + feature rows; in brackets the simulator calls), mean "
              "over seeds", head2, "-" * len(head2)]
    for r in rows:
        if r.get("infeasible"):
            continue
        dp = r["dp"]
        budgets = {b for m in methods if m in r for b in r[m]["budget"] if b is not None}
        cells = []
        for m in methods:
            row = r.get(m)
            cells.append(f"{_mean_int(row['evaluations'])} ({_mean_int(row['sim_calls'])})" if row else "-")
        lines.append(f"{r['case']:17s} {'/'.join(f'{b:,}' for b in sorted(budgets)) or '-':>10s} "
                     f"{dp.get('plan_evaluations', '-'):>8} {dp.get('dp_states', '-'):>10} "
                     + " ".join(f"{c:>26s}" for c in cells))
    all_seeds = sorted({s for r in rows for m in methods if m in r for s in r[m]["seeds"]})
    for r in rows:
        for m in methods:
            if m in r and m != "argmax" and r[m]["seeds"] != all_seeds:   # argmax: deterministic
                lines.append(f"{m} on {r['case']}: seeds {r[m]['seeds']} only")
            if m in r and m in DQN_VARIANTS and any(x != "budget" for x in r[m]["stopped"]):
                lines.append(f"{m} on {r['case']}: stopped {r[m]['stopped']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="all", choices=["table7", "large", "all"])
    ap.add_argument("--models", default=None, help="only these models (comma-separated)")
    ap.add_argument("--methods", default="dqn,dqn-off,argmax,argmax-eps,random")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--plans", type=int, default=PLANS,
                    help="budget per search: (plans + 1) x plan_cost cost-model evaluations (fixed: 250)")
    ap.add_argument("--cpus", type=int, default=2, help="Ray tasks at a time (one CPU each)")
    ap.add_argument("--no-run", action="store_true",
                    help="only tabulate what the cache holds ('-' for the rest)")
    ap.add_argument("--cache", default=str(RESULTS / "pipeline_evals_runs.json"))
    ap.add_argument("--out", default=str(RESULTS / "pipeline_evals"))
    ap.add_argument("--op-model", default=None, choices=("roofline", "calibrated"),
                    help="time the V100 ops with simulators/gpu_ops.py (default: the profile as before)")
    ap.add_argument("--compare", default=None,
                    help="a pipeline.py JSON of the same cases under another op model: adds per case both "
                         "optima, the DP cuts and the methods' rankings with Kendall's tau")
    args = ap.parse_args()
    load0 = os.getloadavg()
    methods = args.methods.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    todo_cases = [c for c in cases(args.cases) if args.models is None or c.model in args.models.split(",")]
    extra = ("archplace.simulators.gpu_ops", "archplace.hardware.gpus") if args.op_model else ()
    version = code_version(*CODE, *extra)
    tag = f"|{args.op_model}" if args.op_model else ""
    cache_path = Path(args.cache)
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}

    import ray

    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    dp_task = ray.remote(num_cpus=1, max_retries=0)(run_dp)
    m_task = ray.remote(num_cpus=1, max_retries=0)(run_method)
    pending: dict = {}
    for case in todo_cases:
        k = f"{version}|{case.key}{tag}|dp"
        if k not in cache:
            pending[dp_task.remote(case, args.op_model)] = k
    dps = {}
    # DP first: a case whose every plan runs out of memory has nothing for the searches to find
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=3600)
        for ref in done:
            k = pending.pop(ref)
            cache[k] = {**ray.get(ref, timeout=60), "commit": git_state()["commit"], "command": command()}
            cache_path.write_text(json.dumps(cache))
    for case in todo_cases:
        dps[case] = cache[f"{version}|{case.key}{tag}|dp"]
    # seed by seed, case by case, cheap methods first: an interrupted run has whole cases (every method)
    order = sorted(methods, key=lambda m: m in DQN_VARIANTS)
    for seed in seeds:
        for case in todo_cases:
            for m in order:
                if dps[case]["oom"] or (m == "argmax" and seed != seeds[0]):
                    continue  # argmax is deterministic
                k = f"{version}|{case.key}{tag}|seed{seed}|{m}|evals{args.plans}"
                if k not in cache and not args.no_run:
                    pending[m_task.remote(case, seed, m, args.plans, args.op_model)] = k
    t0 = time.perf_counter()
    n = len(pending)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=7200)
        for ref in done:
            k = pending.pop(ref)
            cache[k] = {**ray.get(ref, timeout=60), "commit": git_state()["commit"], "command": command(),
                        "loadavg_done": list(os.getloadavg())}   # the shared machine's load at its end
            cache_path.write_text(json.dumps(cache))
            print(f"[{n - len(pending)}/{n} {time.perf_counter() - t0:.0f} s] {k.split('|', 1)[1]}: "
                  f"wall {cache[k]['wall_s']:.1f} s", flush=True)
    ray.shutdown()

    rows = []
    for case in todo_cases:
        runs: dict[str, dict[int, dict]] = {}
        for m in methods:
            for seed in seeds:
                k = f"{version}|{case.key}{tag}|seed{seed}|{m}|evals{args.plans}"
                if k in cache:
                    runs.setdefault(m, {})[seed] = cache[k]
        rows.append(summarise(case, dps[case], runs))
    txt = table(rows, methods)
    feas = [r for r in rows if not r.get("infeasible")]

    def count(m, key, tol=0.01):
        vals = [g for r in feas if m in r for g in r[m][key]]
        return sum(g is not None and g <= tol for g in vals), len(vals)

    lines = [f"\nBudget per search: ({args.plans} + 1) x plan_cost cost-model evaluations; seeds {seeds}. "
             "Searches within 1% of the optimum (L / L* <= 1.01):"]
    for m in methods:
        if any(m in r for r in feas):
            a, b = count(m, "best_gap")
            extra = ""
            if m in DQN_VARIANTS:
                c, d = count(m, "greedy_gap")
                e, f = count(m, "seen_gap")
                extra = f"; best-seen {e}/{f}; greedy policy {c}/{d}"
            lines.append(f"  {m:10s} best {a}/{b}{extra}")
    res = {"git": git_state(), "command": command(), "machine": machine(load0), "code_version": version,
           "op_model": args.op_model, "plans": args.plans, "seeds": seeds, "methods": methods, "rows": rows}
    if args.op_model:
        lines.insert(0, f"\nop model {args.op_model}: {rows[0]['dp'].get('op_model', {}).get('note')}")
    if args.compare:
        res["comparison"] = compare(json.loads(Path(args.compare).read_text()), res)
        res["comparison"]["other_file"] = args.compare
        lines += [""] + res["comparison"]["lines"]
    summary = "\n".join(lines)
    print("\n" + txt + summary)
    Path(args.out + ".txt").write_text(txt + summary + "\n")
    Path(args.out + ".json").write_text(json.dumps(res, indent=1))


def _mean_gap(row: dict | None) -> float:
    """A method's mean best gap over its seeds (inf if a seed found no plan that fits)."""
    if row is None or any(g is None for g in row["best_gap"]):
        return float("inf")
    return float(np.mean(row["best_gap"]))


def compare(a: dict, b: dict) -> dict:
    """Per case, run ``a`` (e.g. roofline) against run ``b`` (e.g. calibrated): both DP optima (length,
    cuts, pruned and unpruned), whether the cuts change, the methods' mean gaps, rank order (1 = best,
    ties share the lower rank) and Kendall's tau-b between the two rankings (scipy). ``regret``: how much
    longer ``a``'s optimal cuts run under ``b``'s op model than ``b``'s own optimum (what planning with
    the wrong model costs; both profiles rebuilt here)."""
    from scipy.stats import kendalltau, rankdata

    from archplace.hardware.presets import v100_servers
    from archplace.simulators.pipeline import evaluate

    by_key = {c.key: c for c in cases("all")}

    na, nb = a.get("op_model") or "default", b.get("op_model") or "default"
    rows_a = {r["key"]: r for r in a["rows"]}
    methods = [m for m in b["methods"] if m in a["methods"]]
    out: dict = {"a": na, "b": nb, "cases": {}}
    lines = [f"{na} vs {nb}: DP optimum L* (s) and cuts; methods ranked by mean gap to their own optimum "
             f"({', '.join(methods)}; 1 = best; tau = Kendall tau-b)"]
    n_cut, n_full, n_best, n_order, taus, regrets = 0, 0, 0, 0, [], []
    for rb in b["rows"]:
        ra = rows_a.get(rb["key"])
        if ra is None:
            continue
        da, db = ra["dp"], rb["dp"]
        c: dict = {"case": rb["case"], f"L_{na}": None if da["oom"] else da["length_s"],
                   f"L_{nb}": None if db["oom"] else db["length_s"], f"cuts_{na}": da["cuts"],
                   f"cuts_{nb}": db["cuts"],
                   "cuts_change": da["cuts"] != db["cuts"] or da["oom"] != db["oom"]}
        if "unpruned" in da and "unpruned" in db and "cuts" in da["unpruned"] and "cuts" in db["unpruned"]:
            c["unpruned_cuts_change"] = da["unpruned"]["cuts"] != db["unpruned"]["cuts"]
            c[f"unpruned_cuts_{na}"] = da["unpruned"]["cuts"]
            c[f"unpruned_cuts_{nb}"] = db["unpruned"]["cuts"]
            n_full += c["unpruned_cuts_change"]
        n_cut += c["cuts_change"]
        la, lb = c[f"L_{na}"], c[f"L_{nb}"]
        line = (f"  {rb['case']:15s} L* {'OOM' if la is None else f'{la:.4f}'} -> "
                f"{'OOM' if lb is None else f'{lb:.4f}'}"
                f"  cuts {da['cuts']} -> {db['cuts']}{' (changed)' if c['cuts_change'] else ''}")
        if c["cuts_change"] and la is not None and lb is not None:
            case = by_key[rb["key"]]
            prof_b, _ = op_model_profile(case.model, b.get("op_model"))
            r = evaluate(prof_b, v100_servers(case.servers), np.asarray([da["cuts"]], dtype=np.int64))
            c["regret"] = None if bool(r.oom[0]) else float(r.length_s[0]) / lb - 1.0
            regrets.append(c["regret"])
            line += (f"; {na}'s cuts under {nb}: " + ("OOM" if c["regret"] is None else
                                                      f"{float(r.length_s[0]):.4f} s ({c['regret']:+.2%})"))
        if not (ra.get("infeasible") or rb.get("infeasible")):
            ga = [_mean_gap(ra.get(m)) for m in methods]
            gb = [_mean_gap(rb.get(m)) for m in methods]
            rka = [int(x) for x in rankdata(ga, method="min")]
            rkb = [int(x) for x in rankdata(gb, method="min")]
            big = 1e30
            tau = kendalltau([g if np.isfinite(g) else big for g in ga],
                             [g if np.isfinite(g) else big for g in gb])
            tau_v = float(tau.statistic) if np.isfinite(tau.statistic) else None
            best_a = sorted(m for m, r in zip(methods, rka) if r == 1)
            best_b = sorted(m for m, r in zip(methods, rkb) if r == 1)
            c.update({f"mean_gap_{na}": ga, f"mean_gap_{nb}": gb, f"rank_{na}": rka, f"rank_{nb}": rkb,
                      "kendall_tau_b": tau_v, f"best_{na}": best_a, f"best_{nb}": best_b,
                      "best_changes": best_a != best_b, "order_changes": rka != rkb})
            n_best += best_a != best_b
            n_order += rka != rkb
            taus += [tau_v] if tau_v is not None else []
            tau_s = "n/a (all tied)" if tau_v is None else f"{tau_v:.3f}"
            line += (f"\n  {'':15s} gaps % {na} {[round(100 * g, 2) for g in ga]} {nb} "
                     f"{[round(100 * g, 2) for g in gb]}  ranks {rka} -> {rkb}  tau {tau_s}")
        out["cases"][rb["key"]] = c
        lines.append(line)
    n = len(out["cases"])
    out["summary"] = {"cases": n, "dp_cuts_change": n_cut, "unpruned_dp_cuts_change": n_full,
                      "best_method_changes": n_best, "rank_order_changes": n_order,
                      "kendall_tau_b_mean": float(np.mean(taus)) if taus else None,
                      "regret_max": max((x for x in regrets if x is not None), default=None)}
    lines.append(f"  DP cuts change on {n_cut}/{n} cases (unpruned optimum: {n_full}/{n}); best method "
                 f"changes on {n_best}, rank order on {n_order}; Kendall tau-b mean "
                 f"{out['summary']['kendall_tau_b_mean']} over the {len(taus)} cases where it is defined; "
                 f"{na}'s optimal cuts lose at most {out['summary']['regret_max']} under {nb}")
    out["lines"] = lines
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
    main()
