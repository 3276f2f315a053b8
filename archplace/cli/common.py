"""What every command group of the ``archplace`` command line shares: the model arguments, list
parsing with one-line errors, number formatting, and starting Ray for the algorithms that need it."""

from __future__ import annotations

import argparse
from typing import Any


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def fmt_flops(f: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP"


def arch_label(a: dict[str, Any]) -> str:
    """``tpuv4 {8, 2, 128, 128, 128}`` from an Accelerator's dict."""
    return (f"{a['name'] or 'custom'} {{{a['num_tc']}, {a['num_vc']}, {a['pe_x']}, {a['pe_y']}, "
            f"{a['pe_vc']}}}")


def model_ref(args) -> str:
    """MODEL, or the reference of ``--hf-config`` (a transformers config.json: ``hf:/abs/path``)."""
    from archplace.workloads.byom import hf_ref

    if args.hf_config and args.model:
        raise ValueError(f"give MODEL or --hf-config, not both (got {args.model!r} and {args.hf_config!r})")
    if args.hf_config:
        return hf_ref(args.hf_config, allow_unmapped_ops=args.allow_unmapped_ops)
    if not args.model:
        raise ValueError("MODEL or --hf-config CONFIG.json is required")
    return args.model


def add_model_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    p.add_argument("--hf-config", metavar="CONFIG.json", action="append" if many else "store",
                   help="any transformers config (the model class from its architectures or model_type), "
                        "instead of a preset" + ("; repeat for several" if many else ""))
    p.add_argument("--allow-unmapped-ops", action="store_true",
                   help="--hf-config: count aten ops archplace has no cost model for as element-wise ops, "
                        "with a warning listing them (default: an error naming them)")
    p.add_argument("--capture-blocks", type=int, default=3, metavar="N",
                   help="leading blocks of each layer stack to capture before the rest are copied "
                        "(default 3; more where a stack's block kinds need them: dense then MoE layers, "
                        "sliding and global attention); at least 3; a stack's depth captures all")


def parse_fixed(text: str | None, flag: str = "--fixed") -> tuple[int, int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{flag} must be p,d,t with three positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be comma-separated positive integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{name} must be comma-separated positive integers, got {text!r}")
    return vals


def float_list(text: str, name: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be comma-separated positive numbers, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise ValueError(f"{name} must be comma-separated positive numbers, got {text!r}")
    return vals


# the preset a request is checked against before its hf: config is read: it imports nothing heavy
_STAND_IN = "bert-base"
_MODEL_FIELDS = frozenset({"model", "models", "capture_blocks", "tp_from"})


def check_before_model(req):
    """Bad input said at once: a request for an ``hf:`` config (reading it imports torch and
    transformers and builds the model: seconds) has its other fields checked first, by its own
    ``validate()`` against a preset standing in for the model: with a valid model, what fails is
    another field (an error naming a field about the model itself is left to the real check).
    Returns ``req``."""
    import dataclasses

    from archplace import api

    model = getattr(req, "model", None)
    if not (isinstance(model, str) and model.startswith("hf:")):
        return req
    stand_in = dataclasses.replace(req, model=_STAND_IN)
    if getattr(req, "tp_from", None) == "shard":
        stand_in = dataclasses.replace(stand_in, tp_from="roles")
    try:
        stand_in.validate()
    except api.InvalidRequest as e:
        if not set(e.fields) & _MODEL_FIELDS:
            raise
    return req


def connect_if_needed(req, address: str | None) -> None:
    """The API never starts Ray: for the algorithms that need it, check the request first (bad input
    fails before Ray starts), then start the embedded Ray or attach to ``--address``."""
    if req.needs_ray:
        req.validate()
        from archplace.platform.search import connect

        connect(address)


OPTIMIZER_HELP = ("optimizer whose state the HBM fit counts, mixed precision as Megatron and ZeRO count it: "
                  "adam = 2 bytes of weights + 2 of gradients + 4 of fp32 master weights + 8 of moments per "
                  "parameter; adafactor = 2 + 2 + 4; sgd = 2 + 2 (the Phaze paper's setting)")
SYNC_MODEL_HELP = ("gradient sync: exposed (default) charges the part of every stage's data-parallel "
                   "AllReduce that the 1F1B schedule cannot hide; paper keeps the Phaze paper's eq. 18 (the "
                   "first stage's sync only, priced by its formula 4(d-1)/d bytes/bw, twice a ring), for "
                   "its ablation")


def add_training_args(p: argparse.ArgumentParser) -> None:
    """--optimizer, --sync-model and --grad-reduce-dtype: how the training step is counted (place,
    search)."""
    p.add_argument("--optimizer", choices=("sgd", "adam", "adafactor"), default="adam", help=OPTIMIZER_HELP)
    p.add_argument("--sync-model", choices=("exposed", "paper"), default="exposed", help=SYNC_MODEL_HELP)
    p.add_argument("--grad-reduce-dtype", choices=("bf16", "fp16", "fp32"), default="bf16",
                   help="the dtype gradients are kept and AllReduced in: bf16 (default, the parameters' "
                        "dtype) or fp32 (twice the gradient memory and AllReduce bytes)")


def add_ilp_budget_args(parser, budget: float, time_limit_s: float) -> None:
    """``--ilp-det-time`` (the work per layer-slice ILP, which decides the answer) and ``--ilp-timeout``
    (the wall-clock safety limit per slice) with a command's defaults; the old ``--ilp-budget`` and
    ``--ilp-time-limit`` keep working with a note."""
    from archplace.cli.vocabulary import positive, renamed

    parser.add_argument("--ilp-det-time", type=positive(float, "deterministic seconds"), default=budget,
                        metavar="DSEC",
                        help="work per layer-slice ILP in deterministic seconds (CP-SAT's deterministic "
                             "time; HiGHS: 1000 nodes per unit); the answer depends on it and not on the "
                             "machine's load, so the same command gives the same placement on an idle and on "
                             f"a busy machine (default {budget:g})")
    parser.add_argument("--ilp-timeout", type=positive(float, "seconds"), default=time_limit_s, metavar="SEC",
                        help="wall-clock safety limit per layer-slice ILP in seconds; a slice it stops "
                             "keeps its best schedule so far and is counted as load-dependent "
                             "(ilp.load_dependent), since that answer depends on the machine's load "
                             f"(default {time_limit_s:g})")
    renamed(parser, "--ilp-budget", "--ilp-det-time", "ilp_det_time",
            type=positive(float, "deterministic seconds"))
    renamed(parser, "--ilp-time-limit", "--ilp-timeout", "ilp_timeout", type=positive(float, "seconds"))


NO_CONTENTION_HELP = ("the paper's model: concurrently running ops each get the full HBM/GLB bandwidth "
                      "(default: they share it, and ops whose demand together exceeds it run one after "
                      "another)")
