"""Environment steps per second of both RL placers with 0, 1 and 2 remote env runners.

* pipeline DQN (Auto-MAP): bert-48 on V100 cluster B (3 stages), ``--dqn-steps`` environment steps;
* MCM PPO: bert-base (sequence 128) on 8 chiplets, ``--ppo-samples`` sampled partitions (one env step
  each, FIX repair included).

0 runners samples in the driver next to the learner; N > 0 starts N EnvRunner actors (one CPU each)
on an embedded Ray with ``--cpus`` CPUs. Every run is seeded the same way, and the JSON records the
best result of each run too, so a reader can see that the runners change where sampling happens,
not what is computed (DQN: identical plans for every N; PPO: the sampled partitions differ once the
episodes of several runners interleave).

The environment alone (random valid actions, in this process) is timed too: the share of the
in-process run spent stepping it bounds what remote runners on a cluster could give (``env_alone``).

    python bench/platform/rl_scaling.py [--runners 0,1,2] [--cpus 3] [--out
        bench/platform/results/rl_scaling.json]
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


def pipeline_run(runners: int, steps: int, seed: int) -> dict:
    from archplace.algorithms.rl.pipeline_dqn import dqn_search
    from archplace.algorithms.rl.pipeline_plan import cluster_of, model_profile

    prof, cl = model_profile("bert-48"), cluster_of("B")
    t0 = time.perf_counter()
    r = dqn_search(prof, cl, 3, budget_steps=steps, seed=seed, num_env_runners=runners)
    wall = time.perf_counter() - t0
    return {"env_steps": r.env_steps, "wall_s": wall, "env_steps_per_s": r.env_steps / wall,
            "plans": r.plans, "best_length_s": r.best_length_s, "greedy_length_s": r.greedy_length_s}


def mcm_run(runners: int, samples: int, seed: int) -> dict:
    from archplace.algorithms.rl.mcm_ppo import rl_search
    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem
    from archplace.workloads.models import build_graph

    g = build_graph("bert-base", seq=128, mbs=1, training=False, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(8))
    t0 = time.perf_counter()
    r = rl_search(p, samples, seed=seed, num_env_runners=runners)
    wall = time.perf_counter() - t0
    return {"env_steps": r.trace.samples, "wall_s": wall, "env_steps_per_s": r.trace.samples / wall,
            "best_throughput": r.trace.best, "valid_samples": r.trace.valid_samples}


def env_only(placer: str, steps: int, seed: int) -> dict:
    """Steps/s of the placer's environment alone (uniform random valid actions, no policy, no learner):
    the most remote env runners could speed up. With sampling a share f of a training run's wall
    time, any number of runners leaves the other 1 - f (inference, replay, learner updates), so a
    cluster gives at most 1 / (1 - f)."""
    rng = np.random.default_rng(seed)
    if placer == "pipeline_dqn":
        from archplace.algorithms.rl.pipeline_env import PipelineCutEnv
        from archplace.algorithms.rl.pipeline_plan import cluster_of, model_profile
        from archplace.algorithms.solvers.pipeline_exact import candidate_pivots

        prof, cl = model_profile("bert-48"), cluster_of("B")
        env = PipelineCutEnv({"profile": prof, "cluster": cl, "num_stages": 3, "radius": 3,
                              "candidates": candidate_pivots(prof, cl, 3, 3), "seed": seed})
        pick = lambda obs: int(rng.choice(np.flatnonzero(obs["action_mask"] > 0)))  # noqa: E731
    else:
        from archplace.algorithms.rl.mcm_env import MCMPartitionEnv
        from archplace.hardware.presets import mcm_package
        from archplace.simulators.mcm import MCMProblem
        from archplace.workloads.models import build_graph

        g = build_graph("bert-base", seq=128, mbs=1, training=False, bytes_per_element=1)
        env = MCMPartitionEnv({"graphs": [MCMProblem.from_graph(g, mcm_package(8))], "num_chips": 8,
                               "seed": seed})
        pick = lambda obs: env.action_space.sample()  # noqa: E731
        env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)    # (the MCM env builds its greedy baseline here, outside the timing)
    t0 = time.perf_counter()
    for _ in range(steps):
        obs, _, done, trunc, _ = env.step(pick(obs))
        if done or trunc:
            obs, _ = env.reset()
    wall = time.perf_counter() - t0
    return {"env_steps": steps, "wall_s": wall, "env_steps_per_s": steps / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runners", default="0,1,2")
    ap.add_argument("--cpus", type=int, default=3, help="CPUs of the embedded Ray (runners take one each)")
    ap.add_argument("--dqn-steps", type=int, default=1000)
    ap.add_argument("--ppo-samples", type=int, default=400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "rl_scaling.json"))
    args = ap.parse_args()
    import ray

    runners = [int(x) for x in args.runners.split(",")]
    load_before = os.getloadavg()
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    rows, env_rows = [], []
    for placer, fn, budget in (("pipeline_dqn", pipeline_run, args.dqn_steps),
                               ("mcm_ppo", mcm_run, args.ppo_samples)):
        for n in runners:
            r = fn(n, budget, args.seed)
            rows.append({"placer": placer, "env_runners": n, **r})
            print(f"{placer:13s} runners {n}: {r['env_steps']:6d} steps in {r['wall_s']:7.1f} s = "
                  f"{r['env_steps_per_s']:7.1f} steps/s", flush=True)
    ray.shutdown()
    for placer, budget in (("pipeline_dqn", args.dqn_steps), ("mcm_ppo", args.ppo_samples)):
        e = env_only(placer, budget, args.seed)
        local = next(r for r in rows if r["placer"] == placer and r["env_runners"] == 0)
        share = (budget / e["env_steps_per_s"]) / local["wall_s"]
        e.update({"placer": placer, "sampling_share_at_0_runners": share,
                  "cluster_speedup_bound": 1 / max(1e-9, 1 - share)})
        env_rows.append(e)
        print(f"{placer:13s} env alone: {e['env_steps_per_s']:8.1f} steps/s; sampling is {100 * share:.1f}% "
              f"of the in-process run: runners give at most {e['cluster_speedup_bound']:.2f}x", flush=True)
    out = {"bench": "rl_scaling", "git": git_state(), "command": command(), "machine": machine(load_before),
           "ray_cpus": args.cpus, "seed": args.seed, "rows": rows,
           "env_alone": env_rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2, default=float))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
