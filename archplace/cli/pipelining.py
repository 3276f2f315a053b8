"""``archplace`` ``pipeline``: pipeline cuts of a model on GPU servers (Auto-MAP).

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

import argparse
from typing import Any

from archplace import api
from archplace.api.pipelining import OP_MODELS
from archplace.cli import status
from archplace.cli.common import connect_if_needed
from archplace.cli.vocabulary import BUDGETS_KEY, budgets, count, gpu_choice, gpu_help, refuse, renamed
from archplace.hardware.gpus import DTYPES, GPUS


def cmd_pipeline(args) -> dict[str, Any]:
    """Pipeline cuts of a model on GPU servers (Auto-MAP's V100 servers unless ``--gpu``): the exact DP
    over every contiguous cut set (default), the DQN, the pre-trained agent or enumeration of the pruned
    candidates."""
    req = api.PipelineRequest(args.model, cluster=cluster_of_devices(args.devices, args.gpus_per_node),
                              stages=args.stages, algo=args.algo, budget=args.max_evals, seed=args.seed,
                              finetune=args.finetune, radius=args.radius,
                              pretrained=args.pretrained, env_runners=args.env_runners,
                              learners=args.learners, gpu=args.gpu, op_model=args.op_model, dtype=args.dtype,
                              profile=args.profile, attention=args.attention)
    connect_if_needed(req, args.address)
    res = api.pipeline(req, progress=status.stages({
        "profile": lambda i: f"finding the optimal cuts of {i.get('forward_ops')} forward operators",
        "optimum": f"searching ({args.algo})" if args.algo != "dp" else None})).to_dict()
    res[BUDGETS_KEY] = budgets(max_evals=res.get("budget")) if args.algo == "rainbow" else {}
    return res


# the servers of Auto-MAP's clusters A, B and C (hardware.presets.v100_cluster), 8 GPUs each
SERVERS = {"A": 2, "B": 3, "C": 4}
GPUS_PER_NODE = 8
DEVICES = tuple(GPUS_PER_NODE * n for n in SERVERS.values())


def cluster_of_devices(devices: int | None, gpus_per_node: int) -> str:
    """The request's cluster letter for ``--devices N --gpus-per-node 8`` (16, 24, 32: A, B, C)."""
    if devices is None:
        raise ValueError(f"--devices N is required: {', '.join(map(str, DEVICES))} GPUs (2, 3 or 4 servers "
                         f"of --gpus-per-node {GPUS_PER_NODE})")
    if gpus_per_node != GPUS_PER_NODE:
        raise ValueError(f"--gpus-per-node must be {GPUS_PER_NODE} (the servers of Auto-MAP's clusters and "
                         f"of every GPU preset's DGX), got {gpus_per_node}")
    if devices not in DEVICES:
        raise ValueError(f"--devices must be {', '.join(map(str, DEVICES))} GPUs (2, 3 or 4 servers of "
                         f"--gpus-per-node {GPUS_PER_NODE}), got {devices:,}")
    return next(c for c, n in SERVERS.items() if GPUS_PER_NODE * n == devices)


def _cluster_devices(text: str) -> int:
    """The old ``--cluster A|B|C`` as its ``--devices``."""
    if text not in SERVERS:
        raise argparse.ArgumentTypeError(f"must be one of A, B, C (2, 3 or 4 servers of 8 GPUs), "
                                         f"got {text!r}")
    return GPUS_PER_NODE * SERVERS[text]


def _devices(text: str) -> int:
    v = int(text)
    if v not in DEVICES:
        raise argparse.ArgumentTypeError(f"must be {', '.join(map(str, DEVICES))} GPUs (2, 3 or 4 servers of "
                                         f"--gpus-per-node {GPUS_PER_NODE}), got {v:,}")
    return v


_devices.__name__ = "int"


def print_pipeline(res: dict[str, Any]) -> None:
    o = res["optimum"]
    dp = res["algo"] == "dp"
    om = res.get("op_model")
    gpu = om["gpu"] if om else "V100"
    print(f"{res['model']} on {res['gpus']} {gpu} ({res['gpus'] // GPUS_PER_NODE} servers of "
          f"{GPUS_PER_NODE}), "
          f"{res['stages']} stages "
          f"[{res['algo']}, {res['wall_s']:.1f} s]")
    if om:
        print(f"  op model     {om['op_model']}, {om['dtype']}: {om['note']}")
    if res.get("attention"):
        print(f"  attention    {res['attention']} (fused: FlashAttention's IO-aware traffic)")
    if o["oom"] and dp:
        print(f"  infeasible: no contiguous cut set fits in memory (the smallest peak is "
              f"{max(o['memory_gib']):.1f} GiB per GPU, at cuts {o['cuts']}; DP {o['wall_s']:.2f} s)")
        return
    if o["oom"]:
        print(f"  infeasible: no candidate plan fits in memory (best {max(o['memory_gib']):.1f} GiB per GPU)")
        return
    print(f"  cuts         {res['cuts']}  after {', '.join(res['cut_ops'])}")
    print(f"  layers       {', '.join(res['cut_layers'])}")
    print(f"  device cuts  {res['device_cuts']}  (devices per stage {res['devices']})")
    print(f"  L            {res['length_s']:.4f} s per iteration{'  OUT OF MEMORY' if res['oom'] else ''}")
    if "budget" in res:
        print(f"  spent        {res['simulator_calls']:,} of {res['budget']:,} cost-model evaluations "
              f"({res['env_step_calls']:,} simulator calls, {res['feature_calls']:,} feature rows; "
              f"stopped: {res['stopped']})")
    if dp:
        print(f"  optimum      over all contiguous cut sets (unpruned), by dynamic programming in "
              f"{o['wall_s']:.2f} s ({o['evaluated']:,} DP states, {o['subproblems']} subproblems)"
              + ("" if o.get("proven_optimal", True) else "  NOT PROVEN: subproblem budget ran out"))
    else:
        print(f"  optimum L    {o['length_s']:.4f} s at {o['cuts']} ({o['evaluated']} plans enumerated); "
              f"gap {100 * res['gap']:+.2f}%")
    print(f"  memory       {res['memory_gib']} GiB per GPU")


def add_pipeline_parser(sub) -> None:
    pp = sub.add_parser("pipeline", help="pipeline cuts of a model on GPU servers (Auto-MAP; exact DP "
                                         "by default)")
    pp.add_argument("model", help="preset name (see `archplace models`), e.g. bert-48, t5-3b")
    pp.add_argument("--devices", type=_devices, default=None, metavar="N",
                    help="GPUs, required: 16, 24 or 32 (2, 3 or 4 servers of --gpus-per-node; of --gpu, "
                         "default Auto-MAP's V100s)")
    pp.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE, metavar="N",
                    help=f"GPUs per server on NVLink (default {GPUS_PER_NODE}; the only shape modelled)")
    renamed(pp, "--cluster", "--devices", "devices", type=_cluster_devices, metavar="A|B|C")
    refuse(pp, ("--arch",), "pipeline cuts a model over GPU servers: it takes --gpu NAME; accelerator "
                            "templates are placed by place --arch")
    pp.add_argument("--stages", type=int, default=None, help="K (default: the number of servers)")
    pp.add_argument("--algo", choices=api.PIPELINE_ALGOS, default="dp",
                    help="dp (default): the exact optimum over every contiguous cut set, by dynamic "
                         "programming; rainbow, pretrained: the DQN agents (Ray); exact: enumeration of "
                         "the pruned candidates")
    pp.add_argument("--max-evals", type=count("cost-model evaluations", high=10**9), default=None,
                    metavar="N",
                    help="rainbow: cost-model evaluations, i.e. simulator calls of completed plans plus the "
                         "lookahead/feature rows of every open pivot at every step (default: 1300 plans' "
                         "worth); the search stops there and says so")
    renamed(pp, "--budget", "--max-evals", "max_evals", type=count("cost-model evaluations", high=10**9))
    pp.add_argument("--pretrained", default=None, help="pretrained: weights .npz (default: the package's)")
    pp.add_argument("--finetune", type=int, default=0, help="pretrained: fine-tuning steps (0: zero-shot)")
    pp.add_argument("--radius", type=int, default=3, help="rainbow, pretrained, exact: pruning radius "
                                                          "(devices) around server boundaries")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--address", help="rainbow, pretrained: attach to a running Ray cluster: auto or "
                                      "HOST:PORT (default: an embedded local Ray)")
    pp.add_argument("--env-runners", type=int, default=0,
                    help="rainbow: remote env runner actors that sample (default 0: in this process)")
    pp.add_argument("--learners", type=int, default=0,
                    help="rainbow: remote learner actors (default 0: in this process)")
    add_op_model_args(pp, "fp16 (Auto-MAP's mixed precision)")
    nvlink = sorted(n for n, g in GPUS.items() if g.nvlink_bytes_per_s > 0)  # a server needs NVLink
    pp.add_argument("--gpu", default=None, type=gpu_choice(nvlink), metavar="NAME|FILE",
                    help=gpu_help(nvlink, ": servers of --gpus-per-node of this GPU on its NVLink, its "
                                        "InfiniBand between servers (default: Auto-MAP's V100 servers on "
                                        "25 Gbps)"))
    pp.add_argument("--attention", choices=("eager", "sdpa"), default="eager",
                    help="eager (default, as captured: the score matrix goes through HBM) or sdpa (fused, "
                         "FlashAttention's IO-aware traffic)")
    pp.add_argument("--json", action="store_true")


def add_op_model_args(p, dtype_default: str) -> None:
    """--op-model, --dtype, --profile: how each op of the graph is timed (simulators/gpu_ops.py)."""
    p.add_argument("--op-model", choices=OP_MODELS, default=None,
                   help="op times: roofline (datasheet peaks), calibrated (H200 micro-benchmarks; other GPUs "
                        "scaled by peak ratios), profiled (--profile); default: calibrated where the GPU "
                        "was measured, else roofline")
    p.add_argument("--dtype", choices=DTYPES, default=None, help=f"GEMM dtype (default {dtype_default})")
    p.add_argument("--profile", default=None,
                   help="an op profile JSON from `archplace profile` (implies --op-model profiled)")
