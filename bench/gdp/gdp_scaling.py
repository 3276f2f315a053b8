"""GDP at scale (issue 18): the 8-layer GNMT training graph (>= 20,000 ops) on 8 GPUs, and a synthetic
5,000-op graph for the simulator's placements-per-second target.

    python bench/gdp/gdp_scaling.py [--repeats 3]

Reports, each as the median of ``--repeats`` runs on one CPU thread:

* the graph build (torch.export capture + backward derivation) and the policy's node features;
* one forward pass of the GDP policy (GraphSAGE + segment-recurrent placer + superposition, default
  sizes) over the whole graph, and a forward + backward pass (what one PPO update costs per placement);
* the simulator per placement: batches of 64 placements of the human-like placement's kind (few
  transfers) and of uniform random placements (a transfer on most edges), on gnmt-8 and on a 5,000-op
  layered random DAG (the issue's target: >= 1,000 placements/s there). These are on one thread; the
  ``*_threads`` keys repeat the 5,000-op DAG with the batch split over ``sim_threads`` numba threads
  (``simulate_batch(..., threads=)``, all CPUs), kept apart so the per-core target is judged alone.

Writes ``bench/gdp/results/gdp_scaling.json`` with the commit, command and machine load.
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
from _meta import command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def sim_rate(problem, placements: np.ndarray, repeats: int, threads: int = 1) -> float:
    from archplace.simulators.gpu_placement import simulate_batch

    simulate_batch(problem, placements[:2], threads=threads)  # compile outside the timing
    return len(placements) / median_time(lambda: simulate_batch(problem, placements, threads=threads),
                                         repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    load = os.getloadavg()
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.rl.gdp_env import GDPGraph
    from archplace.algorithms.rl.gdp_policy import GDPPolicy, GDPPolicyConfig
    from archplace.algorithms.search.gdp_baselines import human_from_graph, random_placement
    from archplace.hardware.gpu_machines import gpu_machine
    from archplace.simulators.gpu_placement import PlacementProblem
    from archplace.workloads.gdp_models import gdp_graph, node_features
    from archplace.workloads.synthetic import layered_dag

    out: dict = {**git_state(), "command": command(), "machine": machine(load), "torch_threads": 1}
    t0 = time.perf_counter()
    g = gdp_graph("gnmt-8")
    out["gnmt8_build_s"] = time.perf_counter() - t0
    problem = PlacementProblem.from_graph(g, gpu_machine("p100-pcie", 8))
    feats, _ = node_features(g)
    gg = GDPGraph(problem, feats, "gnmt-8")
    out["gnmt8_ops"], out["gnmt8_edges"] = problem.num_nodes, problem.num_edges
    torch.manual_seed(0)
    policy = GDPPolicy(feats.shape[1], GDPPolicyConfig())
    x = torch.as_tensor(gg.features)
    ei = torch.as_tensor(gg.edge_index)

    def forward():
        with torch.no_grad():
            policy(x, ei, 8)

    def forward_backward():
        policy.zero_grad()
        policy(x, ei, 8).logsumexp(-1).sum().backward()

    out["policy_parameters"] = sum(p.numel() for p in policy.parameters())
    out["policy_forward_s"] = median_time(forward, args.repeats)
    out["policy_forward_backward_s"] = median_time(forward_backward, args.repeats)
    rng = np.random.default_rng(0)
    human = human_from_graph(g, problem)
    rand = np.stack([random_placement(problem, seed=int(s)) for s in rng.integers(2**31, size=64)])
    out["gnmt8_sim_placements_per_s_human"] = sim_rate(problem, np.tile(human, (64, 1)), args.repeats)
    out["gnmt8_sim_placements_per_s_random"] = sim_rate(problem, rand, args.repeats)
    dag = layered_dag(5000, 50, seed=0)
    p5 = PlacementProblem.from_graph(dag, gpu_machine("p100-pcie", 8))
    out["dag5000_ops"], out["dag5000_edges"] = p5.num_nodes, p5.num_edges
    blocks = np.repeat(np.arange(8), -(-p5.num_nodes // 8))[:p5.num_nodes][p5.priority]  # topological blocks
    rand5 = np.stack([random_placement(p5, seed=int(s)) for s in rng.integers(2**31, size=64)])
    out["dag5000_sim_placements_per_s_blocks"] = sim_rate(p5, np.tile(blocks, (64, 1)), args.repeats)
    out["dag5000_sim_placements_per_s_random"] = sim_rate(p5, rand5, args.repeats)
    out["sim_threads"] = threads = os.cpu_count() or 1
    out["dag5000_sim_placements_per_s_blocks_threads"] = sim_rate(p5, np.tile(blocks, (64, 1)), args.repeats,
                                                                  threads)
    out["dag5000_sim_placements_per_s_random_threads"] = sim_rate(p5, rand5, args.repeats, threads)
    (RESULTS / "gdp_scaling.json").write_text(json.dumps(out, indent=1))
    for k, v in out.items():
        if k not in ("command", "machine", "dirty_files"):
            print(f"{k:<40} {v:.4g}" if isinstance(v, float) else f"{k:<40} {v}")
    print(f"wrote {RESULTS / 'gdp_scaling.json'}")


if __name__ == "__main__":
    main()
