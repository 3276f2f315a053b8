"""``archplace search`` and ``report``: the architecture × placement co-search on Ray Tune, and the
report of a finished one.

Each ``cmd_*`` turns argv into a request and returns the result's ``to_dict()`` (the ``--json`` output);
each ``print_*`` writes the human summary; each ``add_*_parser`` declares the flags."""

from __future__ import annotations

import dataclasses
from typing import Any

from archplace import api
from archplace.api.codesign import MCM_PLACERS, TARGETS
from archplace.cli import status
from archplace.cli.common import (
    NO_CONTENTION_HELP,
    add_ilp_budget_args,
    add_model_args,
    add_training_args,
    float_list,
    int_list,
)
from archplace.cli.vocabulary import BUDGETS_KEY, add_devices, budgets, count, positive, refuse, renamed


def cmd_search(args) -> dict[str, Any]:
    from pathlib import Path

    from archplace.platform.search import check_address, check_paths, set_run_start
    from archplace.workloads.byom import hf_ref

    models = tuple(args.models) + tuple(hf_ref(c, allow_unmapped_ops=args.allow_unmapped_ops)
                                        for c in args.hf_config or ())
    if not models:
        raise ValueError("give one or more MODELs or --hf-config CONFIG.json")
    # what needs no model, before a config's transformers import (seconds) and before --out is made
    if args.out:
        check_paths(Path(args.out).resolve(), args.schedule_cache)
    check_address(args.address)
    st = status.active()
    if st is not None:   # one clock: the progress line, the summary and report.md count from the start
        set_run_start(st.start)
    req = api.SearchRequest(
        models=models, out_dir=args.out, accelerators=args.devices,
        global_batch=args.global_batch, searcher=args.searcher, budget=args.max_archs, address=args.address,
        resume=args.resume, retry_failed=args.retry_failed, workers=args.workers,
        archs_per_trial=args.archs_per_trial, schedule=args.schedule, schedule_cache=args.schedule_cache,
        wait_timeout_s=args.wait_timeout, microbatches=int_list(args.microbatches, "--microbatches"),
        hbm_gb=float_list(args.hbm, "--hbm"), recompute=args.recompute, seq=args.seq,
        tmp_widths=int_list(args.tmp_widths, "--tmp-widths") if args.tmp_widths else None,
        ilp_budget=args.ilp_det_time, ilp_time_limit_s=args.ilp_timeout, space=args.space,
        hysteresis=args.hysteresis,
        area_bucket_mm2=args.area_bucket, seed=args.seed, max_failures=args.max_failures,
        contention=not args.no_contention, optimizer=args.optimizer, sync_model=args.sync_model,
        grad_reduce_dtype=args.grad_reduce_dtype, capture_blocks=args.capture_blocks,
        screen_top_k=args.screen_top_k,
        screen_prune=args.screen_prune)
    req = dataclasses.replace(req, **_codesign_args(args))
    # the progress line is on stderr: with --json too when run as the program. Ctrl-C or SIGTERM: the
    # architectures that finished are stored, and commands.stopped exits 130 / 143 (128 + the signal)
    # with "resume with --resume", where Tune's own handler used to end the run as if it had finished
    res = api.search(req, terminal_progress=not args.json or st is not None)
    return {**res.to_dict(), BUDGETS_KEY: _budgets(req)}


def _budgets(req) -> dict[str, Any]:
    """What bounded the search: architectures (designs; the screen searcher evaluates the whole space),
    and per target the solver work each took."""
    archs = None if req.searcher == "screen" else req.budget
    if req.target == "mcm":
        return budgets(max_archs=archs, subsolves=req.subsolves, det_time_s=req.det_time)
    if req.target != "accelerator" or (req.schedule != "ilp" and req.searcher != "screen"):
        return budgets(max_archs=archs)
    return budgets(max_archs=archs, ilp_det_time_s=req.ilp_budget, ilp_timeout_s=req.ilp_time_limit_s)


def print_search(res: dict[str, Any]) -> None:
    if res.get("target") in ("mcm", "gpu-cluster"):
        return print_codesign(res)
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
        if ilp.get("load_dependent"):
            print(f"  warning      {ilp['load_dependent']} slice solve(s) stopped by the wall-clock safety "
                  "limit or a solver failure: those answers may differ on a machine under another load; "
                  "raise --ilp-timeout (or lower --ilp-det-time)")
    scr = st.get("screen")
    if scr is not None:   # searcher screen: the two phases, and how deep in phase 1 the winners were
        p1, p2 = st.get("phase1") or {}, st.get("phase2") or {}
        print(f"  screen       phase 1: {p1.get('architectures', 0)} architectures (sequential schedule), "
              f"{p1.get('new', 0)} new in {p1.get('wall_s', 0):.1f} s; phase 2 (ILP + DP): "
              f"{len(st.get('phase2_candidates') or [])} candidates, {p2.get('new', 0)} new in "
              f"{p2.get('wall_s', 0):.1f} s; winners outside phase 1's top {scr['top_k'] // 2}: "
              f"{scr['outside_top_half']} of {scr['objectives']} objectives")
        pr = p1.get("prune")
        if pr:
            print(f"  pruned       {pr['pruned']:,} of {pr['architectures']:,} architectures: their proven "
                  f"bound is below every objective's k-th best (listed in screen_prune.json)")
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
    from archplace.platform.codesign_report import write_any_report

    path = write_any_report(args.dir)
    return {"report": str(path)}


def print_report(res: dict[str, Any]) -> None:
    print(f"wrote {res['report']}")


def add_search_parser(sub) -> None:
    se = sub.add_parser("search", help="architecture × placement co-search on Ray Tune")
    se.add_argument("models", nargs="*", help="model presets; one trial evaluates all of them")
    add_model_args(se, many=True)
    add_devices(se, "accelerators each architecture is placed on (default 1024; --target accelerator)",
                default=1024, old=("--accelerators",))
    refuse(se, ("--arch", "--gpu"), "search searches the hardware: its space is --space FILE.yaml for "
                                    "--target accelerator (Phaze's accelerator templates), mcm (chiplet "
                                    "packages) or gpu-cluster (GPU clusters); estimate and place take "
                                    "--arch, place-ops, pipeline and shard take --gpu")
    se.add_argument("--global-batch", type=int, default=4096)
    se.add_argument("--searcher", default="phaze",
                    help="phaze (area order + hysteresis), optuna, random, grid, or screen (every "
                         "architecture of the space with the sequential schedule, then the ILP on the "
                         "top --screen-top-k per model and across models; --max-archs does not apply)")
    se.add_argument("--screen-top-k", type=int, default=None,
                    help="searcher screen: architectures per objective that phase 2 solves with the ILP "
                         "(default 32)")
    se.add_argument("--screen-prune", action="store_true",
                    help="searcher screen: phase 1 in decreasing order of a proven throughput bound, "
                         "skipping every architecture that cannot reach any objective's top k (the same "
                         "top k and winners; the skipped ones are listed in screen_prune.json)")
    se.add_argument("--max-archs", type=count("architectures", high=10**9), default=16, metavar="N",
                    help="most architectures (mcm, gpu-cluster: hardware designs) to evaluate (default 16)")
    renamed(se, "--budget", "--max-archs", "max_archs", type=count("architectures", high=10**9))
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
    se.add_argument("--hbm", default="32,64,80",
                    help="HBM sizes in GiB each searched architecture is tried at (the reference TPUv4 "
                         "keeps its own 32 GiB: it is the chip it names)")
    se.add_argument("--recompute", choices=sorted(api.RECOMPUTE), default="both")
    se.add_argument("--seq", type=int, default=None)
    se.add_argument("--tmp-widths", help="TMP widths to consider, e.g. 1,2 (default: each model's own)")
    add_ilp_budget_args(se, api.SearchRequest.ilp_budget, api.SearchRequest.ilp_time_limit_s)
    se.add_argument("--no-contention", action="store_true", help=NO_CONTENTION_HELP)
    add_training_args(se)
    se.add_argument("--space", help="search-space YAML (default: the packaged Phaze Table 1 space)")
    se.add_argument("--hysteresis", type=int, default=6)
    se.add_argument("--area-bucket", type=float, default=0.01,
                    help="Phaze area bucket in mm² (0 = exact areas)")
    se.add_argument("--seed", type=int, default=0)
    se.add_argument("--max-failures", type=int, default=2,
                    help="retries of an architecture whose evaluation failed")
    add_codesign_args(se)
    se.add_argument("--json", action="store_true")


def add_report_parser(sub) -> None:
    rp = sub.add_parser("report", help="report.md with plots of a finished search")
    rp.add_argument("dir")
    rp.add_argument("--json", action="store_true")


# ---------------------------------------------------------------------- co-design targets (issue 32)
def add_codesign_args(se) -> None:
    se.add_argument("--target", choices=TARGETS, default="accelerator",
                    help="what hardware is searched: accelerator (Phaze), mcm (chiplet packages, "
                         "tune_configs/mcm_codesign.yaml) or gpu-cluster; for mcm and gpu-cluster the "
                         "searchers are random, grid, optuna and pareto (NSGA-II), and the default phaze "
                         "means pareto")
    se.add_argument("--placer", choices=MCM_PLACERS, default=api.SearchRequest.placer,
                    help="mcm: how each model is partitioned on each package")
    se.add_argument("--subsolves", type=int, default=api.SearchRequest.subsolves,
                    help="mcm: CP-SAT sub-solves per model and package (cpsat: the same work in one solve)")
    se.add_argument("--det-time", type=positive(float, "deterministic seconds"),
                    default=api.SearchRequest.det_time, metavar="DSEC",
                    help="mcm: CP-SAT deterministic seconds per sub-solve")
    se.add_argument("--finetune-subsolves", type=int, default=0,
                    help="mcm ppo-pretrained: PPO fine-tune sub-solves on each problem first (0: zero-shot)")
    se.add_argument("--policy", help="mcm ppo-pretrained: the pre-trained weights "
                                     "(default tune_configs/mcm_large_policy.npz)")


def _codesign_args(args) -> dict[str, Any]:
    return {"target": args.target, "placer": args.placer, "subsolves": args.subsolves,
            "det_time": args.det_time, "finetune_subsolves": args.finetune_subsolves, "policy": args.policy}


def print_codesign(res: dict[str, Any]) -> None:
    st = res.get("stats", {})
    print(f"{res['target']} co-design of {', '.join(res['models'])} [{res['searcher']}"
          + (f", placer {res['placer']}" if res.get("placer") else "") + f"]: {res['evaluated']} designs "
          f"({st.get('resumed', 0)} resumed, {res['failed']} failed, {res['infeasible']} infeasible) "
          f"in {st.get('wall_s', 0):.1f} s")
    c = res.get("common")
    if c is None:
        print("  no design was feasible for every model")
    else:
        print(f"  best design  {c['arch_label']}: {c['throughput_avg']:,.1f} {res['throughput_unit']} at "
              f"{c['cost_usd']:,.2f} USD ({c['throughput_per_kusd']:,.1f} per k$)")
    print(f"  Pareto front {len(res.get('pareto', []))} designs of (throughput, {res['cost']})")
    out = res["out_dir"]
    print(f"  results      {out}/evaluations.parquet, {out}/best.json, {out}/report.md")
