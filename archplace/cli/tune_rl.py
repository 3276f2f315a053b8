"""``archplace`` ``tune-rl``: a Ray Tune sweep (ASHA / PBT) of an RL placer's hyperparameters.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace.cli import status
from archplace.cli.pipelining import _cluster_devices
from archplace.cli.vocabulary import BUDGETS_KEY, add_devices, budgets, count, refuse, renamed


def cmd_tune_rl(args) -> dict[str, Any]:
    import time as _time

    from archplace.cli.pipelining import cluster_of_devices
    from archplace.platform.search import connect
    from archplace.platform.tune_rl import tune_rl

    case = {k: v for k, v in (("model", args.model), ("seq", args.seq)) if v is not None}
    if args.devices is not None:  # pipeline: a cluster of servers; mcm: the package's chiplets
        if args.placer == "pipeline":
            case["cluster"] = cluster_of_devices(args.devices, args.gpus_per_node)
        else:
            case["chiplets"] = args.devices
    out = args.out or f"runs/tune-rl-{args.placer}-{_time.strftime('%Y%m%d-%H%M%S')}"
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    connect(args.address)
    status.phase(f"tuning {args.placer}: {args.samples} trial(s), results in {out}")
    res = tune_rl(args.placer, scheduler=args.scheduler, samples=args.samples, iterations=args.iterations,
                  out=out, seed=args.seed, case=case, max_concurrent=args.max_concurrent)
    return {**res, BUDGETS_KEY: budgets(trials=args.samples, max_iterations=res.get("iterations"))}


def print_tune_rl(res: dict[str, Any]) -> None:
    print(f"tune-rl {res['placer']} [{res['scheduler']}]: {res['trials']} trials on {res['case']}, "
          f"{res['stopped_early']} stopped early, {res['wall_s']:.0f} s")
    print(f"  best         {res['best_config']}  ({res['metric']} {res['best_last']:.4f})")
    out = res["out"]
    print(f"  results      {out}/trials.parquet, {out}/best_config.yaml, {out}/report.md")


def add_tune_rl_parser(sub) -> None:
    tr = sub.add_parser("tune-rl", help="Ray Tune sweep (ASHA / PBT) of an RL placer's hyperparameters")
    tr.add_argument("placer", choices=("mcm", "pipeline"))
    tr.add_argument("--scheduler", choices=("asha", "pbt", "fifo"), default="asha")
    tr.add_argument("--samples", type=int, default=8, help="trials")
    tr.add_argument("--iterations", type=int, default=None, help="most training iterations a trial runs "
                                                                  "(default: tune_configs/rl_tune.yaml)")
    tr.add_argument("--model", default=None, help="the case to train on (default: rl_tune.yaml's)")
    add_devices(tr, "mcm: chiplets (at most 64); pipeline: GPUs, 16, 24 or 32 (2, 3 or 4 V100 servers of "
                    "--gpus-per-node 8); default: rl_tune.yaml's case", type=count(high=64))
    tr.add_argument("--gpus-per-node", type=int, default=8, metavar="N",
                    help="pipeline: GPUs per server (default 8; the only shape modelled)")
    renamed(tr, "--chiplets", "--devices", "devices", type=count("chiplets", high=64))
    renamed(tr, "--cluster", "--devices", "devices", type=_cluster_devices, metavar="A|B|C")
    refuse(tr, ("--arch", "--gpu"), "tune-rl trains on rl_tune.yaml's hardware (mcm: the multi-chip "
                                    "module; pipeline: Auto-MAP's V100 servers): it takes --devices N, no "
                                    "--arch or --gpu")
    tr.add_argument("--seq", type=int, default=None, help="mcm: sequence length")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--max-concurrent", type=int, default=None,
                    help="trials at once (default: as many as the CPUs allow)")
    tr.add_argument("--out", default=None, help="result directory (default runs/tune-rl-PLACER-TIMESTAMP)")
    tr.add_argument("--address", help="attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    tr.add_argument("--json", action="store_true")
