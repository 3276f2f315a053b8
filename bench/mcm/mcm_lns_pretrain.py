"""Pre-train the learned-neighbourhood policy (PPO-LNS, issue 17) on the corpus's training graphs.

    python bench/mcm/mcm_lns_pretrain.py [--subsolves 3072] [--seed 0] [--reward rate|budget] [--out F]

One PPO policy (``algorithms/rl/mcm_lns_ppo.py``) on the 66 training graphs of ``mcm_corpus(seed=0)``
on ``mcm-36`` (a random graph per episode, each from the greedy partition after repair), for a fixed
number of CP-SAT sub-solves (the budget was fixed before any test graph was run). Writes the weights to
``bench/mcm/results/mcm_lns_pretrained.npz`` and the run's record (commit, command, load, returns per
iteration) to ``bench/mcm/results/mcm_lns_pretrain.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subsolves", type=int, default=3072)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "mcm_lns_pretrained.npz"))
    ap.add_argument("--reward", default="rate", choices=("rate", "budget"), help="the env's reward mode")
    ap.add_argument("--episode-s", type=float, default=4.0, help="wall seconds of a 'budget' episode")
    args = ap.parse_args()
    load = os.getloadavg()

    import ray
    import torch

    torch.set_num_threads(1)
    from archplace.algorithms.rl.mcm_lns_ppo import pretrain_lns
    from archplace.algorithms.rl.mcm_ppo import save_state
    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem
    from archplace.workloads.corpus import mcm_corpus, split_by_family

    train = split_by_family(mcm_corpus(seed=0))["train"]
    problems = [MCMProblem.from_graph(g.graph, mcm_package(36)) for g in train]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    env = {"reward": "rate"} if args.reward == "rate" else {"reward": "budget", "episode_s": args.episode_s}
    state, info = pretrain_lns(problems, args.subsolves, seed=args.seed, log=lambda m: print(m, flush=True),
                               env=env)
    ray.shutdown()
    version = code_version("archplace.algorithms.rl.mcm_lns_env", "archplace.algorithms.rl.mcm_lns_ppo",
                           "archplace.algorithms.solvers.mcm_lns")
    save_state(args.out, state, subsolves=info["subsolves"], seed=args.seed, code_version=version,
               env=info["env"], graphs=[g.name for g in train])
    out = {**git_state(), "command": command(), "machine": machine(load), "code_version": version,
           "graphs": [g.name for g in train], **info}
    stem = Path(args.out).stem.replace("pretrained", "pretrain")
    record = Path(args.out).with_name(stem + ".json")
    record.write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out} and {record} ({info['wall_s']:.0f} s)")


if __name__ == "__main__":
    main()
