"""``archplace`` ``tune-rl``: a Ray Tune sweep (ASHA / PBT) of an RL placer's hyperparameters.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any


def cmd_tune_rl(args) -> dict[str, Any]:
    import time as _time

    from archplace.platform.search import connect
    from archplace.platform.tune_rl import tune_rl

    case = {k: v for k, v in (("model", args.model), ("cluster", args.cluster), ("chiplets", args.chiplets),
                              ("seq", args.seq)) if v is not None}
    out = args.out or f"runs/tune-rl-{args.placer}-{_time.strftime('%Y%m%d-%H%M%S')}"
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    connect(args.address)
    return tune_rl(args.placer, scheduler=args.scheduler, samples=args.samples, iterations=args.iterations,
                   out=out, seed=args.seed, case=case, max_concurrent=args.max_concurrent)


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
    tr.add_argument("--cluster", default=None, help="pipeline: V100 cluster A, B or C")
    tr.add_argument("--chiplets", type=int, default=None, help="mcm: chiplets")
    tr.add_argument("--seq", type=int, default=None, help="mcm: sequence length")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--max-concurrent", type=int, default=None,
                    help="trials at once (default: as many as the CPUs allow)")
    tr.add_argument("--out", default=None, help="result directory (default runs/tune-rl-PLACER-TIMESTAMP)")
    tr.add_argument("--address", help="attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    tr.add_argument("--json", action="store_true")
