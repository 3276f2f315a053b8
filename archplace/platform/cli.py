"""The ``archplace`` command line (contract in DESIGN.md): a human summary by default, one JSON
object with ``--json``. Bad input ends with a one-line error and exit status 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


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


def load_graph(model: str, seq: int | None, mbs: int, tmp: int, training: bool = True):
    """A preset name, a dnn-partitioning ``.json`` or an archplace ``.parquet`` graph."""
    from archplace.workloads import OpGraph

    path = Path(model)
    if model.endswith(".parquet"):
        if not path.exists():
            raise ValueError(f"graph file {model!r} does not exist")
        return OpGraph.from_parquet(path)
    if model.endswith(".json"):
        if not path.exists():
            raise ValueError(f"graph file {model!r} does not exist")
        from archplace.workloads.dnn_partitioning import load_dnn_partitioning

        return load_dnn_partitioning(path)
    from archplace.workloads.models import build_graph

    return build_graph(model, seq=seq, mbs=mbs, tmp=tmp, training=training)


def graph_summary(g) -> dict[str, Any]:
    import numpy as np

    tot = g.totals()
    fwd = ~g.nodes["is_backward"]
    bpe = int(g.meta.get("bytes_per_element", 2))
    out: dict[str, Any] = {
        "model": g.meta.get("model"), "source": g.meta.get("source"),
        "seq": g.meta.get("seq"), "mbs": g.meta.get("mbs"), "tmp": g.meta.get("tmp"),
        "ops": tot["ops"], "forward_ops": tot["forward_ops"], "backward_ops": tot["backward_ops"],
        "edges": tot["edges"], "parameters": tot["weight_bytes"] // bpe,
        "weight_bytes": tot["weight_bytes"], "forward_flops": tot["forward_flops"],
        "backward_flops": tot["backward_flops"], "activation_bytes": tot["activation_bytes"],
        "ops_by_core": {c: int(n) for c, n in zip(*np.unique(g.nodes["core"][fwd], return_counts=True))},
    }
    layers = g.meta.get("layers") or []
    out["layers"] = len(layers)
    if layers and (g.nodes["layer"] >= 0).all():
        from archplace.workloads import layer_graph

        lg = layer_graph(g)
        out["repeated_layer_groups"] = [
            {"layers": [layers[i] for i in grp], "count": len(grp), "hash": lg.structural_hash[grp[0]]}
            for grp in lg.repeat_groups()]
        out["unique_layers"] = len(out["repeated_layer_groups"])
    else:
        out["repeated_layer_groups"] = []
    return out


def cmd_models(args) -> dict[str, Any]:
    from archplace.workloads.models import PRESETS

    return {"models": [{"name": p.name, "class": p.model_class, "seq": p.seq_len,
                        "tmp_widths": list(p.tmp_widths), "source": p.source,
                        "blocks": sum(p.depths.values())} for p in PRESETS.values()],
            "other_sources": ["dnn-partitioning JSON file (path ending in .json)",
                              "archplace graph Parquet file (path ending in .parquet)"]}


def print_models(res: dict[str, Any]) -> None:
    print(f"{'model':15s} {'transformers class':28s} {'seq':>5s} {'blocks':>6s}  tmp widths  source")
    for m in res["models"]:
        print(f"{m['name']:15s} {m['class']:28s} {m['seq']:5d} {m['blocks']:6d}  "
              f"{','.join(map(str, m['tmp_widths'])):10s}  {m['source']}")
    print("also accepted as MODEL: " + "; ".join(res["other_sources"]))


def cmd_graph(args) -> dict[str, Any]:
    g = load_graph(args.model, args.seq, args.mbs, args.tmp)
    res = graph_summary(g)
    if args.out:
        res["out"] = str(g.to_parquet(args.out))
    return res


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


def load_accelerator(arch: str):
    """A preset name or a JSON file of Accelerator fields."""
    from archplace.hardware import Accelerator
    from archplace.hardware.presets import preset_accelerator

    if arch.endswith(".json"):
        return Accelerator.from_json(arch)
    return preset_accelerator(arch)


def cmd_estimate(args) -> dict[str, Any]:
    import numpy as np

    from archplace.hardware.area import accelerator_area_mm2
    from archplace.simulators.estimate import estimate_graph

    acc = load_accelerator(args.arch)
    g = load_graph(args.model, args.seq, args.mbs, args.tmp)
    est = estimate_graph(g, acc, backend=args.backend)
    nd = g.nodes
    bwd = nd["is_backward"]
    by_core = {c: float(est.single_s[nd["core"] == c].sum()) for c in np.unique(nd["core"])}
    layers = g.meta.get("layers") or []
    ops = [{"name": nd["name"][i], "kind": nd["kind"][i], "core": nd["core"][i],
            "pass": "backward" if bwd[i] else "forward",
            "layer": layers[nd["layer"][i]] if nd["layer"][i] >= 0 else None,
            "flops": float(nd["flops"][i]), "single_core_s": float(est.single_s[i]),
            "all_cores_s": float(est.all_s[i])} for i in range(g.num_nodes)]
    return {"model": g.meta.get("model"), "seq": g.meta.get("seq"), "mbs": g.meta.get("mbs"),
            "tmp": g.meta.get("tmp"), "backend": est.backend, "arch": acc.to_dict(),
            "area_mm2": accelerator_area_mm2(acc), "peak_flops": acc.peak_flops,
            "totals": {"sequential_single_core_s": float(est.single_s.sum()),
                       "all_cores_s": float(est.all_s.sum()),
                       "forward_s": float(est.single_s[~bwd].sum()),
                       "backward_s": float(est.single_s[bwd].sum()),
                       "by_core_single_s": by_core,
                       "flops": float(nd["flops"].sum())},
            "ops": ops}


def _arch_label(a: dict[str, Any]) -> str:
    """``tpuv4 {8, 2, 128, 128, 128}`` from an Accelerator's dict."""
    return (f"{a['name'] or 'custom'} {{{a['num_tc']}, {a['num_vc']}, {a['pe_x']}, {a['pe_y']}, "
            f"{a['pe_vc']}}}")


def print_estimate(res: dict[str, Any]) -> None:
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


def _parse_fixed(text: str | None) -> tuple[int, int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) >= 1 for p in parts):
        raise ValueError(f"--fixed must be p,d,t with three positive integers, got {text!r}")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def cmd_place(args) -> dict[str, Any]:
    from archplace.algorithms.solvers.throughput import model_throughput
    from archplace.hardware.area import accelerator_area_mm2

    acc = load_accelerator(args.arch)
    fixed = _parse_fixed(args.fixed)
    for name, v in (("--accelerators", args.accelerators), ("--global-batch", args.global_batch)):
        if v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v}")
    if fixed and fixed[0] * fixed[1] * fixed[2] > args.accelerators:
        raise ValueError(f"--fixed {args.fixed} needs {fixed[0] * fixed[1] * fixed[2]} accelerators, "
                         f"more than --accelerators {args.accelerators}")
    hbm = (args.hbm,) if args.hbm else (32, 64, 80)
    solve_kw = {} if args.sequential else {"time_limit_s": args.ilp_time_limit}
    res = model_throughput(args.model, acc, args.accelerators, args.global_batch, hbm_gb=hbm,
                           sequential=args.sequential, fixed=fixed, seq=args.seq, **solve_kw)
    out = res.summary()
    out["area_mm2"] = accelerator_area_mm2(acc)
    out["accelerators"] = args.accelerators
    out["global_batch"] = args.global_batch
    out["schedule"] = "sequential" if args.sequential else "ilp"
    return out


def print_place(res: dict[str, Any]) -> None:
    pl = res["placement"]
    a = res["arch"]
    print(f"{res['model']} on {res['accelerators']} × {_arch_label(a)}, global batch "
          f"{res['global_batch']} [{res['schedule']} layer schedules]")
    if not pl["feasible"]:
        print(f"  infeasible: {pl.get('reason', '')}")
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
    from archplace.algorithms.solvers.maxload import solve_dp_command

    if not Path(args.file).exists():
        raise ValueError(f"input file {args.file!r} does not exist")
    return solve_dp_command(args.file, args.method, args.time_limit)


def print_solve_dp(res: dict[str, Any]) -> None:
    ml = res["max_load"]
    print(f"{res['file']}: max-load {ml if ml is None else format(ml, '.10g')} ({res['status']}, "
          f"method {res['method']}, {res['solve_time_s']:.2f} s)")
    if res.get("reference") is not None:
        print(f"  reference optimum {res['reference']:.10g}, relative difference {res['rel_diff']:.2e}")
    if res.get("gap"):
        print(f"  lower bound {res['lower_bound']:.10g}, gap {res['gap']:.2%}")
    for dev in res.get("devices", []):
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


RECOMPUTE = {"both": (False, True), "stash": (False,), "recompute": (True,)}


def cmd_search(args) -> dict[str, Any]:
    import time as _time

    from archplace.hardware.space import load_space_config
    from archplace.platform.search import run_search
    from archplace.platform.trial import SearchSettings

    settings = SearchSettings(
        models=tuple(args.models), num_devices=args.accelerators, global_batch=args.global_batch,
        microbatches=_int_list(args.microbatches, "--microbatches"), hbm_gb=_float_list(args.hbm, "--hbm"),
        recompute=RECOMPUTE[args.recompute], seq=args.seq, ilp_time_limit_s=args.ilp_time_limit,
        space=load_space_config(args.space) if args.space else None, schedule=args.schedule,
        tmp_widths={m: _int_list(args.tmp_widths, "--tmp-widths") for m in args.models} if args.tmp_widths
        else {})
    out = args.out or f"runs/search-{_time.strftime('%Y%m%d-%H%M%S')}"
    return run_search(settings, out, searcher=args.searcher, budget=args.budget, address=args.address,
                      resume=args.resume, retry_failed=args.retry_failed, workers=args.workers,
                      seed=args.seed,
                      hysteresis=args.hysteresis, area_bucket_mm2=args.area_bucket,
                      max_failures=args.max_failures, archs_per_trial=args.archs_per_trial,
                      schedule_cache=args.schedule_cache, wait_timeout_s=args.wait_timeout,
                      progress=not args.json)


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
    c = res.get("common")
    if c is None:
        print("  no architecture gave a feasible placement")
    else:
        print(f"  best common  {c['arch_label']}  area {c['area_mm2']:.2f} mm²  "
              f"average {c['throughput_avg']:,.1f} samples/s")
    ref = (res.get("reference") or {}).get("per_model", {})
    for m, b in res.get("per_model", {}).items():
        r = ref.get(m, {})
        vs = res.get("speedup_vs_reference", {}).get(m)
        print(f"  {m:14s} best {b['arch_label']}: {b['throughput']:,.1f} samples/s "
              f"(p={b['p']} d={b['d']} t={b['t']}, mbs {b['microbatch']})"
              + (f"; tpuv4 {r['throughput']:,.1f} → {vs:.3f}×" if vs else ""))
    out = res["out_dir"]
    print(f"  results      {out}/evaluations.parquet, {out}/best.json, {out}/report.md")


def cmd_report(args) -> dict[str, Any]:
    from archplace.platform.report import write_report

    path = write_report(args.dir)
    return {"report": str(path)}


def print_report(res: dict[str, Any]) -> None:
    print(f"wrote {res['report']}")


PARTITION_ALGOS = ("greedy", "random", "sa", "ppo")


def cmd_partition(args) -> dict[str, Any]:
    import time as _time

    from archplace.algorithms.search.mcm_baselines import greedy, random_search, simulated_annealing
    from archplace.algorithms.solvers.mcm_repair import MCMRepairer
    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem, evaluate

    if not 1 <= args.chiplets <= 64:
        raise ValueError(f"--chiplets must be in [1, 64], got {args.chiplets}")
    if args.budget < 1:
        raise ValueError(f"--budget must be a positive number of samples, got {args.budget}")
    if args.algo != "ppo" and (args.pretrained or args.zero_shot):
        raise ValueError(f"--pretrained and --zero-shot apply to --algo ppo, not {args.algo}")
    t0 = _time.perf_counter()
    if args.model.endswith((".json", ".parquet")):
        g = load_graph(args.model, args.seq, args.mbs, 1, training=False)
    else:  # the MCM chiplets are int8 edge TPUs: one byte per element
        from archplace.workloads.models import build_graph

        g = build_graph(args.model, seq=args.seq, mbs=args.mbs, training=False, bytes_per_element=1)
    problem = MCMProblem.from_graph(g, mcm_package(args.chiplets))
    rep = MCMRepairer(problem.num_chips, problem.src, problem.dst, num_nodes=problem.num_nodes)
    g_part, g_tp = greedy(problem, seed=args.seed, repairer=rep)
    extra: dict[str, Any] = {}
    if args.algo == "greedy":
        part, samples = g_part, 1
    elif args.algo == "ppo":  # PPO with FIX-repaired actions, optionally fine-tuned from pre-trained weights
        part, samples, extra = _partition_ppo(problem, args)
        if part is None or float(evaluate(problem, part).throughput[0]) < g_tp:
            part = g_part
    else:
        run = random_search if args.algo == "random" else simulated_annealing
        trace = run(problem, args.budget, seed=args.seed, repairer=rep)
        part, samples = trace.best_partition, trace.samples
        if part is None or trace.best < g_tp:  # the heuristic is always a candidate
            part = g_part
    ev = evaluate(problem, part)
    names = problem.names or tuple(str(i) for i in range(problem.num_nodes))
    tp = float(ev.throughput[0])
    return {"model": args.model, "chiplets": args.chiplets, "algo": args.algo, "samples": samples,
            "nodes": problem.num_nodes, "edges": problem.num_edges, "valid": bool(ev.valid[0]),
            "throughput": tp, "greedy_throughput": g_tp, "improvement": tp / g_tp if g_tp > 0 else None,
            "chips_used": int(part.max()) + 1, "chip_latency_s": ev.latency_s[0].tolist(),
            "assignment": {n: int(c) for n, c in zip(names, part)}, **extra,
            "wall_s": _time.perf_counter() - t0}


def _partition_ppo(problem, args) -> tuple[Any, int, dict[str, Any]]:
    import ray

    from archplace.algorithms.rl.mcm_ppo import load_state, rl_search

    state, meta = (None, {})
    if args.zero_shot and not args.pretrained:
        raise ValueError("--zero-shot needs --pretrained PATH (the policy to sample)")
    if args.pretrained:
        if not os.path.exists(args.pretrained):
            raise FileNotFoundError(f"--pretrained {args.pretrained} does not exist "
                                    "(bench/mcm_pretrain.py writes bench/results/mcm_pretrained.npz)")
        state, meta = load_state(args.pretrained)
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    run = rl_search(problem, args.budget, seed=args.seed, init_state=state, train=not args.zero_shot)
    extra = {"valid_samples": run.trace.valid_samples, "pretrained": args.pretrained,
             "pretrained_samples": meta.get("samples"), "mode": "zero-shot" if args.zero_shot else
             ("fine-tuned" if state is not None else "from scratch")}
    return run.trace.best_partition, run.trace.samples, extra


def print_partition(res: dict[str, Any]) -> None:
    imp = res["improvement"]
    print(f"{res['model']} ({res['nodes']} nodes) on {res['chiplets']} chiplets [{res['algo']}, "
          f"{res['samples']} samples, {res['wall_s']:.1f} s]")
    print(f"  throughput   {res['throughput']:.2f} /s  ({imp:.3f}× the greedy heuristic's "
          f"{res['greedy_throughput']:.2f} /s)" if imp else f"  throughput   {res['throughput']:.2f} /s")
    lat = res["chip_latency_s"][:res["chips_used"]]
    print(f"  chips used   {res['chips_used']}; slowest chip {max(lat) * 1e3:.3f} ms, "
          f"mean {sum(lat) / len(lat) * 1e3:.3f} ms")


PIPELINE_ALGOS = ("rainbow", "pretrained", "exact")


def cmd_pipeline(args) -> dict[str, Any]:
    """Pipeline cuts of a model on V100 servers (Auto-MAP): DQN, pre-trained agent or exact."""
    import time as _time

    from archplace.algorithms.rl.pipeline_plan import (
        cluster_of,
        describe,
        gap,
        model_profile,
        optimum,
        pretrained_weights_path,
    )

    if args.cluster not in ("A", "B", "C"):
        raise ValueError(f"--cluster must be one of ['A', 'B', 'C'], got {args.cluster!r}")
    cl = cluster_of(args.cluster)
    k = cl.num_servers if args.stages is None else args.stages
    if not 2 <= k <= 8:
        raise ValueError(f"--stages must be in [2, 8], got {k}")
    if args.budget is not None and args.budget < 1:
        raise ValueError(f"--budget must be a positive number of environment steps, got {args.budget}")
    if args.finetune < 0:
        raise ValueError(f"--finetune must be >= 0 environment steps, got {args.finetune}")
    if args.radius < 0:
        raise ValueError(f"--radius must be >= 0 devices, got {args.radius}")
    weights = args.pretrained or str(pretrained_weights_path())
    if args.algo == "pretrained" and not os.path.exists(weights):
        raise FileNotFoundError(f"--pretrained {weights} does not exist "
                                "(bench/pipeline.py --pretrain-steps N writes it)")
    t0 = _time.perf_counter()
    prof = model_profile(args.model)
    opt = optimum(prof, cl, k, args.radius)
    out: dict[str, Any] = {"model": args.model, "cluster": args.cluster, "gpus": cl.num_devices,
                           "stages": k, "algo": args.algo, "forward_ops": prof.num_ops,
                           "optimizer": prof.setup.optimizer, "recompute": prof.setup.recompute,
                           "optimum": {**describe(prof, cl, opt.cuts), "evaluated": opt.evaluated,
                                       "wall_s": opt.wall_s}}
    if args.algo == "exact":
        plan, extra = opt.cuts, {"evaluated": opt.evaluated}
    else:
        import ray

        from archplace.algorithms.rl.pipeline_dqn import (
            default_budget,
            dqn_search,
            load_state,
            pretrained_plan,
        )

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        if args.algo == "rainbow":
            budget = args.budget or default_budget(k)
            res = dqn_search(prof, cl, k, budget, seed=args.seed, radius=args.radius)
            plan = res.best_cuts
            extra = {"env_steps": res.env_steps, "plans_evaluated": res.plans,
                     "greedy": describe(prof, cl, res.greedy_cuts)}
        else:
            state, meta = load_state(weights)
            zs = pretrained_plan(state, prof, cl, k, finetune_steps=args.finetune, seed=args.seed)
            plan = zs.cuts
            extra = {"pretrained": weights, "pretrained_steps": meta.get("steps"),
                     "finetune_steps": zs.finetune_steps, "coarse_cuts": zs.coarse_cuts.tolist()}
    out.update(describe(prof, cl, plan))
    out.update(extra)
    out["optimal_length_s"] = out["optimum"]["length_s"]
    out["feasible"] = not out["oom"]
    out["gap"] = gap(out["length_s"], opt.length_s) if not opt.oom else None
    out["wall_s"] = _time.perf_counter() - t0
    return out


def print_pipeline(res: dict[str, Any]) -> None:
    o = res["optimum"]
    print(f"{res['model']} on V100 cluster {res['cluster']} ({res['gpus']} GPUs), {res['stages']} stages "
          f"[{res['algo']}, {res['wall_s']:.1f} s]")
    if o["oom"]:
        print(f"  infeasible: no candidate plan fits in memory (best {max(o['memory_gib']):.1f} GiB per GPU)")
        return
    print(f"  cuts         {res['cuts']}  after {', '.join(res['cut_ops'])}")
    print(f"  layers       {', '.join(res['cut_layers'])}")
    print(f"  device cuts  {res['device_cuts']}  (devices per stage {res['devices']})")
    print(f"  L            {res['length_s']:.4f} s per iteration{'  OUT OF MEMORY' if res['oom'] else ''}")
    print(f"  optimum L    {o['length_s']:.4f} s at {o['cuts']} ({o['evaluated']} plans enumerated); "
          f"gap {100 * res['gap']:+.2f}%")
    print(f"  memory       {res['memory_gib']} GiB per GPU")


COMMANDS = {"models": (cmd_models, print_models), "graph": (cmd_graph, print_graph),
            "estimate": (cmd_estimate, print_estimate), "place": (cmd_place, print_place),
            "solve-dp": (cmd_solve_dp, print_solve_dp), "search": (cmd_search, print_search),
            "report": (cmd_report, print_report), "partition": (cmd_partition, print_partition),
            "pipeline": (cmd_pipeline, print_pipeline)}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="archplace", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("models", help="known model names and their sources")
    m.add_argument("--json", action="store_true")
    g = sub.add_parser("graph", help="extract a model's training operator graph")
    g.add_argument("model", help="preset name, dnn-partitioning .json or archplace .parquet")
    g.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's)")
    g.add_argument("--mbs", type=int, default=1, help="microbatch size")
    g.add_argument("--tmp", type=int, default=1, help="tensor-model-parallel width (one slice)")
    g.add_argument("--out", help="write the graph to this Parquet file")
    g.add_argument("--json", action="store_true")
    e = sub.add_parser("estimate", help="per-op latency of a model on an accelerator")
    e.add_argument("model", help="preset name, dnn-partitioning .json or archplace .parquet")
    e.add_argument("--arch", required=True, help="accelerator preset (tpuv4) or a JSON file")
    e.add_argument("--backend", choices=["analytical", "zigzag"], default="analytical")
    e.add_argument("--seq", type=int, default=None)
    e.add_argument("--mbs", type=int, default=1)
    e.add_argument("--tmp", type=int, default=1)
    e.add_argument("--json", action="store_true")
    pl = sub.add_parser("place", help="best placement of a model on K copies of an accelerator")
    pl.add_argument("model")
    pl.add_argument("--arch", required=True, help="accelerator preset (tpuv4) or a JSON file")
    pl.add_argument("--accelerators", type=int, default=1024)
    pl.add_argument("--global-batch", type=int, default=4096)
    pl.add_argument("--fixed", help="evaluate one strategy p,d,t (e.g. an expert placement)")
    pl.add_argument("--hbm", type=float, help="HBM size in GB (default: search 32, 64, 80)")
    pl.add_argument("--seq", type=int, default=None)
    pl.add_argument("--sequential", action="store_true",
                    help="layer schedules without the ILP: every op intra-op parallel in sequence")
    pl.add_argument("--ilp-time-limit", type=float, default=30.0, help="seconds per layer ILP")
    pl.add_argument("--json", action="store_true")
    sd = sub.add_parser("solve-dp", help="optimal max-load split of a dnn-partitioning input")
    sd.add_argument("file")
    sd.add_argument("--method", default="auto", choices=["auto", "dp", "milp"])
    sd.add_argument("--time-limit", type=float, default=600.0)
    sd.add_argument("--json", action="store_true")
    se = sub.add_parser("search", help="architecture × placement co-search on Ray Tune")
    se.add_argument("models", nargs="+", help="model presets; one trial evaluates all of them")
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
    se.add_argument("--recompute", choices=sorted(RECOMPUTE), default="both")
    se.add_argument("--seq", type=int, default=None)
    se.add_argument("--tmp-widths", help="TMP widths to consider, e.g. 1,2 (default: each model's own)")
    se.add_argument("--ilp-time-limit", type=float, default=5.0, help="seconds per layer ILP")
    se.add_argument("--space", help="search-space YAML (default: the packaged Phaze Table 1 space)")
    se.add_argument("--hysteresis", type=int, default=6)
    se.add_argument("--area-bucket", type=float, default=0.01,
                    help="Phaze area bucket in mm² (0 = exact areas)")
    se.add_argument("--seed", type=int, default=0)
    se.add_argument("--max-failures", type=int, default=2,
                    help="retries of an architecture whose evaluation failed")
    se.add_argument("--json", action="store_true")
    pa = sub.add_parser("partition", help="partition a model over the chiplets of a multi-chip module")
    pa.add_argument("model", help="preset name, dnn-partitioning .json or archplace .parquet")
    pa.add_argument("--chiplets", type=int, default=36)
    pa.add_argument("--algo", choices=PARTITION_ALGOS, default="sa")
    pa.add_argument("--budget", type=int, default=200, help="samples (evaluated partitions)")
    pa.add_argument("--pretrained", default=None,
                    help="ppo: start from these pre-trained weights (.npz from bench/mcm_pretrain.py)")
    pa.add_argument("--zero-shot", action="store_true", help="ppo: sample the pre-trained policy, no updates")
    pa.add_argument("--seq", type=int, default=None)
    pa.add_argument("--mbs", type=int, default=1)
    pa.add_argument("--seed", type=int, default=0)
    pa.add_argument("--json", action="store_true")
    pp = sub.add_parser("pipeline", help="pipeline cuts of a model on V100 servers (Auto-MAP DQN)")
    pp.add_argument("model", help="preset name (see `archplace models`), e.g. bert-48, t5-3b")
    pp.add_argument("--cluster", required=True, help="A, B or C: 2, 3 or 4 servers of 8 V100")
    pp.add_argument("--stages", type=int, default=None, help="K (default: the number of servers)")
    pp.add_argument("--algo", choices=PIPELINE_ALGOS, default="rainbow")
    pp.add_argument("--budget", type=int, default=None,
                    help="rainbow: environment steps (default 1300 per cut)")
    pp.add_argument("--pretrained", default=None, help="pretrained: weights .npz (default: the package's)")
    pp.add_argument("--finetune", type=int, default=0, help="pretrained: fine-tuning steps (0: zero-shot)")
    pp.add_argument("--radius", type=int, default=3, help="pruning radius (devices) around server boundaries")
    pp.add_argument("--seed", type=int, default=0)
    pp.add_argument("--json", action="store_true")
    rp = sub.add_parser("report", help="report.md with plots of a finished search")
    rp.add_argument("dir")
    rp.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    run, show = COMMANDS[args.command]
    try:
        res = run(args)
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
