"""Operator sharding (OPP) and data-parallel dimensions (ADP) on Auto-MAP's models: the exact CP-SAT
optimum of the predicted step time against Megatron-LM's known sharding, greedy propagation and random
search at equal propagation calls (3 seeds), with Auto-MAP's Table 5 / 6 beside them.

    nice -n 10 python bench/automap/sharding.py [--devices 8 4] [--seeds 3] [--out
        bench/automap/results/sharding.json]

Every budget is deterministic (propagation calls, CP-SAT deterministic time); wall clock is recorded, not
used. The models are the in-tree tensor-level graphs (``workloads/sharding_models.py``) at the preset's
sequence length and batch ``BATCH`` (VGG-19 at 224x224), priced on V100 SXM2 (32 GB) in fp16.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
import _meta  # noqa: E402

from archplace.algorithms.search import sharding_search as ss
from archplace.algorithms.search.sharding_cost import ShardCost
from archplace.api.sharding import shard_graph
from archplace.hardware.gpus import gpu_spec

MODELS = ("t5-base", "t5-3b", "t5-11b", "bert-large", "gpt2-xl", "vgg19")
# examples per step: 8, except where no plan fits a 32 GB V100 at 8 (T5-11B's 128-head score matrices;
# GPT-2 XL's 25 heads split over neither 4 nor 8 devices, so its attention stays whole)
BATCH = {"vgg19": 32, "t5-11b": 2, "gpt2-xl": 1}
# Auto-MAP Table 5 (p. 11): partitioning-count target, stage-1 count and time, stage-2 count and time
PAPER_OPP = {
    "vgg19": (38, 5, "30s", None, None),
    "t5-base": (111, 111, "0.5h", None, None),
    "t5-3b": (432, 397, "0.74h", 432, "0.2h"),
    "t5-11b": (432, 386, "1h", 432, "0.45h"),
}
# Auto-MAP Table 6 (p. 12): ADP candidates, tensors split on dim 0, time
PAPER_ADP = {"t5-base": (10, 7, "0.27h"), "vgg19": (4, 2, "70s")}


def row(res: ss.ShardResult, meg: ss.ShardResult | None = None) -> dict:
    d = {
        "step_s": res.cost.step_s,
        "compute_s": res.cost.compute_s,
        "comm_s": res.cost.comm_s,
        "memory_gib": res.cost.memory_bytes / 2**30,
        "fits": res.cost.fits,
        "partitioned": res.partitioned,
        "propagation_calls": res.propagation_calls,
        "wall_s": res.search_s,
        "status": res.status,
    }
    if meg is not None:
        d["vs_megatron"] = meg.cost.step_s / res.cost.step_s
        d["differs_from_megatron"] = len(ss.differences(res, meg))
    return d


def opp(model: str, devices: int, seeds: int, cost: ShardCost) -> dict:
    batch = BATCH.get(model, 8)
    g, family = shard_graph(model, None, batch)
    pb = ss.ShardProblem(g, devices, "opp", cost)
    out: dict = {
        "model": model,
        "devices": devices,
        "batch": batch,
        "variables": len(pb.variables),
        "dims": sum(len(g.tensors[t].shape) for t in pb.variables),
        "classes": g.classes.num,
        "parameters": g.num_params(),
    }
    t = time.perf_counter()
    groups = ss.linkage_groups(pb)
    out["linkage"] = {
        "propagation_calls": 2 * out["dims"],
        "wall_s": time.perf_counter() - t,
        "largest": max(len(v) for v in groups.values()),
    }
    order = ss.decision_order(pb, groups)
    exact = ss.solve_exact(pb)
    meg = ss.megatron(ss.ShardProblem(g, devices, "opp", cost))
    if family == "vgg19":  # VGG-19's reference is Auto-MAP's Table 4 (convs replicated, FC split)
        meg.algo = "table4"
    out["exact"] = row(exact, meg) | {"notes": exact.notes}
    out["reference"] = row(meg) | {"algo": meg.algo, "dropped": len(meg.notes)}
    gr = ss.greedy(ss.ShardProblem(g, devices, "opp", cost), order)
    out["greedy"] = row(gr, meg)
    out["random"] = [
        row(
            ss.random_search(
                ss.ShardProblem(g, devices, "opp", cost), gr.propagation_calls, seed=s, order=order
            ),
            meg,
        )
        for s in range(seeds)
    ]
    out["exact_strategy"] = {k: v for k, v in exact.choice.items() if v >= 0}
    return out


def dqn(model: str, devices: int, budget: int, seeds: int, cost: ShardCost, reward: str) -> dict:
    """The paper's DQN (two stages) at ``budget`` propagation calls per seed, beside the exact optimum and
    Megatron's count; greedy and random get the same calls."""
    from archplace.algorithms.rl.sharding_dqn import dqn_search

    g, _ = shard_graph(model, None, BATCH.get(model, 8))
    meg = ss.megatron(ss.ShardProblem(g, devices, "opp", cost))
    exact = ss.solve_exact(ss.ShardProblem(g, devices, "opp", cost))
    runs = []
    for seed in range(seeds):
        r = dqn_search(ss.ShardProblem(g, devices, "opp", cost), budget, reward=reward, seed=seed)
        rnd = ss.random_search(ss.ShardProblem(g, devices, "opp", cost), budget, seed=seed)
        runs.append(
            {
                "seed": seed,
                "best_partitioned_dims": r.best_partitioned_dims,
                "stage1_partitioned_dims": r.stage1_partitioned_dims,
                "best": row(r.best, meg) if r.best else None,
                "greedy": row(r.greedy, meg) if r.greedy else None,
                "propagation_calls": r.propagation_calls,
                "episodes": r.episodes,
                "wall_s": r.wall_s,
                "history": r.history,
                "notes": r.notes,
                "random_same_calls": row(rnd, meg),
            }
        )
        print(
            f"DQN {model} T={devices} seed {seed}: best {r.best_partitioned_dims} dims split (stage 1 "
            f"{r.stage1_partitioned_dims}; Megatron {meg.partitioned}), "
            f"step {r.best.cost.step_s * 1e3:.2f} ms vs "
            f"exact {exact.cost.step_s * 1e3:.2f} ms; greedy policy "
            f"{r.greedy.partitioned if r.greedy else 'conflict'}; {r.propagation_calls} calls, {r.episodes} "
            f"episodes, {r.wall_s:.0f} s; random at equal calls {rnd.cost.step_s * 1e3:.2f} ms",
            flush=True,
        )
    return {
        "model": model,
        "devices": devices,
        "budget": budget,
        "reward": reward,
        "megatron_partitioned": meg.partitioned,
        "exact_step_s": exact.cost.step_s,
        "runs": runs,
        "paper": PAPER_OPP.get(model),
    }


def adp(model: str, devices: int, cost: ShardCost) -> dict:
    batch = BATCH.get(model, 8)
    g, _ = shard_graph(model, None, batch)
    pb = ss.ShardProblem(g, devices, "adp", cost)
    ex = ss.adp_exhaustive(pb)
    il = ss.solve_exact(ss.ShardProblem(g, devices, "adp", cost))
    return {
        "model": model,
        "devices": devices,
        "candidates": [g.tensors[t].name for t in pb.variables],
        "exhaustive": row(ex) | {"strategy": ex.choice, "plans_valid": ex.evaluated},
        "ilp": row(il) | {"strategy": il.choice},
        "paper": PAPER_ADP.get(model),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 4])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sharding.json"))
    ap.add_argument("--dqn-budget", type=int, default=0, help="propagation calls per DQN seed (0: no DQN)")
    ap.add_argument("--dqn-models", nargs="+", default=["t5-base"])
    ap.add_argument("--dqn-devices", type=int, default=4)
    ap.add_argument("--dqn-reward", choices=("paper", "cost"), default="paper")
    a = ap.parse_args()
    load = os.getloadavg()
    cost = ShardCost(gpu_spec("v100-sxm2"), "fp16")
    res = {"opp": [], "adp": [], "paper_opp": PAPER_OPP}
    for T in a.devices:
        for m in a.models:
            r = opp(m, T, a.seeds, cost)
            res["opp"].append(r)
            rnd = min(x["step_s"] for x in r["random"])
            ex, ref, gr = r["exact"], r["reference"], r["greedy"]
            print(
                f"OPP {m:<10} T={T}: exact {ex['step_s'] * 1e3:9.2f} ms ({ex['partitioned']:>3} split, "
                f"{ex['status']}, {ex['wall_s']:.2f} s) | {ref['algo']} {ref['step_s'] * 1e3:9.2f} ms "
                f"({ref['partitioned']:>3} split, {ref['dropped']} dropped) | greedy "
                f"{gr['step_s'] * 1e3:9.2f} ms "
                f"| random best {rnd * 1e3:9.2f} ms @ {gr['propagation_calls']} calls | fits "
                f"{ex['fits']}/{ref['fits']} | paper {PAPER_OPP.get(m)}",
                flush=True,
            )
    for m in ("t5-base", "vgg19"):
        r = adp(m, 8, cost)
        res["adp"].append(r)
        print(
            f"ADP {m}: {r['exhaustive']['strategy']} ({r['exhaustive']['wall_s']:.2f} s, "
            f"{r['exhaustive']['propagation_calls']} calls); ilp {r['ilp']['strategy']}; paper {r['paper']}"
        )
    if a.dqn_budget:
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        res["dqn"] = [dqn(m, a.dqn_devices, a.dqn_budget, a.seeds, cost, a.dqn_reward) for m in a.dqn_models]
    res["meta"] = {
        **_meta.git_state(),
        "command": _meta.command(),
        "machine": _meta.machine(load),
        "gpu": "v100-sxm2",
        "dtype": "fp16",
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
