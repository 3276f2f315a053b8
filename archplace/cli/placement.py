"""``archplace place`` and ``solve-dp``: the best placement of a model on K accelerators (Phaze), and
the exact max-load split of a dnn-partitioning input.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace import api
from archplace.cli import status
from archplace.cli.common import (
    NO_CONTENTION_HELP,
    add_ilp_budget_args,
    add_model_args,
    add_training_args,
    arch_label,
    model_ref,
    parse_fixed,
)
from archplace.cli.vocabulary import ARCH_HELP, BUDGETS_KEY, add_devices, budgets, positive, refuse, renamed


def _parse_expert(text: str | None, model: str) -> tuple[int, int, int] | None:
    """``--expert p,d,t``, or ``--expert paper``: the Phaze paper's Table 4 strategy for the model."""
    if text != "paper":
        return parse_fixed(text, "--expert")
    from archplace.workloads.models import EXPERT_STRATEGIES

    if model not in EXPERT_STRATEGIES:
        raise ValueError(f"--expert paper: the paper gives no expert placement for {model!r}; it gives one "
                         f"for {sorted(EXPERT_STRATEGIES)} (or pass --expert p,d,t)")
    return EXPERT_STRATEGIES[model]


def _layers_done(info: dict[str, Any]) -> str:
    """The phase after a (microbatch, TMP width) case's layer schedules."""
    i, n = info.get("case", 0), info.get("cases", 0)
    if i >= n:
        return "choosing the pipeline stages and parallelism (DP over the layers)"
    return f"solving layer schedules: {i} of {n} (microbatch, TMP width) cases done"


def _shard_done(info: dict[str, Any]) -> str:
    return "solving layer schedules with the ILP sharding of each TP width"


def cmd_place(args) -> dict[str, Any]:
    from archplace.cli.common import check_before_model

    # without --hbm the accelerator's own (a preset is the chip it names), or 32/64/80 for a design
    req = api.PlaceRequest(model_ref(args), args.arch, accelerators=args.devices,
                           global_batch=args.global_batch, hbm_gb=(args.hbm,) if args.hbm else None,
                           sequential=args.sequential, fixed=parse_fixed(args.fixed), seq=args.seq,
                           expert=_parse_expert(args.expert, args.model),
                           ilp_budget=args.ilp_det_time, ilp_time_limit_s=args.ilp_timeout,
                           contention=not args.no_contention, optimizer=args.optimizer,
                           sync_model=args.sync_model, grad_reduce_dtype=args.grad_reduce_dtype,
                           capture_blocks=args.capture_blocks,
                           tp_from=args.tp_from)
    stages = status.stages({"layers": _layers_done, "shard": _shard_done})
    res = api.place(check_before_model(req), progress=stages).to_dict()
    res[BUDGETS_KEY] = {} if args.sequential else budgets(ilp_det_time_s=args.ilp_det_time,
                                                          ilp_timeout_s=args.ilp_timeout)
    return res


def _gap_text(ilp: dict[str, Any]) -> str:
    """``worst gap 3.1% (backward of layer …, microbatch 4, tmp 1)``; the unknown-gap count too."""
    g, w = ilp.get("worst_gap"), ilp.get("worst_slice")
    text = "worst gap unknown" if g is None else f"worst gap {g:.1%}"
    if g and w:
        layers = w["layers"]
        text += (f" ({w['pass']} of {layers[0]}{f' and {len(layers) - 1} more' if len(layers) > 1 else ''}"
                 + (f", microbatch {w['microbatch']}, tmp {w['tmp']}" if "microbatch" in w else "") + ")")
    if ilp.get("gap_unknown"):
        text += f"; {ilp['gap_unknown']} slice(s) without a proven bound"
    return text


def _print_ilp(ilp: dict[str, Any], schedule: str) -> None:
    """One line: the layer-slice ILPs' solver statuses and the worst gap."""
    if schedule != "ilp":
        print("  layer ILP    not used (sequential schedules: every op intra-op parallel)")
        return
    counts = ilp.get("status_counts")
    if counts is None:
        return
    n = sum(counts.values())
    print(f"  layer ILP    {n} distinct slice(s): " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
          + f"; {_gap_text(ilp)}")
    stops, budget = ilp.get("stopped_by") or {}, ilp.get("budget") or {}
    if stops:
        print("  ILP stops    " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(stops.items()))
              + (f" (budget {budget['dtime_per_slice']:g} deterministic s per slice)" if budget else ""))
    if ilp.get("load_dependent"):
        print(f"  warning      {ilp['load_dependent']} slice(s) stopped by the wall-clock safety limit or a "
              "solver failure: their schedules, and so this answer, may differ on a machine under another "
              "load; raise --ilp-timeout (or lower --ilp-det-time)")
    if ilp.get("contention") is False:
        print("  bandwidth    the paper's model: concurrent ops each get the full HBM/GLB bandwidth")
    elif ilp.get("peak_hbm_share") is not None:
        print(f"  bandwidth    shared; peak summed share HBM {ilp['peak_hbm_share']:.2f}, "
              f"GLB {ilp.get('peak_glb_share') or 0.0:.2f}")


def print_place(res: dict[str, Any]) -> None:
    pl = res["placement"]
    a = res["arch"]
    what = {"expert": "expert placement, even block split", "fixed": "fixed p,d,t, DP stage split"}
    print(f"{res['model']} on {res['accelerators']} × {arch_label(a)}, global batch "
          f"{res['global_batch']} [{res['schedule']} layer schedules"
          + (f"; {what[res['strategy']]}" if res.get("strategy") in what else "") + "]")
    _print_ilp(res.get("ilp") or {}, res["schedule"])
    if not pl["feasible"]:
        print(f"  infeasible: {pl.get('reason') or 'no placement fits (no reason given)'}")
        h = res.get("hbm") or {}
        if h:
            print(f"  HBM tried    {', '.join(f'{x:g}' for x in h['tried_gb'])} GiB ({h['source']})")
        return
    print(f"  throughput   {res['throughput']:.2f} samples/s ({pl['time_per_batch_s']:.3f} s per batch)")
    print(f"  placement    p={pl['p']} d={pl['d']} t={pl['t']}, microbatch {pl['microbatch']}, "
          f"{'recompute' if pl['recompute'] else 'stash'}, HBM {pl['hbm_gb']:g} GiB "
          f"({(res.get('hbm') or {}).get('source', 'asked')}), "
          f"{res.get('optimizer', 'adam')} optimizer state")
    worst = max(range(len(pl["stages"])), key=lambda k: pl["stages"][k]["exposed_s"], default=None)
    if worst is not None:
        st = pl["stages"][worst]
        model = ("the paper's eq. 18: the first stage's AllReduce only" if pl.get("sync_model") == "paper"
                 else "the part of each stage's AllReduce the 1F1B schedule cannot hide")
        print(f"  grad sync    {pl['exposed_sync_s'] * 1e3:.2f} ms exposed ({model}); largest at stage "
              f"{worst}: sync {st['sync_s'] * 1e3:.2f} ms, window {st['window_s'] * 1e3:.2f} ms")
    for i, st in enumerate(pl["stages"]):
        print(f"  stage {i:3d}    layers {st['first']}..{st['last']} ({' … '.join(st['layers'])}) on "
              f"{st['devices']} device(s), load {st['load_s'] * 1e3:.2f} ms, "
              f"memory {st['memory_bytes'] / 2**30:.2f} GiB")
    t = res["timing_s"]
    print(f"  time         estimate {t['estimate_s']:.2f} s, ILP {t['ilp_s']:.2f} s, DP {t['dp_s']:.2f} s")
    _print_tp_source(res.get("tp_source"), res["throughput"])


def _print_tp_source(src: dict[str, Any] | None, throughput: float) -> None:
    """``--tp-from shard``: per TP width where the ILP sharding differs from the role tables, and the
    role tables' placement beside this one."""
    if not src:
        return
    for t, w in sorted(src["widths"].items(), key=lambda kv: int(kv[0])):
        same = "equals the role tables" if w["equals_role_tables"] else "; ".join(w["differences"])
        print(f"  tp {t:>3}       from shard --algo ilp (batch {src['batch']}, {w['shard_status']}): {same}")
        for n in w["not_applied"][:4]:
            print(f"               not applied: {n}")
    ro = src.get("roles") or {}
    if ro.get("feasible"):
        p = ro["placement"]
        print(f"  role tables  {ro['throughput']:.2f} samples/s (p={p['p']} d={p['d']} t={p['t']}); "
              f"from shard {throughput:.2f} samples/s")
    else:
        print(f"  role tables  infeasible: {ro.get('reason')}")


def cmd_solve_dp(args) -> dict[str, Any]:
    req = api.SolveDpRequest(args.file, method=args.method, time_limit_s=args.timeout)
    return {**api.solve_dp(req).to_dict(), BUDGETS_KEY: budgets(timeout_s=args.timeout)}


def print_solve_dp(res: dict[str, Any]) -> None:
    ml = res["max_load"]
    print(f"{res['file']}: max-load {ml if ml is None else format(ml, '.10g')} ({res['status']}, "
          f"method {res['method']}, {res['solve_time_s']:.2f} s)")
    if res.get("reason"):
        print(f"  no split     {res['reason']}")
    if res.get("reference") is not None:
        print(f"  reference optimum {res['reference']:.10g}, relative difference {res['rel_diff']:.2e}")
    if res.get("gap"):
        print(f"  lower bound {res['lower_bound']:.10g}, gap {res['gap']:.2%}")
    for dev in res.get("devices", []) if ml is not None else []:
        name = f"{dev['kind']} {dev['index']}"
        print(f"  {name:14s} load {dev['load']:.6g}  nodes {dev['nodes']}")


def add_place_parser(sub) -> None:
    pl = sub.add_parser("place", help="best placement of a model on K copies of an accelerator")
    pl.add_argument("model", nargs="?", help="preset name")
    add_model_args(pl)
    pl.add_argument("--arch", required=True, metavar="NAME|FILE", help=ARCH_HELP)
    refuse(pl, ("--gpu",), "place takes --arch NAME|FILE (an accelerator template); GPUs are placed by "
                           "place-ops, pipeline and shard --gpu NAME")
    add_devices(pl, "accelerators: copies of --arch (default 1024)", default=1024, old=("--accelerators",))
    pl.add_argument("--global-batch", type=int, default=4096)
    pl.add_argument("--fixed", metavar="P,D,T",
                    help="fixed {p,d,t}, optimised split: the DP still chooses which layers form each stage")
    pl.add_argument("--expert", metavar="P,D,T|paper",
                    help="evaluate exactly the expert placement {p,d,t} (paper: the Phaze paper's Table 4 "
                         "strategy for MODEL): an even split of the transformer blocks over p stages, as "
                         "bench/phaze/phaze_tpuv4.py")
    pl.add_argument("--hbm", type=float,
                    help="HBM size in GiB (default: the accelerator's own, e.g. 32 for tpuv4; 32, 64 and 80 "
                         "are tried for an architecture file that gives no hbm_gb)")
    pl.add_argument("--seq", type=int, default=None)
    pl.add_argument("--sequential", action="store_true",
                    help="layer schedules without the ILP: every op intra-op parallel in sequence")
    add_ilp_budget_args(pl, api.PlaceRequest.ilp_budget, api.PlaceRequest.ilp_time_limit_s)
    pl.add_argument("--no-contention", action="store_true", help=NO_CONTENTION_HELP)
    add_training_args(pl)
    pl.add_argument("--tp-from", choices=api.placement.TP_FROM, default="roles",
                    help="TP slices from the built-in role tables (roles, default) or from the sharding "
                         "`archplace shard --algo ilp` finds at each width (shard; the role tables' "
                         "placement is reported beside it)")
    pl.add_argument("--json", action="store_true")


def add_solve_dp_parser(sub) -> None:
    sd = sub.add_parser("solve-dp", help="optimal max-load split of a dnn-partitioning input")
    sd.add_argument("file")
    sd.add_argument("--method", default="auto", choices=["auto", "dp", "milp"])
    sd.add_argument("--timeout", type=positive(float, "seconds"), default=600.0, metavar="SEC",
                    help="wall-clock limit of the MILP in seconds (default 600)")
    renamed(sd, "--time-limit", "--timeout", "timeout", type=positive(float, "seconds"))
    sd.add_argument("--json", action="store_true")
