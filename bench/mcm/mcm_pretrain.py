"""Pre-train the MCM partitioning policy on the corpus's training graphs (spec mcm.md §5.1).

    python bench/mcm/mcm_pretrain.py [--samples 20000] [--checkpoint-every 500] [--seed 0]  (defaults: the
        YAML)

PPO (tune_configs/mcm_ppo.yaml) over the 66 training graphs (synthetic + CNN) round robin on mcm-36; every
``--checkpoint-every`` samples the policy's deterministic reward on the 5 validation graphs (RNN) is
measured and the best checkpoint kept. Writes ``bench/mcm/results/mcm_pretrained.npz`` (weights, read by
bench/mcm/mcm.py and ``archplace partition --algo ppo --pretrained``) and
``bench/mcm/results/mcm_pretrain.json``
(the validation curve).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    from archplace.algorithms.rl.mcm_ppo import load_config

    pre = load_config()["pretraining"]
    ap.add_argument("--samples", type=int, default=pre["total_samples"],
                    help="training samples (paper: 20,000)")
    ap.add_argument("--checkpoint-every", type=int, default=pre["checkpoint_every"],
                    help="samples between checkpoints")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--train-on", choices=("sampled", "repaired"), default=None,
                    help="PPO's action: the sampled y or the repaired y' (default: the YAML's)")
    ap.add_argument("--out", default=str(RESULTS / "mcm_pretrained.npz"),
                    help="weights; the validation curve goes next to it as <stem>.json")
    args = ap.parse_args()

    import ray
    import torch

    from archplace.algorithms.rl.mcm_ppo import pretrain, save_state
    from archplace.workloads.corpus import mcm_corpus, split_by_family

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    split = split_by_family(mcm_corpus(seed=0))
    t0 = time.perf_counter()
    res = pretrain(split["train"], split["validation"], total_samples=args.samples,
                   checkpoint_every=args.checkpoint_every, seed=args.seed,
                   env=None if args.train_on is None else {"train_on": args.train_on},
                   log=lambda m: print(m, flush=True))
    meta = {"samples": args.samples, "train_on": args.train_on or "yaml default",
            "best_samples": res.best_samples,
            "best_validation_reward": res.best_validation_reward, "seed": args.seed,
            "train_graphs": [g.name for g in split["train"]],
            "validation_graphs": [g.name for g in split["validation"]]}
    save_state(args.out, res.best_state, **meta)
    out = {**meta, "checkpoints": res.checkpoints, "train_reward_per_iteration": res.train_reward,
           "wall_s": time.perf_counter() - t0}
    curve = Path(args.out).with_suffix(".json")
    if curve.name == "mcm_pretrained.json":  # the default weights keep their historical curve name
        curve = RESULTS / "mcm_pretrain.json"
    curve.write_text(json.dumps(out, indent=1))
    print(f"pre-trained {args.samples} samples in {out['wall_s']:.0f} s; best checkpoint at "
          f"{res.best_samples} samples, validation reward {res.best_validation_reward:.3f} -> {args.out}")


if __name__ == "__main__":
    main()
