"""``archplace`` ``shard``: operator sharding (OPP) or data-parallel dimensions (ADP, ``--data-parallel``)
of a model over T devices (Auto-MAP), by CP-SAT (default), greedy, random, Megatron's known sharding or
(ADP) enumeration, priced by the predicted step time.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace.api.sharding import DQN_BUDGET, SHARD_ALGOS, SHARD_DTYPES, ShardRequest, shard
from archplace.cli import status
from archplace.cli.common import connect_if_needed, fmt_bytes
from archplace.cli.vocabulary import (
    BUDGETS_KEY,
    add_devices,
    budgets,
    count,
    gpu_choice,
    gpu_help,
    positive,
    refuse,
    renamed,
)
from archplace.hardware.gpus import GPUS


def cmd_shard(args) -> dict[str, Any]:
    if args.hf_config and args.model:
        raise ValueError(f"give MODEL or --hf-config, not both (got {args.model!r} and {args.hf_config!r})")
    if not (args.model or args.hf_config):
        raise ValueError("MODEL or --hf-config CONFIG.json is required")
    model = f"hf:{args.hf_config}" if args.hf_config else args.model
    req = ShardRequest(
        model,
        devices=args.devices,
        algo=args.algo,
        data_parallel=args.data_parallel,
        seq=args.seq,
        batch=args.batch,
        gpu=args.gpu,
        dtype=args.dtype,
        budget=args.max_evals,
        max_deterministic_s=args.det_time,
        seed=args.seed,
        reward=args.reward,
    )
    connect_if_needed(req, args.address)
    status.phase(f"sharding {args.model or args.hf_config} on {args.devices} devices ({args.algo})")
    res = shard(req).to_dict()
    if args.algo == "ilp":
        res[BUDGETS_KEY] = budgets(det_time_s=args.det_time)
    elif args.algo in ("random", "dqn"):  # random without --max-evals: as many as greedy spends
        res[BUDGETS_KEY] = budgets(max_evals=args.max_evals or (DQN_BUDGET if args.algo == "dqn" else None))
    else:
        res[BUDGETS_KEY] = {}
    return res


def print_shard(res: dict[str, Any]) -> None:
    g = res["graph"]
    what = "data inputs (ADP)" if res["mode"] == "adp" else "trainable variables (OPP)"
    print(
        f"{res['model']} ({res['family']}, batch {res['batch']}, seq {res['seq']}) over {res['devices']} "
        f"{res['gpu']} [{res['algo']}, {res['status']}, {res['search_wall_s']:.2f} s, "
        f"{res['propagation_calls']} propagation calls]"
    )
    print(
        f"  graph        {g['tensors']} tensors, {g['ops']} ops, {g['parameters']:,} parameters; "
        f"{g['decision_variables']} {what} with {g['decision_dims']} dims; {g['classes']} dim classes"
    )
    print(f"  partitioned  {res['partitioned_variables']} of {g['decision_variables']}")
    for k, v in res["table3"].items():
        print(f"    {k:<60} {v}")
    if res["status"] == "infeasible":
        print("  step         none: no plan")
    else:
        print(
            f"  step         {res['step_s'] * 1e3:.3f} ms (compute {res['compute_s'] * 1e3:.3f} ms, "
            f"communication {res['comm_s'] * 1e3:.3f} ms)"
        )
        print(
            f"  memory       {fmt_bytes(res['memory_bytes'])} per device"
            + ("" if res["fits"] else "  OUT OF MEMORY")
        )
    if res.get("reason"):
        print(f"  why          {res['reason']}")
    for k, v in sorted(res["collectives"].items()):
        print(f"  {k:<24} {v['count']:>4} x, {fmt_bytes(v['bytes'])} per device")
    ref = res.get("reference")
    if ref:
        print(
            f"  Megatron     {ref['step_s'] * 1e3:.3f} ms, {fmt_bytes(ref['memory_bytes'])} per device "
            f"({ref['partitioned_variables']} partitioned, {ref['dropped']} of its splits conflict here)"
            + (
                f"; ours differs on {ref['differs']} variables (Megatron -> ours)"
                if ref["differs"] is not None
                else ""
            )
        )
        for d in ref["differences"][:10]:
            print(f"    {d}")
    for n in [n for n in res["notes"] if n != res.get("reason")][:5]:
        print(f"  note         {n}")


def add_shard_parser(sub) -> None:
    p = sub.add_parser(
        "shard",
        help="operator sharding (OPP) or data-parallel dimensions (ADP) over T devices "
        "(Auto-MAP; CP-SAT by default)",
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help="a preset of family t5, gpt2, bert, llama or opt (see `archplace models`), or vgg19",
    )
    p.add_argument(
        "--hf-config",
        metavar="CONFIG.json",
        default=None,
        help="a transformers config of a T5, GPT-2, BERT, Llama or OPT model, instead of a preset",
    )
    add_devices(p, "T: each split dimension is split over all T devices (GPUs of --gpu)", required=True)
    p.add_argument(
        "--algo",
        choices=SHARD_ALGOS,
        default="ilp",
        help="ilp (default): CP-SAT, the optimum of the predicted step time under memory; greedy; "
        "random (--max-evals propagation calls); megatron: Megatron-LM's sharding (OPP); "
        "exhaustive: every choice of the data inputs (ADP); dqn: Auto-MAP's DQN (Ray; --max-evals "
        "propagation calls, default 20000)",
    )
    p.add_argument(
        "--data-parallel",
        action="store_true",
        help="ADP: find the batch dimension of the data inputs (variables replicated)",
    )
    p.add_argument("--seq", type=int, default=None, help="tokens (default: the preset's; vgg19: image side)")
    p.add_argument("--batch", type=int, default=8, help="examples per step (default 8)")
    p.add_argument(
        "--gpu", type=gpu_choice(GPUS), default="v100-sxm2", metavar="NAME|FILE",
        help=gpu_help(GPUS, " (default v100-sxm2, Auto-MAP's)"),
    )
    refuse(p, ("--arch",), "shard splits a model over GPUs: it takes --gpu NAME; accelerator templates are "
                           "placed by place --arch")
    p.add_argument("--dtype", choices=SHARD_DTYPES, default="fp16", help="GEMM dtype (default fp16)")
    p.add_argument(
        "--max-evals",
        type=count("propagation calls", high=10**9),
        default=None,
        metavar="N",
        help="random: propagation calls (default: as many as greedy spends); dqn: propagation calls "
        "(default 20000)",
    )
    renamed(p, "--budget", "--max-evals", "max_evals", type=count("propagation calls", high=10**9))
    p.add_argument(
        "--det-time",
        type=positive(float, "deterministic seconds"),
        default=10.0,
        metavar="DSEC",
        help="ilp: CP-SAT deterministic seconds (default 10)",
    )
    renamed(p, "--max-deterministic-time", "--det-time", "det_time",
            type=positive(float, "deterministic seconds"))
    p.add_argument(
        "--reward",
        choices=("paper", "cost"),
        default="paper",
        help="dqn: paper (+0.4 split, +0.1 replicate, -1 conflict) or cost (minus the change of the "
        "predicted step time)",
    )
    p.add_argument("--address", help="dqn: attach to a running Ray cluster (default: an embedded local Ray)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
