"""Auto-MAP's Table 7 cases: the Rainbow-style DQN's pipeline cuts against the exact optimum.

For bert-48, t5-base, t5-3b and t5-11b on V100 clusters A, B, C (2, 3, 4 servers; stages = servers,
as in the paper) it prints and writes (``bench/results/pipeline.{txt,json}``):

* the optimum L over the pruned candidates (exact enumeration) and whether it fits in memory;
* the trained agent's L (the best plan it evaluated, and its final greedy plan), the gap, the wall
  time and the environment steps, and the steps it took to come within 1% of the optimum;
* the best of as many uniformly random valid plans as the agent evaluated;
* the pre-trained agent's zero-shot plan (``--pretrained``, default the package's weights) and gap.

Cases are cached in ``--cache`` (one entry per model/cluster/seed/budget), so an interrupted run
resumes. ``--pretrain-steps N`` first pre-trains the online-inference agent on synthetic profiles and
writes its weights to ``--pretrained``.

    python bench/pipeline.py                       # every case, default budget (1300 steps per cut)
    python bench/pipeline.py --models bert-48 --clusters C
    python bench/pipeline.py --pretrain-steps 20000
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("bert-48", "t5-base", "t5-3b", "t5-11b")
CLUSTERS = ("A", "B", "C")


def _load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {}


def _save(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def run_case(model: str, cluster_name: str, budget: int, seed: int, pretrained: dict | None) -> dict:
    from archplace.algorithms.rl.pipeline_dqn import dqn_search, pretrained_plan
    from archplace.algorithms.rl.pipeline_env import PipelineCutEnv
    from archplace.algorithms.rl.pipeline_plan import cluster_of, describe, model_profile, optimum

    prof = model_profile(model)
    cl = cluster_of(cluster_name)
    k = cl.num_servers
    rec: dict = {"model": model, "cluster": cluster_name, "stages": k, "ops": prof.num_ops,
                 "setup": {"optimizer": prof.setup.optimizer, "recompute": prof.setup.recompute,
                           "micro_batch": prof.setup.micro_batch,
                           "num_micro_batches": prof.setup.num_micro_batches}}
    opt = optimum(prof, cl, k)
    rec["optimum"] = {**describe(prof, cl, opt.cuts), "evaluated": opt.evaluated, "wall_s": opt.wall_s}
    env = PipelineCutEnv({"profile": prof, "cluster": cl, "num_stages": k})
    rec["candidates_per_cut"] = [len(c) for c in env.cand.per_cut]
    rec["actions"] = len(env.pivots)
    if opt.oom:
        rec["infeasible"] = True  # no candidate plan fits: the agent has nothing to find
        return rec
    rec["infeasible"] = False
    res = dqn_search(prof, cl, k, budget, seed=seed)
    hist = res.history
    within = np.flatnonzero(hist <= opt.length_s * 1.01)
    rec["agent"] = {**describe(prof, cl, res.best_cuts), "greedy": describe(prof, cl, res.greedy_cuts),
                    "env_steps": res.env_steps, "plans": res.plans, "wall_s": res.wall_s,
                    "plans_to_1pct": int(within[0]) + 1 if len(within) else None,
                    "steps_to_1pct": (int(within[0]) + 1) * (k - 1) if len(within) else None}
    rand = env.random_plan_lengths(res.plans, seed=seed)
    rec["random"] = {"plans": res.plans, "best_length_s": float(np.min(rand)),
                     "mean_length_s": float(np.mean(rand[np.isfinite(rand)])) if np.isfinite(rand).any()
                     else None}
    if pretrained is not None:
        zs = pretrained_plan(pretrained, prof, cl, k, seed=seed)
        rec["zero_shot"] = {**describe(prof, cl, zs.cuts), "coarse_cuts": zs.coarse_cuts.tolist(),
                            "wall_s": zs.wall_s}
    return rec


def table(records: list[dict]) -> str:
    def g(x, o):
        return f"{100 * (x / o - 1):+.2f}%"

    head = (f"{'model':8s} {'cl':2s} {'K':>1s} {'act':>5s} {'L* (s)':>8s} {'agent L':>8s} {'gap':>7s} "
            f"{'greedy':>7s} {'wall s':>6s} {'steps':>5s} {'to 1%':>5s} {'random':>7s} {'0-shot':>8s} "
            f"{'opt device cuts':16s} {'agent cut layers'}")
    lines = [head, "-" * len(head)]
    for r in records:
        o = r["optimum"]
        base = f"{r['model']:8s} {r['cluster']:2s} {r['stages']:>1d} {r.get('actions', 0):>5d} "
        if r["infeasible"]:
            lines.append(base + f"{'OOM':>8s}  no plan over the candidates fits in 32 GiB "
                         f"(best L {o['length_s']:.3f} s, memory {max(o['memory_gib']):.1f} GiB)")
            continue
        a = r["agent"]
        zs = r.get("zero_shot")
        zs_txt = ("OOM" if zs and zs["oom"] else g(zs["length_s"], o["length_s"])) if zs else "-"
        lines.append(base + f"{o['length_s']:8.4f} {a['length_s']:8.4f} "
                     f"{g(a['length_s'], o['length_s']):>7s} "
                     f"{'OOM' if a['greedy']['oom'] else g(a['greedy']['length_s'], o['length_s']):>7s} "
                     f"{a['wall_s']:6.0f} "
                     f"{a['env_steps']:>5d} {a['steps_to_1pct'] or '-':>5} "
                     f"{g(r['random']['best_length_s'], o['length_s']):>7s} {zs_txt:>8s} "
                     f"{str(tuple(o['device_cuts'])):16s} {', '.join(a['cut_layers'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--budget", type=int, default=None,
                    help="env steps per search (default: the YAML's steps_per_cut x (K - 1))")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pretrained", default=None, help="weights for the zero-shot column "
                    "(default: the package's pipeline_dqn_pretrained.npz)")
    ap.add_argument("--pretrain-steps", type=int, default=0, help="pre-train first and write --pretrained")
    ap.add_argument("--cache", default=str(RESULTS / "pipeline_runs.json"))
    ap.add_argument("--out", default=str(RESULTS / "pipeline"))
    args = ap.parse_args()

    import ray

    from archplace.algorithms.rl.pipeline_dqn import (
        default_budget,
        load_state,
        pretrain_synthetic,
        save_state,
    )
    from archplace.algorithms.rl.pipeline_plan import pretrained_weights_path

    weights = Path(args.pretrained) if args.pretrained else pretrained_weights_path()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if args.pretrain_steps:
        state, info = pretrain_synthetic(args.pretrain_steps, seed=args.seed)
        save_state(weights, state, **{k: v for k, v in info.items() if k != "return_curve"})
        curve = info.pop("return_curve")
        (RESULTS / "pipeline_pretrain.json").write_text(json.dumps({**info, "return_curve": curve}, indent=1))
        print(f"pre-trained {info['steps']} steps in {info['wall_s']:.0f} s -> {weights}")
    pretrained = load_state(weights)[0] if weights.exists() else None
    cache_path = Path(args.cache)
    cache = _load(cache_path)
    records = []
    budgets = []
    for model in args.models.split(","):
        for cl in args.clusters.split(","):
            budget = args.budget or default_budget({"A": 2, "B": 3, "C": 4}[cl])
            budgets.append(budget)
            key = f"{model}|{cl}|seed{args.seed}|budget{budget}"
            if key not in cache:
                t0 = time.perf_counter()
                cache[key] = run_case(model, cl, budget, args.seed, pretrained)
                cache[key]["case_wall_s"] = time.perf_counter() - t0
                _save(cache_path, cache)
            records.append(cache[key])
            print(table([cache[key]]).splitlines()[-1], flush=True)
    txt = table(records)
    feasible = [r for r in records if not r["infeasible"]]
    gaps = [r["agent"]["length_s"] / r["optimum"]["length_s"] - 1 for r in feasible]
    walls = [r["agent"]["wall_s"] for r in feasible]
    zs = [r["zero_shot"]["length_s"] / r["optimum"]["length_s"] - 1 for r in feasible
          if "zero_shot" in r and not r["zero_shot"]["oom"]]
    summary = (f"\nbudget {sorted(set(budgets))} env steps per case, seed {args.seed}. Trained agent: "
               f"{sum(g <= 0.01 for g in gaps)}/{len(gaps)} cases within 1% of the optimum "
               f"(max gap {100 * max(gaps, default=0):.2f}%), max wall {max(walls, default=0):.0f} s; "
               f"infeasible (OOM): {[r['model'] + '/' + r['cluster'] for r in records if r['infeasible']]}."
               + (f" Zero-shot: median gap {100 * float(np.median(zs)):.1f}%, max {100 * max(zs):.1f}%."
                  if zs else ""))
    print("\n" + txt + summary)
    Path(args.out + ".txt").write_text(txt + summary + "\n")
    Path(args.out + ".json").write_text(json.dumps({"budgets": sorted(set(budgets)), "seed": args.seed,
                                                     "records": records}, indent=1))


if __name__ == "__main__":
    main()
