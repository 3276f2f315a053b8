"""The ``archplace`` command line (contract in DESIGN.md): a human summary by default, one JSON
object with ``--json``. Bad input ends with a one-line error and exit status 2, never a traceback.

A thin layer over ``archplace.api``: each ``cmd_*`` turns argv into a request, calls the API and
returns ``result.to_dict()``; the ``print_*`` functions write the human summaries."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from archplace import api


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _fmt_flops(f: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if f >= scale:
            return f"{f / scale:.2f} {unit}"
    return f"{f:.0f} FLOP"


def _model(args) -> str:
    """MODEL, or the reference of ``--hf-config`` (a transformers config.json: ``hf:/abs/path``)."""
    from archplace.workloads.byom import hf_ref

    if args.hf_config and args.model:
        raise ValueError(f"give MODEL or --hf-config, not both (got {args.model!r} and {args.hf_config!r})")
    if args.hf_config:
        return hf_ref(args.hf_config, allow_unmapped_ops=args.allow_unmapped_ops)
    if not args.model:
        raise ValueError("MODEL or --hf-config CONFIG.json is required")
    return args.model


def _add_model_args(p: argparse.ArgumentParser, many: bool = False) -> None:
    p.add_argument("--hf-config", metavar="CONFIG.json", action="append" if many else "store",
                   help="any transformers config (the model class from its architectures or model_type), "
                        "instead of a preset" + ("; repeat for several" if many else ""))
    p.add_argument("--allow-unmapped-ops", action="store_true",
                   help="--hf-config: count aten ops archplace has no cost model for as element-wise ops, "
                        "with a warning listing them (default: an error naming them)")


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
    req = api.GraphRequest(_model(args), seq=args.seq, mbs=args.mbs, tmp=args.tmp, out=args.out)
    return api.graph(req).to_dict()


def print_graph(res: dict[str, Any]) -> None:
    print(f"{res['model']}  (seq {res['seq']}, microbatch {res['mbs']}, tmp {res['tmp']})")
    print(f"  ops          {res['ops']:,} ({res['forward_ops']:,} forward, "
          f"{res['backward_ops']:,} backward), {res['edges']:,} edges")
    print("  ops by core  " + ", ".join(f"{k} {v}" for k, v in res["ops_by_core"].items()))
    print(f"  layers       {res['layers']} ({res.get('unique_layers', '-')} unique)")
    print(f"  parameters   {res['parameters']:,} ({_fmt_bytes(res['weight_bytes'])})")
    print(f"  flops        forward {_fmt_flops(res['forward_flops'])}, "
          f"backward {_fmt_flops(res['backward_flops'])}")
    print(f"  activations  {_fmt_bytes(res['activation_bytes'])} kept for backward")
    for grp in res["repeated_layer_groups"]:
        if grp["count"] > 1:
            print(f"  repeated     {grp['count']} × {grp['layers'][0]} … {grp['layers'][-1]}")
    if "out" in res:
        print(f"  written      {res['out']}")
    if res.get("unmapped_ops"):
        print(f"  WARNING      unmapped ops counted as element-wise: {', '.join(res['unmapped_ops'])}")


def cmd_estimate(args) -> dict[str, Any]:
    req = api.EstimateRequest(_model(args), args.arch, mbs=args.mbs, tmp=args.tmp, seq=args.seq,
                              backend=args.backend)
    return api.estimate(req).to_dict()


def _arch_label(a: dict[str, Any]) -> str:
    """``tpuv4 {8, 2, 128, 128, 128}`` from an Accelerator's dict."""
    return (f"{a['name'] or 'custom'} {{{a['num_tc']}, {a['num_vc']}, {a['pe_x']}, {a['pe_y']}, "
            f"{a['pe_vc']}}}")


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


def print_estimate(res: dict[str, Any]) -> None:
    if res.get("reason"):
        print(f"{res['model']}: all latencies are 0: {res['reason']}")
    if res["backend"] == "profiled":
        _print_profiled(res)
        return
    t = res["totals"]
    a = res["arch"]
    print(f"{res['model']} on {_arch_label(a)} glb {a['glb_mb']:g} MB, {res['area_mm2']:.1f} mm², "
          f"{res['peak_flops'] / 1e12:.1f} TFLOP/s peak  [{res['backend']}]")
    print(f"  every op in sequence on one core : {t['sequential_single_core_s'] * 1e3:10.3f} ms "
          f"(forward {t['forward_s'] * 1e3:.3f}, backward {t['backward_s'] * 1e3:.3f})")
    print(f"  every op on all cores of its type: {t['all_cores_s'] * 1e3:10.3f} ms")
    print("  by core (one core): " + ", ".join(f"{k} {v * 1e3:.3f} ms"
                                               for k, v in t["by_core_single_s"].items() if v))
    top = sorted(res["ops"], key=lambda o: -o["single_core_s"])[:12]
    print(f"  {'slowest ops':58s} {'core':6s} {'1 core µs':>11s} {'all µs':>10s}")
    for o in top:
        print(f"  {o['name'][:58]:58s} {o['core']:6s} {o['single_core_s'] * 1e6:11.1f} "
              f"{o['all_cores_s'] * 1e6:10.1f}")


def _parse_fixed(text: str | None, flag: str = "--fixed") -> tuple[int, int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"{flag} must be p,d,t with three positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def _parse_expert(text: str | None, model: str) -> tuple[int, int, int] | None:
    """``--expert p,d,t``, or ``--expert paper``: the Phaze paper's Table 4 strategy for the model."""
    if text != "paper":
        return _parse_fixed(text, "--expert")
    from archplace.workloads.models import EXPERT_STRATEGIES

    if model not in EXPERT_STRATEGIES:
        raise ValueError(f"--expert paper: the paper gives no expert placement for {model!r}; it gives one "
                         f"for {sorted(EXPERT_STRATEGIES)} (or pass --expert p,d,t)")
    return EXPERT_STRATEGIES[model]


def cmd_place(args) -> dict[str, Any]:
    # without --hbm the sizes stay ints, as before: the JSON's configs rows echo them ("hbm_gb": 32)
    req = api.PlaceRequest(_model(args), args.arch, accelerators=args.accelerators,
                           global_batch=args.global_batch, hbm_gb=(args.hbm,) if args.hbm else (32, 64, 80),
                           sequential=args.sequential, fixed=_parse_fixed(args.fixed), seq=args.seq,
                           expert=_parse_expert(args.expert, args.model),
                           ilp_time_limit_s=args.ilp_time_limit, contention=not args.no_contention)
    return api.place(req).to_dict()


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
    if ilp.get("contention") is False:
        print("  bandwidth    the paper's model: concurrent ops each get the full HBM/GLB bandwidth")
    elif ilp.get("peak_hbm_share") is not None:
        print(f"  bandwidth    shared; peak summed share HBM {ilp['peak_hbm_share']:.2f}, "
              f"GLB {ilp.get('peak_glb_share') or 0.0:.2f}")


def print_place(res: dict[str, Any]) -> None:
    pl = res["placement"]
    a = res["arch"]
    what = {"expert": "expert placement, even block split", "fixed": "fixed p,d,t, DP stage split"}
    print(f"{res['model']} on {res['accelerators']} × {_arch_label(a)}, global batch "
          f"{res['global_batch']} [{res['schedule']} layer schedules"
          + (f"; {what[res['strategy']]}" if res.get("strategy") in what else "") + "]")
    _print_ilp(res.get("ilp") or {}, res["schedule"])
    if not pl["feasible"]:
        print(f"  infeasible: {pl.get('reason') or 'no placement fits (no reason given)'}")
        return
    print(f"  throughput   {res['throughput']:.2f} samples/s ({pl['time_per_batch_s']:.3f} s per batch)")
    print(f"  placement    p={pl['p']} d={pl['d']} t={pl['t']}, microbatch {pl['microbatch']}, "
          f"{'recompute' if pl['recompute'] else 'stash'}, HBM {pl['hbm_gb']:g} GB")
    for i, st in enumerate(pl["stages"]):
        print(f"  stage {i:3d}    layers {st['first']}..{st['last']} ({' … '.join(st['layers'])}) on "
              f"{st['devices']} device(s), load {st['load_s'] * 1e3:.2f} ms, "
              f"memory {st['memory_bytes'] / 2**30:.2f} GiB")
    t = res["timing_s"]
    print(f"  time         estimate {t['estimate_s']:.2f} s, ILP {t['ilp_s']:.2f} s, DP {t['dp_s']:.2f} s")


def cmd_solve_dp(args) -> dict[str, Any]:
    req = api.SolveDpRequest(args.file, method=args.method, time_limit_s=args.time_limit)
    return api.solve_dp(req).to_dict()


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


def _int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be comma-separated positive integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise ValueError(f"{name} must be comma-separated positive integers, got {text!r}")
    return vals


def _float_list(text: str, name: str) -> tuple[float, ...]:
    try:
        vals = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{name} must be comma-separated positive numbers, got {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise ValueError(f"{name} must be comma-separated positive numbers, got {text!r}")
    return vals


def cmd_search(args) -> dict[str, Any]:
    from archplace.workloads.byom import hf_ref

    models = tuple(args.models) + tuple(hf_ref(c, allow_unmapped_ops=args.allow_unmapped_ops)
                                        for c in args.hf_config or ())
    if not models:
        raise ValueError("give one or more MODELs or --hf-config CONFIG.json")
    req = api.SearchRequest(
        models=models, out_dir=args.out, accelerators=args.accelerators,
        global_batch=args.global_batch, searcher=args.searcher, budget=args.budget, address=args.address,
        resume=args.resume, retry_failed=args.retry_failed, workers=args.workers,
        archs_per_trial=args.archs_per_trial, schedule=args.schedule, schedule_cache=args.schedule_cache,
        wait_timeout_s=args.wait_timeout, microbatches=_int_list(args.microbatches, "--microbatches"),
        hbm_gb=_float_list(args.hbm, "--hbm"), recompute=args.recompute, seq=args.seq,
        tmp_widths=_int_list(args.tmp_widths, "--tmp-widths") if args.tmp_widths else None,
        ilp_time_limit_s=args.ilp_time_limit, space=args.space, hysteresis=args.hysteresis,
        area_bucket_mm2=args.area_bucket, seed=args.seed, max_failures=args.max_failures,
        contention=not args.no_contention)
    return api.search(req, terminal_progress=not args.json).to_dict()


def print_search(res: dict[str, Any]) -> None:
    st = res.get("stats", {})
    print(f"search of {', '.join(res['models'])} on {res['num_devices']} accelerators, global batch "
          f"{res['global_batch']} [{res['searcher']}]: {res['evaluated']} architectures "
          f"({st.get('resumed', 0)} resumed, {res['failed']} failed) in {st.get('wall_s', 0):.1f} s "
          f"with up to {max(st.get('in_flight_limits') or [0])} trials in flight")
    cache = st.get("cache")
    if cache and cache.get("layer_lookups"):
        print(f"  layer ILPs   {cache['layer_lookups']} layer lookups; {cache['within_arch_dedup']} "
              f"({cache['within_arch_dedup_rate']:.0%}) were repeated layers inside one architecture; of the "
              f"{cache['distinct_per_arch']} distinct slices {cache['cross_trial_hits']} came from the "
              f"schedule "
              f"cache ({cache['cross_trial_hit_rate']:.0%}) and {cache['solved']} were solved")
    ilp = st.get("ilp")
    if ilp is not None:
        n = sum(ilp["status_counts"].values())
        g = ilp["worst_gap"]
        at = ilp.get("worst_gap_at") or {}
        print(f"  ILP answers  {n} slice solves over architectures × models: "
              + ", ".join(f"{v} {k}" for k, v in sorted(ilp["status_counts"].items()))
              + ("; worst gap unknown" if g is None else f"; worst gap {g:.1%}")
              + (f" ({at['model']} on {at['arch_label']})" if g and at else "")
              + (f"; {ilp['gap_unknown']} without a proven bound" if ilp.get("gap_unknown") else ""))
    c = res.get("common")
    if c is None:
        print("  no architecture gave a feasible placement"
              + (f" ({res['infeasible']} infeasible, {res['failed']} failed; the reasons are in the "
                 f"'error' column of {res['out_dir']}/evaluations.parquet)" if res.get("evaluated") else ""))
    else:
        print(f"  best common  {c['arch_label']}  area {c['area_mm2']:.2f} mm²  "
              f"average {c['throughput_avg']:,.1f} samples/s")
    ref = (res.get("reference") or {}).get("per_model", {})
    for m, b in res.get("per_model", {}).items():
        r = ref.get(m, {})
        vs = res.get("speedup_vs_reference", {}).get(m)
        print(f"  {m:14s} best {b['arch_label']}: {b['throughput']:,.1f} samples/s "
              f"(p={b['p']} d={b['d']} t={b['t']}, mbs {b['microbatch']})"
              + (f"; tpuv4 {r['throughput']:,.1f} → {vs:.3f}×" if vs else "")
              + (f"; ILP {', '.join(f'{v} {k}' for k, v in sorted(b['ilp_status'].items()))}, "
                 + ("worst gap unknown" if b.get("ilp_worst_gap") is None else
                    f"worst gap {b['ilp_worst_gap']:.1%}") if b.get("ilp_status") else ""))
    for m, reasons in (st.get("no_placement") or {}).items():
        top, n = next(iter(reasons.items()))
        print(f"  {m:14s} no feasible placement on any architecture evaluated; most often: {top} "
              f"({n} of {sum(reasons.values())})")
    out = res["out_dir"]
    print(f"  results      {out}/evaluations.parquet, {out}/best.json, {out}/report.md")


def cmd_report(args) -> dict[str, Any]:
    from archplace.platform.report import write_report

    path = write_report(args.dir)
    return {"report": str(path)}


def print_report(res: dict[str, Any]) -> None:
    print(f"wrote {res['report']}")


def _connect_if_needed(req, address: str | None) -> None:
    """The API never starts Ray: for the algorithms that need it, check the request first (bad input
    fails before Ray starts), then start the embedded Ray or attach to ``--address``."""
    if req.needs_ray:
        req.validate()
        from archplace.platform.search import connect

        connect(address)


def cmd_partition(args) -> dict[str, Any]:
    req = api.PartitionRequest(args.model, chiplets=args.chiplets, algo=args.algo, budget=args.budget,
                               seed=args.seed, seq=args.seq, mbs=args.mbs, pretrained=args.pretrained,
                               zero_shot=args.zero_shot, env_runners=args.env_runners,
                               learners=args.learners, config=args.config, polish=args.polish)
    _connect_if_needed(req, args.address)
    return api.partition(req).to_dict()


def print_partition(res: dict[str, Any]) -> None:
    imp = res["improvement"]
    print(f"{res['model']} ({res['nodes']} nodes) on {res['chiplets']} chiplets [{res['algo']}, "
          f"{res['samples']} samples, {res['wall_s']:.1f} s]")
    if not res["valid"]:
        print(f"  INVALID      {res['reason']}")
    print(f"  throughput   {res['throughput']:.2f} /s  ({imp:.3f}× the greedy heuristic's "
          f"{res['greedy_throughput']:.2f} /s)" if imp else f"  throughput   {res['throughput']:.2f} /s")
    lat = res["chip_latency_s"][:res["chips_used"]]
    print(f"  chips used   {res['chips_used']}; slowest chip {max(lat) * 1e3:.3f} ms, "
          f"mean {sum(lat) / len(lat) * 1e3:.3f} ms")
    if "repair_stages" in res:
        print(f"  repairs      {res['repairs']}: by stage {res['repair_stages']}; the chain fallback on "
              f"{res['repair_chain_share']:.1%}")
    print(f"  greedy       repaired in stage {res['greedy_repair_stage'] or 'none (already valid)'}, "
          f"{res['greedy_repair_changed']} nodes changed")
    if "lns_subsolves" in res and "lns_gap" not in res:
        print(f"  ppo-lns      {res['lns_subsolves']} CP-SAT sub-solves chosen by PPO ({res['mode']}, "
              f"{res['ppo_iterations']} iterations) in {res['lns_wall_s']:.1f} s: "
              f"{res['sampler_throughput']:.2f} -> {res['throughput']:.2f} /s")
    elif "lns_subsolves" in res:
        gap = f"; at most {res['lns_gap']:.1%} from the optimum" if res["lns_stopped"] != "optimal" else \
            "; proven optimal"
        print(f"  polish       {res['lns_subsolves']} CP-SAT sub-solves in {res['lns_wall_s']:.1f} s, "
              f"{res['lns_improved']} improvements: {res['sampler_throughput']:.2f} -> "
              f"{res['throughput']:.2f} /s (stopped: {res['lns_stopped']}{gap})")


def cmd_place_ops(args) -> dict[str, Any]:
    """Every operator of a model's training step on one GPU of a multi-GPU machine (GDP)."""
    req = api.PlaceOpsRequest(args.model, devices=args.devices, algo=args.algo, machine=args.machine,
                              batch=args.batch, seed=args.seed, budget=args.budget,
                              pretrained=args.pretrained, zero_shot=args.zero_shot)
    _connect_if_needed(req, args.address)
    return api.place_ops(req).to_dict()


def print_place_ops(res: dict[str, Any]) -> None:
    print(f"{res['model']} ({res['nodes']} ops) on {res['devices']} x {res['machine']} [{res['algo']}, "
          f"{res['wall_s']:.1f} s]")
    state = "valid" if res["valid"] else f"INVALID: {res['reason']}"
    sp = res["speedup_over_single"]
    print(f"  step time    {res['step_time_s'] * 1e3:.2f} ms ({state})"
          + (f"; {sp:.2f}x one GPU's {res['single_device_step_time_s'] * 1e3:.2f} ms" if sp else ""))
    if "solver_status" in res:
        print(f"  CP-SAT       {res['solver_status']}, gap {res['gap']:.1%}, lower bound "
              f"{res['lower_bound_s'] * 1e3:.2f} ms")
    if "ppo_iterations" in res:
        g = res["greedy_policy_step_time_s"]
        print(f"  GDP          {res['mode']}: {res['samples']} placements in {res['ppo_iterations']} PPO "
              f"iterations; the result is the {res['result_is']}; the greedy policy's placement: "
              f"{g * 1e3:.2f} ms{'' if res['greedy_policy_valid'] else ' (invalid)'}")
    mem = ", ".join(_fmt_bytes(b) for b in res["peak_memory_bytes"])
    print(f"  peak memory  {mem} (of {_fmt_bytes(res['memory_bytes'])} each)")
    busy = ", ".join(f"{b * 1e3:.1f}" for b in res["compute_busy_s"])
    print(f"  busy (ms)    {busy}; transfers {_fmt_bytes(res['transfer_bytes'])}")


def cmd_pipeline(args) -> dict[str, Any]:
    """Pipeline cuts of a model on V100 servers (Auto-MAP): the exact DP over every contiguous cut set
    (default), the DQN, the pre-trained agent or enumeration of the pruned candidates."""
    req = api.PipelineRequest(args.model, cluster=args.cluster, stages=args.stages, algo=args.algo,
                              budget=args.budget, seed=args.seed, finetune=args.finetune, radius=args.radius,
                              pretrained=args.pretrained, env_runners=args.env_runners,
                              learners=args.learners)
    _connect_if_needed(req, args.address)
    return api.pipeline(req).to_dict()


def print_pipeline(res: dict[str, Any]) -> None:
    o = res["optimum"]
    dp = res["algo"] == "dp"
    print(f"{res['model']} on V100 cluster {res['cluster']} ({res['gpus']} GPUs), {res['stages']} stages "
          f"[{res['algo']}, {res['wall_s']:.1f} s]")
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
    if dp:
        print(f"  optimum      over all contiguous cut sets (unpruned), by dynamic programming in "
              f"{o['wall_s']:.2f} s ({o['evaluated']:,} DP states, {o['subproblems']} subproblems)"
              + ("" if o.get("proven_optimal", True) else "  NOT PROVEN: subproblem budget ran out"))
    else:
        print(f"  optimum L    {o['length_s']:.4f} s at {o['cuts']} ({o['evaluated']} plans enumerated); "
              f"gap {100 * res['gap']:+.2f}%")
    print(f"  memory       {res['memory_gib']} GiB per GPU")


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


COMMANDS = {"models": (cmd_models, print_models), "graph": (cmd_graph, print_graph),
            "estimate": (cmd_estimate, print_estimate), "place": (cmd_place, print_place),
            "solve-dp": (cmd_solve_dp, print_solve_dp), "search": (cmd_search, print_search),
            "report": (cmd_report, print_report), "partition": (cmd_partition, print_partition),
            "pipeline": (cmd_pipeline, print_pipeline), "tune-rl": (cmd_tune_rl, print_tune_rl),
            "place-ops": (cmd_place_ops, print_place_ops)}


NO_CONTENTION_HELP = ("the paper's model: concurrently running ops each get the full HBM/GLB bandwidth "
                      "(default: they share it, and ops whose demand together exceeds it run one after "
                      "another)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archplace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("models", help="known model names and their sources")
    m.add_argument("--json", action="store_true")
    g = sub.add_parser("graph", help="extract a model's training operator graph")
    g.add_argument("model", nargs="?", help="preset name, dnn-partitioning .json or archplace .parquet")
    _add_model_args(g)
    g.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    g.add_argument("--mbs", type=int, default=1, help="microbatch size")
    g.add_argument("--tmp", type=int, default=1, help="tensor-model-parallel width (one slice)")
    g.add_argument("--out", help="write the graph to this Parquet file")
    g.add_argument("--json", action="store_true")
    e = sub.add_parser("estimate", help="per-op latency of a model on an accelerator")
    e.add_argument("model", nargs="?", help="preset name, dnn-partitioning .json or archplace .parquet")
    _add_model_args(e)
    e.add_argument("--arch", required=True, help="accelerator preset (tpuv4) or a JSON file")
    e.add_argument("--backend", choices=["analytical", "zigzag"], default="analytical")
    e.add_argument("--seq", type=int, default=None)
    e.add_argument("--mbs", type=int, default=1)
    e.add_argument("--tmp", type=int, default=1)
    e.add_argument("--json", action="store_true")
    pl = sub.add_parser("place", help="best placement of a model on K copies of an accelerator")
    pl.add_argument("model", nargs="?", help="preset name")
    _add_model_args(pl)
    pl.add_argument("--arch", required=True, help="accelerator preset (tpuv4) or a JSON file")
    pl.add_argument("--accelerators", type=int, default=1024)
    pl.add_argument("--global-batch", type=int, default=4096)
    pl.add_argument("--fixed", metavar="P,D,T",
                    help="fixed {p,d,t}, optimised split: the DP still chooses which layers form each stage")
    pl.add_argument("--expert", metavar="P,D,T|paper",
                    help="evaluate exactly the expert placement {p,d,t} (paper: the Phaze paper's Table 4 "
                         "strategy for MODEL): an even split of the transformer blocks over p stages, as "
                         "bench/phaze_tpuv4.py")
    pl.add_argument("--hbm", type=float, help="HBM size in GB (default: search 32, 64, 80)")
    pl.add_argument("--seq", type=int, default=None)
    pl.add_argument("--sequential", action="store_true",
                    help="layer schedules without the ILP: every op intra-op parallel in sequence")
    pl.add_argument("--ilp-time-limit", type=float, default=30.0, help="seconds per layer ILP")
    pl.add_argument("--no-contention", action="store_true", help=NO_CONTENTION_HELP)
    pl.add_argument("--json", action="store_true")
    sd = sub.add_parser("solve-dp", help="optimal max-load split of a dnn-partitioning input")
    sd.add_argument("file")
    sd.add_argument("--method", default="auto", choices=["auto", "dp", "milp"])
    sd.add_argument("--time-limit", type=float, default=600.0)
    sd.add_argument("--json", action="store_true")
    se = sub.add_parser("search", help="architecture × placement co-search on Ray Tune")
    se.add_argument("models", nargs="*", help="model presets; one trial evaluates all of them")
    _add_model_args(se, many=True)
    se.add_argument("--accelerators", type=int, default=1024)
    se.add_argument("--global-batch", type=int, default=4096)
    se.add_argument("--searcher", default="phaze",
                    help="phaze (area order + hysteresis), optuna, random, grid")
    se.add_argument("--budget", type=int, default=16, help="most architectures to evaluate")
    se.add_argument("--out", help="result directory (default: runs/search-TIMESTAMP)")
    se.add_argument("--address", help="attach to a running Ray cluster: auto or HOST:PORT")
    se.add_argument("--resume", action="store_true", help="continue the search in --out")
    se.add_argument("--retry-failed", action="store_true",
                    help="with --resume: evaluate the architectures recorded as failed again")
    se.add_argument("--workers", type=int,
                    help="most trials in flight (default: the cluster's CPUs, re-read as nodes join "
                         "or leave)")
    se.add_argument("--archs-per-trial", type=int, default=1,
                    help="architectures evaluated by one Tune trial (large cheap sweeps: 50-200)")
    se.add_argument("--schedule", choices=("ilp", "sequential"), default="ilp",
                    help="layer schedules: the ILP (Phaze), or sequential (no ILP, every op intra-op "
                         "parallel: Phaze's baseline, for fast screening sweeps)")
    se.add_argument("--schedule-cache", default=None,
                    help="solved layer slices (JSON lines), reused by --resume and by searches given the "
                         "same file (default: OUT/schedule_cache.jsonl)")
    se.add_argument("--wait-timeout", type=float, default=600.0,
                    help="seconds to wait for the cluster's first CPU and the model graphs")
    se.add_argument("--microbatches", default="1,2,4,8")
    se.add_argument("--hbm", default="32,64,80", help="HBM sizes in GB")
    se.add_argument("--recompute", choices=sorted(api.RECOMPUTE), default="both")
    se.add_argument("--seq", type=int, default=None)
    se.add_argument("--tmp-widths", help="TMP widths to consider, e.g. 1,2 (default: each model's own)")
    se.add_argument("--ilp-time-limit", type=float, default=5.0, help="seconds per layer ILP")
    se.add_argument("--no-contention", action="store_true", help=NO_CONTENTION_HELP)
    se.add_argument("--space", help="search-space YAML (default: the packaged Phaze Table 1 space)")
    se.add_argument("--hysteresis", type=int, default=6)
    se.add_argument("--area-bucket", type=float, default=0.01,
                    help="Phaze area bucket in mm² (0 = exact areas)")
    se.add_argument("--seed", type=int, default=0)
    se.add_argument("--max-failures", type=int, default=2,
                    help="retries of an architecture whose evaluation failed")
    se.add_argument("--json", action="store_true")
    po = sub.add_parser("place-ops", help="place every operator of a training step on the GPUs of a machine "
                                          "(GDP)")
    po.add_argument("model", help="GDP preset: rnnlm-2|4|8, gnmt-2|4|8, txl-2|4|8, inception-v3, "
                                  "wavenet-2x18, wavenet-4x36, ...")
    po.add_argument("--devices", type=int, default=None,
                    help="GPUs (default: the preset's, as in GDP's Table 1)")
    po.add_argument("--algo", choices=api.PLACE_OPS_ALGOS, default="m-etf")
    po.add_argument("--machine", choices=("p100-pcie", "v100-nvlink"), default="p100-pcie")
    po.add_argument("--batch", type=int, default=None)
    po.add_argument("--budget", type=float, default=30.0,
                    help="exact: CP-SAT seconds; gdp, gdp-pretrained: PPO wall seconds")
    po.add_argument("--pretrained", default=None, help="gdp-pretrained: policy weights (.npz)")
    po.add_argument("--zero-shot", action="store_true",
                    help="gdp-pretrained: the pre-trained policy's placement, no updates")
    po.add_argument("--address", help="gdp: attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    po.add_argument("--seed", type=int, default=0)
    po.add_argument("--json", action="store_true")
    pa = sub.add_parser("partition", help="partition a model over the chiplets of a multi-chip module")
    pa.add_argument("model", help="preset name, dnn-partitioning .json or archplace .parquet")
    pa.add_argument("--chiplets", type=int, default=36)
    pa.add_argument("--algo", choices=api.PARTITION_ALGOS, default="sa")
    pa.add_argument("--budget", type=int, default=200, help="samples (evaluated partitions)")
    pa.add_argument("--polish", type=float, default=0.0, metavar="SECONDS",
                    help="then CP-SAT large-neighbourhood search on the best partition for SECONDS "
                         "(ppo-lns: the seconds of its learned search)")
    pa.add_argument("--pretrained", default=None,
                    help="ppo / ppo-lns: start from these pre-trained weights (.npz from "
                         "bench/mcm_pretrain.py / bench/mcm_lns_pretrain.py)")
    pa.add_argument("--zero-shot", action="store_true", help="ppo: sample the pre-trained policy, no updates")
    pa.add_argument("--seq", type=int, default=None)
    pa.add_argument("--mbs", type=int, default=1)
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--address", help="ppo: attach to a running Ray cluster: auto or HOST:PORT "
                                      "(default: an embedded local Ray)")
    pa.add_argument("--env-runners", type=int, default=0,
                    help="ppo: remote env runner actors that sample (default 0: in this process)")
    pa.add_argument("--learners", type=int, default=0,
                    help="ppo: remote learner actors (default 0: in this process)")
    pa.add_argument("--config", default=None,
                    help="ppo: YAML overriding mcm_ppo.yaml keys (tune-rl mcm writes best_config.yaml)")
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
    pa.add_argument("--json", action="store_true")
    pp = sub.add_parser("pipeline", help="pipeline cuts of a model on V100 servers (Auto-MAP; exact DP "
                                         "by default)")
    pp.add_argument("model", help="preset name (see `archplace models`), e.g. bert-48, t5-3b")
    pp.add_argument("--cluster", required=True, help="A, B or C: 2, 3 or 4 servers of 8 V100")
    pp.add_argument("--stages", type=int, default=None, help="K (default: the number of servers)")
    pp.add_argument("--algo", choices=api.PIPELINE_ALGOS, default="dp",
                    help="dp (default): the exact optimum over every contiguous cut set, by dynamic "
                         "programming; rainbow, pretrained: the DQN agents (Ray); exact: enumeration of "
                         "the pruned candidates")
    pp.add_argument("--budget", type=int, default=None,
                    help="rainbow: environment steps (default 1300 per cut)")
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
    pp.add_argument("--json", action="store_true")
    rp = sub.add_parser("report", help="report.md with plots of a finished search")
    rp.add_argument("dir")
    rp.add_argument("--json", action="store_true")
    from archplace.service.cli import add_parser as add_serve_parser

    add_serve_parser(sub)
    return p


# request fields whose flag is not "--" + the field with "-" for "_"
FLAGS = {"model": "MODEL", "models": "MODEL", "file": "FILE", "out_dir": "--out", "hbm_gb": "--hbm",
         "ilp_time_limit_s": "--ilp-time-limit", "contention": "--no-contention",
         "time_limit_s": "--time-limit",
         "wait_timeout_s": "--wait-timeout", "area_bucket_mm2": "--area-bucket"}


def _flag(field: str) -> str:
    return FLAGS.get(field, "--" + field.replace("_", "-"))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":   # a long-running server (or its token commands), not a one-shot result
        from archplace.service.cli import run as run_serve

        try:
            return run_serve(args)
        except (ValueError, OSError, TimeoutError) as e:
            print(f"archplace serve: error: {e}", file=sys.stderr)
            return 2
    run, show = COMMANDS[args.command]
    try:
        res = run(args)
    except api.InvalidRequest as e:  # the API names request fields; the CLI user knows the flags
        print(f"archplace {args.command}: error: {e.render({f: _flag(f) for f in e.fields})}",
              file=sys.stderr)
        return 2
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"archplace {args.command}: error: {e}", file=sys.stderr)
        return 2
    try:
        if args.json:
            print(json.dumps(res, default=str))
        else:
            show(res)
    except BrokenPipeError:  # `archplace ... | head`: the reader left, nothing is wrong
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
