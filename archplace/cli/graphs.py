"""``archplace`` ``models``, ``graph``, ``estimate``: what a model is and what it costs on an accelerator.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

from typing import Any

from archplace import api
from archplace.cli import status
from archplace.cli.common import OPTIMIZER_HELP, add_model_args, arch_label, fmt_bytes, fmt_flops, model_ref
from archplace.cli.vocabulary import ARCH_HELP, add_devices, count, gpu_help
from archplace.hardware.gpus import GPUS


def _graph_written(args):
    """The phase after a graph is built: writing it (--out), or nothing more to do."""
    return f"writing {args.out}" if args.out else None


def cmd_models(args) -> dict[str, Any]:
    from archplace.workloads.models import PRESETS

    return {"models": [{"name": p.name, "class": p.model_class, "seq": p.seq_len,
                        "tmp_widths": list(p.tmp_widths), "source": p.source,
                        "blocks": sum(p.depths.values())} for p in PRESETS.values()],
            "other_sources": ["any transformers config: --hf-config config.json",
                              "dnn-partitioning JSON file (path ending in .json)",
                              "archplace graph Parquet file (path ending in .parquet)"]}


def print_models(res: dict[str, Any]) -> None:
    print(f"{'model':15s} {'transformers class':28s} {'seq':>5s} {'blocks':>6s}  tmp widths  source")
    for m in res["models"]:
        print(f"{m['name']:15s} {m['class']:28s} {m['seq']:5d} {m['blocks']:6d}  "
              f"{','.join(map(str, m['tmp_widths'])):10s}  {m['source']}")
    print("also accepted as MODEL: " + "; ".join(res["other_sources"]))


def cmd_graph(args) -> dict[str, Any]:
    from archplace.cli.common import check_before_model

    req = api.GraphRequest(model_ref(args), seq=args.seq, mbs=args.mbs, tmp=args.tmp, out=args.out,
                           capture_blocks=args.capture_blocks)
    return api.graph(check_before_model(req), progress=status.stages({"graph": _graph_written(args)})
                     ).to_dict()


def print_graph(res: dict[str, Any]) -> None:
    print(f"{res['model']}  (seq {res['seq']}, microbatch {res['mbs']}, tmp {res['tmp']})")
    print(f"  ops          {res['ops']:,} ({res['forward_ops']:,} forward, "
          f"{res['backward_ops']:,} backward), {res['edges']:,} edges")
    print("  ops by core  " + ", ".join(f"{k} {v}" for k, v in res["ops_by_core"].items()))
    print(f"  layers       {res['layers']} ({res.get('unique_layers', '-')} unique)")
    for st, s in (res.get("stacks") or {}).items():
        print(f"  stack        {st}: {s['blocks']} blocks of {s['kinds']} kind(s), {s['captured']} captured")
    print(f"  parameters   {res['parameters']:,} ({fmt_bytes(res['weight_bytes'])})")
    print(f"  flops        forward {fmt_flops(res['forward_flops'])}, "
          f"backward {fmt_flops(res['backward_flops'])}")
    print(f"  activations  {fmt_bytes(res['activation_bytes'])} kept for backward")
    for grp in res["repeated_layer_groups"]:
        if grp["count"] > 1:
            print(f"  repeated     {grp['count']} × {grp['layers'][0]} … {grp['layers'][-1]}")
    if "out" in res:
        print(f"  written      {res['out']}")
    if res.get("unmapped_ops"):
        print(f"  WARNING      unmapped ops counted as element-wise: {', '.join(res['unmapped_ops'])}")


_GPU_ONLY = ("dtype", "attention", "op_model", "profile", "global_batch")


def cmd_estimate(args) -> dict[str, Any]:
    """``--arch``: per-op latency on an accelerator; ``--gpu``: one training step on one GPU."""
    from archplace.cli.common import check_before_model

    if args.gpu is not None:
        if args.arch is not None:
            raise ValueError(f"give --arch (an accelerator) or --gpu (a GPU), not both (got {args.arch!r} "
                             f"and {args.gpu!r})")
        if args.backend is not None or args.tmp != 1:
            raise ValueError("--backend and --tmp apply to --arch (an accelerator), not --gpu")
        req = api.GpuEstimateRequest(model_ref(args), args.gpu, mbs=args.mbs, seq=args.seq,
                                     dtype=args.dtype or "bf16", attention=args.attention or "eager",
                                     op_model=args.op_model, profile=args.profile,
                                     capture_blocks=args.capture_blocks, optimizer=args.optimizer,
                                     global_batch=args.global_batch)
        return api.estimate_gpu(check_before_model(req),
                                progress=status.stages({"graph": "estimating the training step"})).to_dict()
    if args.arch is None:
        raise ValueError("--arch ACCELERATOR or --gpu NAME is required")
    given = [f"--{f.replace('_', '-')}" for f in _GPU_ONLY if getattr(args, f) is not None]
    if given:
        raise ValueError(f"{', '.join(given)} appl{'y' if len(given) > 1 else 'ies'} to --gpu, not --arch")
    req = api.EstimateRequest(model_ref(args), args.arch, mbs=args.mbs, tmp=args.tmp, seq=args.seq,
                              backend=args.backend or "analytical", optimizer=args.optimizer,
                              capture_blocks=args.capture_blocks)
    return api.estimate(check_before_model(req),
                        progress=status.stages({"graph": "estimating the operators' latencies"})).to_dict()


def _print_profiled(res: dict[str, Any]) -> None:
    """A profiled graph's measured latencies, in the file's own time unit (no ms / µs labels)."""
    t = res["totals"]
    print(f"{res['model']}: measured latencies from the file [profiled]")
    print(f"  note         {res['note']}")
    print(f"  sum of ops   {t['sequential_single_core_s']:.6g} (forward {t['forward_s']:.6g}, "
          f"backward {t['backward_s']:.6g}), in the file's unit")
    top = sorted(res["ops"], key=lambda o: -o["single_core_s"])[:12]
    print(f"  {'slowest ops':58s} {'latency':>12s}")
    for o in top:
        print(f"  {o['name'][:58]:58s} {o['single_core_s']:12.6g}")


def _print_gpu_estimate(res: dict[str, Any]) -> None:
    om = res["op_model"]
    print(f"{res['model']} on one {res['gpu']['label']} ({res['gpu']['name']}), {res['dtype']}, "
          f"microbatch {res['mbs']}, seq {res['seq']}, attention {res['attention']}  [{om['op_model']}]")
    print(f"  op model     {om['note']}")
    if om.get("bias"):
        print(f"  bias         {om['bias']}")
    fl = res["achieved_flops_per_s"]
    n = res.get("microbatches", 1)
    opt = res.get("optimizer")
    micro_s = res.get("microbatch_time_s") or res["step_time_s"]
    upd = (f" + {opt['optimizer']} update {res['optimizer_s'] * 1e3:.3f} ms ({opt['bytes_per_param']:g} B x "
           f"{opt['params'] / 1e9:.3g} G params at {opt['hbm_bytes_per_s'] / 1e12:.2f} TB/s)") if opt else ""
    print(f"  step         {res['step_time_s'] * 1e3:.3f} ms = "
          + (f"{n} micro-batches x " if n > 1 else "micro-batch ")
          + f"{micro_s * 1e3:.3f} ms (forward {res['forward_s'] * 1e3:.3f}, backward "
          f"{res['backward_s'] * 1e3:.3f}){upd}; global batch {res.get('global_batch') or res['mbs']}")
    print(f"  compute      {fmt_flops(n * res['flops'])}"
          + (f", {fl / 1e12:.1f} TFLOP/s achieved" if fl else "")
          + (f", MFU {res['mfu']:.1%}" if res.get("mfu") is not None else ""))
    fa = res.get("fused_attention")
    if fa:
        left = f"; left eager: {fa['left_eager']}" if fa["left_eager"] else ""
        print(f"  attention    {fa['ops']} eager attention(s) fused (FlashAttention, SRAM "
              f"{fmt_bytes(fa['sram_bytes'])}){left}")
    mem = res["memory"]
    print(f"  memory       {fmt_bytes(mem['total_bytes'])}: weights {fmt_bytes(mem['weight_bytes'])}, "
          f"gradients {fmt_bytes(mem['gradient_bytes'])}, {mem['optimizer']} state "
          f"{fmt_bytes(mem['optimizer_bytes'])}, activations {fmt_bytes(mem['activation_bytes'])}"
          + (f" (GPU {fmt_bytes(mem['gpu_bytes'])})" if mem.get("gpu_bytes") else ""))
    if res.get("fits") is False:
        print(f"  WARNING      does not fit: {res['reason']}")
    print("  by kind (one micro-batch) " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in
                                      sorted(res["by_kind_s"].items(), key=lambda kv: -kv[1]) if v))
    rows = res["layers"]
    shown = rows if len(rows) <= 8 else [*rows[:4], None, *rows[-3:]]
    print(f"  {'layer':40s} {'ms':>10s} {'fwd ms':>10s} {'bwd ms':>10s}")
    for r in shown:
        if r is None:
            print(f"  … {len(rows) - 7} more")
            continue
        print(f"  {r['name'][:40]:40s} {r['time_s'] * 1e3:10.3f} {r['forward_s'] * 1e3:10.3f} "
              f"{r['backward_s'] * 1e3:10.3f}")


def print_estimate(res: dict[str, Any]) -> None:
    if "step_time_s" in res:
        _print_gpu_estimate(res)
        return
    if res.get("reason"):
        print(f"{res['model']}: all latencies are 0: {res['reason']}")
    if res["backend"] == "profiled":
        _print_profiled(res)
        return
    t = res["totals"]
    a = res["arch"]
    print(f"{res['model']} on {arch_label(a)} glb {a['glb_mb']:g} MB, {res['area_mm2']:.1f} mm², "
          f"{res['peak_flops'] / 1e12:.1f} TFLOP/s peak  [{res['backend']}]")
    print(f"  every op in sequence on one core : {t['sequential_single_core_s'] * 1e3:10.3f} ms "
          f"(forward {t['forward_s'] * 1e3:.3f}, backward {t['backward_s'] * 1e3:.3f})")
    print(f"  every op on all cores of its type: {t['all_cores_s'] * 1e3:10.3f} ms")
    mem = res.get("memory")
    if mem:
        print(f"  training memory  {fmt_bytes(mem['total_bytes'])} per device: weights "
              f"{fmt_bytes(mem['weight_bytes'])}, gradients {fmt_bytes(mem['gradient_bytes'])}, "
              f"{mem['optimizer']} state {fmt_bytes(mem['optimizer_bytes'])}, activations "
              f"{fmt_bytes(mem['activation_bytes'])}")
    print("  by core (one core): " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                               for k, v in t["by_core_single_s"].items() if v))
    top = sorted(res["ops"], key=lambda o: -o["single_core_s"])[:12]
    print(f"  {'slowest ops':58s} {'core':6s} {'1 core µs':>11s} {'all µs':>10s}")
    for o in top:
        print(f"  {o['name'][:58]:58s} {o['core']:6s} {o['single_core_s'] * 1e6:11.1f} "
              f"{o['all_cores_s'] * 1e6:10.1f}")


def add_models_parser(sub) -> None:
    m = sub.add_parser("models", help="known model names and their sources")
    m.add_argument("--json", action="store_true")


def add_graph_parser(sub) -> None:
    g = sub.add_parser("graph", help="extract a model's training operator graph")
    g.add_argument("model", nargs="?", help="preset name, dnn-partitioning .json or archplace .parquet")
    add_model_args(g)
    g.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    g.add_argument("--mbs", type=int, default=1, help="microbatch size")
    g.add_argument("--tmp", type=int, default=1, help="tensor-model-parallel width (one slice)")
    g.add_argument("--out", help="write the graph to this Parquet file")
    g.add_argument("--json", action="store_true")


def add_estimate_parser(sub) -> None:
    e = sub.add_parser("estimate", help="per-op latency of a model on an accelerator (--arch), or its "
                                        "training step on one GPU (--gpu)")
    e.add_argument("model", nargs="?", help="preset name, dnn-partitioning .json or archplace .parquet")
    add_model_args(e)
    e.add_argument("--arch", default=None, metavar="NAME|FILE", help=ARCH_HELP)
    e.add_argument("--gpu", default=None, metavar="NAME|FILE",
                   help=gpu_help(GPUS, ": one training step on one GPU instead of --arch"))
    add_devices(e, "devices: 1 (estimate costs one accelerator or one GPU; place, place-ops, pipeline and "
                   "shard take more)", default=1,
                type=count(low=1, high=1, why=" (estimate costs one device; place, place-ops, pipeline "
                                             "and shard take more)"))
    e.add_argument("--backend", choices=["analytical", "zigzag"], default=None,
                   help="--arch: cost backend (default analytical)")
    e.add_argument("--seq", type=int, default=None)
    e.add_argument("--mbs", type=int, default=1)
    e.add_argument("--tmp", type=int, default=1, help="--arch: tensor-model-parallel width (one slice)")
    e.add_argument("--dtype", choices=api.gpu_estimate.GPU_DTYPES, default=None,
                   help="--gpu: training precision (default bf16)")
    e.add_argument("--attention", choices=api.gpu_estimate.ATTENTION, default=None,
                   help="--gpu: eager (default, as captured: the score matrix goes through HBM) or sdpa "
                        "(fused, FlashAttention's IO-aware traffic)")
    e.add_argument("--op-model", choices=("roofline", "calibrated", "profiled"), default=None,
                   help="--gpu: op-time model (default calibrated: measured on the H200, scaled by peak "
                        "ratios on the other GPUs; roofline is 22-32%% optimistic on published A100 runs)")
    e.add_argument("--global-batch", type=int, default=None,
                   help="--gpu: samples per optimizer step, a multiple of --mbs: the step runs global-batch "
                        "/ mbs micro-batches (gradient accumulation), then the optimizer update "
                        "(default: --mbs)")
    e.add_argument("--profile", default=None, metavar="FILE",
                   help="--gpu: measured op times (archplace profile); implies --op-model profiled")
    e.add_argument("--optimizer", choices=("sgd", "adam", "adafactor"), default="adam", help=OPTIMIZER_HELP)
    e.add_argument("--json", action="store_true")
