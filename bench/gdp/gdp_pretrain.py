"""Pre-train one GDP policy on a batch of graphs (GDP-batch, spec §5) and save its weights for
``archplace place-ops MODEL --algo gdp-pretrained --pretrained W [--zero-shot]``.

    python bench/gdp/gdp_pretrain.py [--graphs inception-v3,amoebanet,rnnlm-2,gnmt-2,wavenet-2x18]
                                 [--time 600] [--seed 0] [--out bench/results/gdp_pretrained.npz]

The default batch is the paper's "Batch 2" (Appendix Table 3) without txl-2, which stays held out for
fine-tuning and zero-shot. Each graph keeps its Table 1 device count; one policy with 8 device logits
serves all (devices past a graph's count are masked). Writes the weights and a record (commit,
command, load, per-graph best-seen and greedy step times) next to them.
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
BATCH2_HELD_OUT_TXL = ("inception-v3", "amoebanet", "rnnlm-2", "gnmt-2", "wavenet-2x18")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", default=",".join(BATCH2_HELD_OUT_TXL))
    ap.add_argument("--time", type=float, default=600.0, help="wall seconds of PPO")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--machine", default="p100-pcie", choices=("p100-pcie", "v100-nvlink"))
    ap.add_argument("--out", default=str(RESULTS / "gdp_pretrained.npz"))
    args = ap.parse_args()
    load = os.getloadavg()

    import ray
    import torch

    torch.set_num_threads(1)
    from gdp import build

    from archplace.algorithms.rl.gdp_ppo import gdp_train
    from archplace.algorithms.rl.mcm_ppo import save_state

    names = [g for g in args.graphs.split(",") if g]
    graphs = [build(n, args.machine)[2] for n in names]
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    run = gdp_train(graphs, time_limit_s=args.time, seed=args.seed, keep_state=True,
                    log=lambda m: print(m, flush=True))
    ray.shutdown()
    version = code_version("archplace.algorithms.rl", "archplace.simulators", "archplace.workloads")
    save_state(args.out, run.state, graphs=names, seed=args.seed, time_s=args.time, samples=run.samples,
               code_version=version, machine=args.machine)
    rec = {**git_state(), "command": command(), "machine": machine(load), "code_version": version,
           "graphs": names, "time_s": args.time, "samples": run.samples, "iterations": run.iterations,
           "best_step_time_s": run.best_step_time_s, "greedy_step_time_s": run.greedy_step_time_s,
           "greedy_valid": run.greedy_valid, "wall_s": run.wall_s}
    record = Path(args.out).with_name(Path(args.out).stem.replace("pretrained", "pretrain") + ".json")
    record.write_text(json.dumps(rec, indent=1))
    print(f"wrote {args.out} and {record}")


if __name__ == "__main__":
    main()
