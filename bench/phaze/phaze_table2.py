"""Phaze's Table 2 and Table 5, whole (issue 33): per-model and common architectures over the full
space for the paper's 8 workloads at 1,024 accelerators and global batch 4,096, by two-phase screening
(``archplace search --searcher screen``, ``archplace/platform/screen.py``).

Per variant (the cost model's accounting: ``default`` = exposed sync + Adam; ``sync-paper`` = eq. 18's
sync; ``sgd`` = no optimizer state; ``paper`` = both, the paper's own assumptions) and per workload,
one screen search: phase 1 screens every architecture of the space with the sequential schedule and
the placement DP; phase 2 solves with the layer ILP + DP the top ``--top-k`` of the workload, the top
``--top-k`` of the eight-workload average (the Phaze-Common objective, which spans two searches of
bert-large: BertLarge at t = 1 and Bert with TMP at t in {1, 2, 4, 8}, so the bench ranks it itself and
hands the candidates to every search), the hysteresis-6 picks, the paper's own Table 2 architectures
and TPUv4 (space index 0, the reference of every ratio). It reports

* per workload the best architecture, {p, d, t}, microbatch, recomputation and HBM beside the paper's
  Table 2 row, and the common architecture beside {2, 512, 256, 256, 256} glb 32 MB, 64 GB HBM;
* throughput ratios against TPUv4 + expert placement (Table 4's {p, d, t}) and TPUv4 + archplace's
  placement, with their geomeans (paper: 3.6x, 2.9x, 1.8x);
* MFU in Table 5's form (PaLM's formula, App. B: tokens/s x (6N + 12 L H Q T) / peak matmul FLOP/s);
* hysteresis 6 (Phaze's rule, replayed on the phase-1 values in decreasing area) against the full
  screen: where it stops, what it picks, and the throughput it leaves behind (ILP + DP of both picks);
* wall time per phase here, the measured per-architecture cost, and the projected 64-CPU wall time.

Checkpointed: every workload's search lives in ``RUN_DIR/<code version>/<variant>/<workload>-<settings
hash>`` and resumes at architecture granularity (the result store; a killed run loses nothing stored).
A change of the code the numbers depend on (``_meta.code_version`` of ``NUMBER_MODULES``) or of the
settings starts new directories. Each
invocation appends what it ran, where and how long to ``timing.jsonl`` there. The ILP's budget is
deterministic (CP-SAT deterministic seconds per layer slice); the wall clock is only a safety limit.

    nice -n 10 python bench/phaze/phaze_table2.py [--workloads OPT BertLarge] [--variants default paper]
        [--top-k 32] [--space SPACE.yaml] [--archs-per-task 50] [--ilp-budget 1.0] [--phase 1|all]
        [--address HOST:PORT] [--run-dir runs/phaze_table2] [--out bench/phaze/results/phaze_table2.json]
    python bench/phaze/phaze_table2.py --markdown bench/phaze/results/phaze_table2.json   # the README's
        tables
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402
from phaze_tpuv4 import WORKLOADS  # noqa: E402  (preset, TMP widths, expert {p,d,t}, microbatches)

GLOBAL_BATCH = 4096   # Phaze §6 "Phaze is optimized over 1024 accelerators and a global batch size of 4096"
DEVICES = 1024
VARIANTS = {"default": ("exposed", "adam"), "sync-paper": ("paper", "adam"), "sgd": ("exposed", "sgd"),
            "paper": ("paper", "sgd")}
CLUSTER_CPUS = 64
NUMBER_MODULES = ("archplace.platform", "archplace.algorithms", "archplace.simulators", "archplace.workloads",
                  "archplace.hardware")

# Phaze (ICML'24) Table 2, Section 6 (the text copy in shared/papers carries no page numbers): the
# per-workload Phaze architecture {num_tc, num_vc, pe_x, pe_y, pe_vc}, GLB in MB (first entry of the
# memory tuple), placement {p, d, t}, mbs, recomputation and HBM GB.
PAPER_TABLE2 = {
    "OPT": ((4, 256, 256, 256, 256), 4, (1, 1024, 1), 2, False, 64),
    "BertLarge": ((2, 512, 256, 256, 256), 32, (1, 1024, 1), 4, False, 32),
    "GPT2": ((1, 1024, 256, 256, 256), 8, (1, 1024, 1), 1, False, 64),
    "Llama2-7B": ((4, 1024, 256, 64, 256), 8, (6, 164, 1), 1, True, 64),
    "Bert-TMP": ((1, 1024, 256, 256, 256), 8, (1, 256, 4), 8, False, 32),
    "Megatron-2.5B": ((1, 1024, 256, 256, 256), 8, (2, 256, 2), 2, False, 80),
    "Megatron-8.3B": ((1, 1024, 256, 256, 256), 8, (2, 128, 4), 2, True, 64),
    "GPT3-175B": ((1, 1024, 256, 256, 256), 8, (16, 16, 4), 1, True, 64),
}
# Section 6.1: "a compute configuration of {2,512,256,256,256}, on-chip memory configuration of
# {32,4096,1,4KB}, and an HBM of 64GB"
PAPER_COMMON = ((2, 512, 256, 256, 256), 32)
# Table 5 (Appendix D): MFU % of TPUv4 + expert DP, TPUv4 + Phaze solver, Phaze Common
PAPER_TABLE5 = {"OPT": (5.4, 12.3, 17.1), "BertLarge": (15.9, 47.4, 88.1), "GPT2": (7.4, 19.6, 26.5),
                "Llama2-7B": (38.4, 39.8, 55.0), "Bert-TMP": (13.7, 22.1, 57.4),
                "Megatron-2.5B": (4.6, 4.9, 12.4), "Megatron-8.3B": (6.4, 8.3, 17.2),
                "GPT3-175B": (17.4, 17.5, 31.0)}
# Section 6.1 (and the abstract): per-model 3.6x and common 2.9x over TPUv4 + expert placement; common
# 1.8x over TPUv4 + Phaze's solver
PAPER_RATIOS = {"per_model_vs_tpuv4_expert": 3.6, "common_vs_tpuv4_expert": 2.9,
                "common_vs_tpuv4_solver": 1.8}


def settings_for(name: str, variant: str, args, space: dict | None):
    from archplace.platform.settings import SearchSettings

    model, widths, _, mbs = WORKLOADS[name]
    sync, opt = VARIANTS[variant]
    return SearchSettings(models=(model,), num_devices=args.devices, global_batch=args.global_batch,
                          microbatches=mbs, tmp_widths={model: widths}, sync_model=sync, optimizer=opt,
                          ilp_budget=args.ilp_budget, ilp_time_limit_s=args.ilp_time_limit, space=space)


def run_dir(args, variant: str, name: str, s) -> Path:
    h = hashlib.sha256(json.dumps(s.to_dict(), sort_keys=True).encode()).hexdigest()[:10]
    return Path(args.run_dir) / args.code_version / variant / f"{name}-{h}"


def shared_cache(args) -> Path:
    """One schedule cache for every workload and variant of a code version: its keys hold a slice's
    ops, latencies and solver settings (``platform/schedule_cache.py``), so a slice that two variants
    share (the sync model and the optimizer change the placement, not most layer schedules) is solved
    once."""
    p = Path(args.run_dir) / args.code_version / "schedule_cache.jsonl"
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def screen(args, d: Path, s, extra=(), phase2=True, phase1_extra=()) -> dict:
    from archplace.platform.screen import run_screen

    t0 = time.time()
    res = run_screen(s, d, top_k=args.top_k, address=args.address, resume=True, workers=args.workers,
                     archs_per_trial=args.archs_per_task, progress=not args.quiet, report=False,
                     task_timeout_s=args.task_timeout, schedule_cache=shared_cache(args),
                     extra_candidates=extra, phase2=phase2, prune=not args.no_prune,
                     phase1_extra=phase1_extra)
    st = res["stats"]
    part = {"at": t0, "host": socket.gethostname(), "cpus": _cluster_cpus(), "wall_s": time.time() - t0,
            "phase1": st.get("phase1"), "phase2": st.get("phase2"), "loadavg": os.getloadavg()}
    with open(d / "timing.jsonl", "a") as fh:
        fh.write(json.dumps(part, default=str) + "\n")
    return res


def _cluster_cpus() -> float:
    import ray

    return float(ray.cluster_resources().get("CPU", 0)) if ray.is_initialized() else 0.0


def phase_values(d: Path, phase: int) -> dict[int, dict]:
    """space index -> the model's row of one phase (one model per search)."""
    from archplace.platform.store import ResultStore

    st = ResultStore(d)
    st.load()
    return {int(e["space_index"]): e["rows"][0] for e in st.finished().values()
            if e["rows"][0].get("phase") == phase}


def tp(r: dict | None) -> float:
    return float(r["throughput"]) if r and r["status"] == "ok" and r["throughput"] > 0 else 0.0


def hysteresis_pick(areas: np.ndarray, values: np.ndarray, h: int) -> dict:
    """Phaze's rule (``PhazeGenerator``: decreasing area, buckets of 0.01 mm2, stop once the last h
    bucket maxima are non-increasing) replayed on ``values`` in index order; ``first_unknown`` is the
    first index it needed whose value is NaN (not screened: a pruned phase 1), else None."""
    from archplace.algorithms.search.phaze import PhazeGenerator

    g = PhazeGenerator(areas, hysteresis=h)
    while (i := g.next_index()) is not None:
        if np.isnan(values[i]):
            return {"first_unknown": int(i)}
        g.observe(i, float(values[i]))
    return {"explored": len(g.observed), "converged": g.converged, "pick_index": g.best_index,
            "pick_phase1_value": g.best_value, "first_unknown": None}


def known(p1: dict[int, dict], n: int) -> np.ndarray:
    """Phase-1 values by space index, NaN where not screened (pruned)."""
    v = np.full(n, np.nan)
    for i, r in p1.items():
        v[i] = tp(r)
    return v


def screen_more(args, names, dirs, ss, p1, wanted: dict[str, list[int]]) -> None:
    """Screen (phase 1) the given indices of each workload that are not screened yet; refresh ``p1``."""
    for w in names:
        todo = [int(i) for i in wanted.get(w, ()) if int(i) not in p1[w]]
        if todo:
            screen(args, dirs[w], ss[w], phase2=False, phase1_extra=todo)
            p1[w] = phase_values(dirs[w], 1)


def common_prune(args, names, dirs, ss, p1, n: int) -> dict:
    """The common objective under pruning: bound_common = mean over workloads of the value where
    screened, else the workload's bound (``screen_bounds.npz`` of its search); screen the missing
    workloads of the most promising architectures until no architecture that lacks one reaches the
    k-th best fully screened average (``screen_bound.still_needed``)."""
    from archplace.platform.screen_bound import kth_best, still_needed

    bounds = {}
    for w in names:
        z = np.load(dirs[w] / "screen_bounds.npz")
        bounds[w] = z["b0"]
    rounds = 0
    while True:
        V = np.stack([known(p1[w], n) for w in names])
        mixed = np.where(np.isnan(V), np.stack([bounds[w] for w in names]), V).mean(axis=0)
        exact = V.mean(axis=0)                      # NaN unless every workload is screened
        need = still_needed({"c": mixed}, {"c": exact}, args.top_k)
        if not len(need):
            break
        rounds += 1
        batch = need[:max(4 * args.archs_per_task, 2 * args.top_k)]   # a few tasks per run_screen call
        screen_more(args, names, dirs, ss, p1, {w: [i for i in batch if np.isnan(V[k, i])]
                                                for k, w in enumerate(names)})
    return {"rounds": rounds, "threshold": kth_best(exact, args.top_k),
            "screened_all_workloads": int(np.isfinite(exact).sum())}


def hysteresis_on_demand(args, names, dirs, ss, p1, space, ws: list[str]) -> dict:
    """``hysteresis_pick`` on the average over ``ws``, screening what the replay reaches and phase 1
    did not screen (a pruned phase 1), a task's worth at a time in area order."""
    n = len(space)
    while True:
        v = np.mean([known(p1[w], n) for w in ws], axis=0)
        h = hysteresis_pick(space.area_mm2, v, args.hysteresis)
        if h["first_unknown"] is None:
            return h
        i = h["first_unknown"]
        batch = list(range(i, min(n, i + args.archs_per_task)))
        screen_more(args, names, dirs, ss, p1, {w: batch for w in ws})


def find_index(space, arch: tuple[int, ...], glb: float) -> int | None:
    m = ((space.num_tc == arch[0]) & (space.num_vc == arch[1]) & (space.pe_x == arch[2])
         & (space.pe_y == arch[3]) & (space.glb_mb == glb))
    hit = np.flatnonzero(m)
    return int(hit[0]) if len(hit) else None


def mfu(name: str, throughput: float, acc, devices: int, params: dict) -> float:
    """PaLM App. B: tokens/s x (6N + 12 L H Q T) / (devices x peak matmul FLOP/s); H Q = hidden."""
    from archplace.workloads.models import full_model_parameters, preset

    model = WORKLOADS[name][0]
    p = preset(model)
    c = p.config
    layers = c.get("n_layer") or c.get("num_hidden_layers")
    hidden = c.get("n_embd") or c.get("hidden_size")
    if model not in params:
        params[model] = full_model_parameters(model)
    per_token = 6 * params[model] + 12 * layers * hidden * p.seq_len
    return throughput * p.seq_len * per_token / (devices * acc.peak_flops)


def geomean(xs) -> float:
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else math.nan


def run_variant(args, variant: str, space_cfg, space) -> dict:
    names = args.workloads
    ss = {w: settings_for(w, variant, args, space_cfg) for w in names}
    dirs = {w: run_dir(args, variant, w, ss[w]) for w in names}
    t0 = time.time()
    left = {}
    for w in names:                                   # phase 1 of every workload
        print(f"[{variant}] phase 1 {w}: {dirs[w]}", file=sys.stderr)
        left[w] = screen(args, dirs[w], ss[w], phase2=False)["stats"]["phase1"]["remaining"]
    p1 = {w: phase_values(dirs[w], 1) for w in names}
    n = len(space)
    if any(left.values()):
        return {"variant": variant, "complete": False, "phase1_done": {w: len(p1[w]) for w in names},
                "phase1_remaining": left}
    prune = None
    if not args.no_prune:                             # the common objective's own bound-and-prune
        prune = {"common": common_prune(args, names, dirs, ss, p1, n)}
    hyst = {"common": hysteresis_on_demand(args, names, dirs, ss, p1, space, names)}
    for w in names:
        hyst[w] = hysteresis_on_demand(args, names, dirs, ss, p1, space, [w])
    vals = {w: known(p1[w], n) for w in names}
    common = np.mean([vals[w] for w in names], axis=0)    # NaN where some workload was pruned
    with np.errstate(invalid="ignore"):
        order = sorted(np.flatnonzero(common > 0), key=lambda i: (-common[i], i))
    common_top = [int(i) for i in order[:args.top_k]]
    if prune is not None:
        prune["per_workload"] = {w: {"screened": int(np.isfinite(vals[w]).sum()), "architectures": n}
                                 for w in names}
    paper = {w: find_index(space, *PAPER_TABLE2[w][:2]) for w in names}
    paper_common = find_index(space, *PAPER_COMMON)
    shared = sorted({*common_top, hyst["common"]["pick_index"], *([paper_common] if paper_common is not None
                                                                   else [])} - {None})
    t1 = time.time()
    out = {"variant": variant, "sync_model": VARIANTS[variant][0], "optimizer": VARIANTS[variant][1],
           "complete": True, "workloads": {}, "phase1_pruning": prune}
    if args.phase == "1":
        return {**out, "complete": False, "phase1_wall_s_this_run": t1 - t0}
    res = {}
    for w in names:                                   # phase 2 of every workload
        extra = [*shared, hyst[w]["pick_index"], *([paper[w]] if paper[w] is not None else [])]
        print(f"[{variant}] phase 2 {w}: {len(extra)} shared/extra candidates", file=sys.stderr)
        res[w] = screen(args, dirs[w], ss[w], extra=[i for i in extra if i is not None])
    p2 = {w: phase_values(dirs[w], 2) for w in names}
    both = sorted(set.intersection(*(set(p2[w]) for w in names)))
    cavg = {i: float(np.mean([tp(p2[w][i]) for w in names])) for i in both}
    cbest = min((i for i in both if cavg[i] > 0), key=lambda i: (-cavg[i], i), default=None)
    params: dict = {}
    ref = find_index(space, (8, 2, 128, 128, 128), 128)   # TPUv4 (index 0 of the packaged space)
    if ref is None:
        raise ValueError("--space: TPUv4 {8,2,128,128,128} glb 128 MB is not in the space; every ratio "
                         "needs it")
    tpu = space.accelerator(ref)
    for w in names:
        best_i = min((i for i in p2[w] if tp(p2[w][i]) > 0), key=lambda i: (-tp(p2[w][i]), i), default=None)
        b = p2[w].get(best_i) if best_i is not None else None
        r = p2[w].get(ref)
        exp = r["expert_throughput"] if r else math.nan
        exp_tp = float(exp) if exp == exp else 0.0
        com = p2[w].get(cbest) if cbest is not None else None
        scr = res[w]["stats"]["screen"]["per_objective"].get(WORKLOADS[w][0], {})
        hw = hyst[w]
        hw_tp = tp(p2[w].get(hw["pick_index"]))
        out["workloads"][w] = {
            "model": WORKLOADS[w][0], "tmp_widths": WORKLOADS[w][1], "microbatches": WORKLOADS[w][3],
            "per_model": _placement(b, space, best_i), "common": _placement(com, space, cbest),
            "paper_table2": _paper_row(w),
            "paper_arch_here": _placement(p2[w].get(paper[w]), space, paper[w]),
            "tpuv4_expert_throughput": exp_tp, "tpuv4_expert_pdt": WORKLOADS[w][2],
            "tpuv4_archplace": _placement(r, space, ref),
            "ratios": {"per_model_vs_tpuv4_expert": _ratio(tp(b), exp_tp),
                       "common_vs_tpuv4_expert": _ratio(tp(com), exp_tp),
                       "common_vs_tpuv4_archplace": _ratio(tp(com), tp(r)),
                       "tpuv4_archplace_vs_expert": _ratio(tp(r), exp_tp),
                       "per_model_vs_tpuv4_archplace": _ratio(tp(b), tp(r))},
            "mfu_pct": {"tpuv4_expert": 100 * mfu(w, exp_tp, tpu, args.devices, params),
                        "tpuv4_archplace": 100 * mfu(w, tp(r), tpu, args.devices, params),
                        "common": (100 * mfu(w, tp(com), space.accelerator(cbest), args.devices, params)
                                   if cbest is not None else math.nan),
                        "paper_table5": dict(zip(("tpuv4_expert", "tpuv4_phaze", "phaze_common"),
                                                 PAPER_TABLE5[w]))},
            "screen_winner_phase1_rank": scr.get("phase1_rank"), "top_k": args.top_k,
            "hysteresis": {**hw, "pick_label": space.accelerator(hw["pick_index"]).label(),
                           "pick_ilp_throughput": hw_tp, "screen_best_ilp_throughput": tp(b),
                           "left_behind": 1 - hw_tp / tp(b) if tp(b) > 0 else math.nan},
            "timing": _timing(dirs[w]), "run_dir": str(dirs[w]),
        }
    wl = out["workloads"]
    keys = next(iter(wl.values()))["ratios"]
    out["geomean"] = {k: geomean(v["ratios"][k] for v in wl.values()) for k in keys}
    out["paper"] = PAPER_RATIOS
    hc = hyst["common"]
    hc_avg = cavg.get(hc["pick_index"], math.nan)
    left = 1 - hc_avg / cavg[cbest] if cbest is not None else math.nan
    out["common"] = {"index": cbest, "label": space.accelerator(cbest).label() if cbest is not None else None,
                     "throughput_avg": cavg.get(cbest), "candidates_both_phases": len(both),
                     "phase1_rank": order.index(cbest) if cbest in order else None,
                     "paper": {"arch": PAPER_COMMON[0], "glb_mb": PAPER_COMMON[1], "hbm_gb": 64,
                               "index": paper_common,
                               "throughput_avg_here": cavg.get(paper_common)},
                     "hysteresis": {**hc, "pick_label": space.accelerator(hc["pick_index"]).label(),
                                    "pick_ilp_throughput_avg": hc_avg,
                                    "left_behind": left}}
    out["screen_winners_outside_top_half"] = sum(
        1 for v in wl.values() if v["screen_winner_phase1_rank"] is None
        or v["screen_winner_phase1_rank"] >= args.top_k // 2) + int(
        out["common"]["phase1_rank"] is None or out["common"]["phase1_rank"] >= args.top_k // 2)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if a > 0 and b > 0 else math.nan


def _placement(r: dict | None, space, i) -> dict | None:
    if r is None or i is None:
        return None
    return {"index": int(i), "arch": space.accelerator(int(i)).label(), "status": r["status"],
            "throughput": tp(r), "pdt": [r["p"], r["d"], r["t"]], "microbatch": r["microbatch"],
            "recompute": bool(r["recompute"]), "hbm_gb": r["hbm_gb"], "stages": r["num_stages"],
            "area_mm2": r["area_mm2"], "error": r["error"] or None}


def _paper_row(w: str) -> dict:
    arch, glb, pdt, mbs, rec, hbm = PAPER_TABLE2[w]
    return {"arch": arch, "glb_mb": glb, "pdt": pdt, "microbatch": mbs, "recompute": rec, "hbm_gb": hbm}


def _timing(d: Path) -> dict:
    """Every invocation's parts of one workload's search: wall per phase, architectures, where."""
    parts = [json.loads(x) for x in (d / "timing.jsonl").read_text().splitlines()] if (
        d / "timing.jsonl").exists() else []
    p1 = [p["phase1"] for p in parts if p.get("phase1") and p["phase1"].get("new")]
    p2 = [p["phase2"] for p in parts if p.get("phase2") and p["phase2"].get("new")]
    n1, task1 = sum(p["new"] for p in p1), sum(p["task_s"] for p in p1)
    per_arch = task1 / n1 if n1 else math.nan
    n_space = p1[0]["architectures"] if p1 else 0
    w2 = sum(p["wall_s"] for p in p2)
    cpu2 = sum(p["wall_s"] * max(1, p.get("parallel_evaluations") or 1) for p in p2)
    pruned = None
    if (d / "screen_prune.json").exists():
        rec = json.loads((d / "screen_prune.json").read_text())
        pruned = {k: rec.get(k) for k in ("bound", "top_k", "architectures", "evaluated", "pruned",
                                          "threshold", "complete")}
    # a pruned phase 1 screens only its evaluated architectures (and spends the bound's time once)
    n_work = pruned["evaluated"] if pruned else n_space
    bound_s = sum(p.get("bound_s") or 0.0 for p in p1)
    return {"parts": [{k: p.get(k) for k in ("at", "host", "cpus", "wall_s", "loadavg")} for p in parts],
            "phase1_wall_s": sum(p["wall_s"] for p in p1), "phase1_archs": n1,
            "phase1_task_s_per_arch": per_arch, "phase1_bound_s": bound_s, "phase1_pruning": pruned,
            "phase2_wall_s": w2, "phase2_archs": sum(p["new"] for p in p2),
            # layer-slice schedules already in the shared cache when phase 2 began (earlier workloads and
            # variants solved them): a later variant's phase 2 is mostly cache hits, so its wall is small
            "phase2_cache_slices_at_start": p2[0].get("cache_loaded") if p2 else None,
            # a bound, not a measurement: phase 2's work spread over 64 CPUs once it fills them
            "projected_64cpu_s": {"phase1": n_work * per_arch / CLUSTER_CPUS if n1 else math.nan,
                                  "phase2": cpu2 / CLUSTER_CPUS}}


def measure(args, space_cfg, space) -> dict:
    """Phase 1's per-architecture cost of each workload, in this process (no Ray): ``--measure K``
    evenly spaced architectures, each through ``evaluate_sequential`` (what a screen task runs), and the
    phase-1 wall time that implies for the whole space on this machine's CPUs and on 64."""
    from archplace.platform.evaluate import evaluate_sequential
    from archplace.workloads.models import build_graph

    out = {}
    idx = np.linspace(0, len(space) - 1, args.measure).round().astype(int)
    for w in args.workloads:
        s = settings_for(w, "default", args, space_cfg)
        t0 = time.perf_counter()
        graphs = {k: build_graph(k[0], seq=s.seq, mbs=k[1], tmp=k[2]) for k in s.graph_keys()}
        t_graph = time.perf_counter() - t0
        secs = []
        for i in idx:
            t1 = time.perf_counter()
            evaluate_sequential(space.accelerator(int(i)).to_dict(), s, graphs)
            secs.append(time.perf_counter() - t1)
        per = float(np.mean(secs))
        out[w] = {"graphs_s": t_graph, "per_arch_s": per, "samples": [int(i) for i in idx],
                  "sample_s": secs, "loadavg": os.getloadavg(),
                  "projected_phase1_s": {"here": len(space) * per / (os.cpu_count() or 1),
                                         f"{CLUSTER_CPUS}_cpus": len(space) * per / CLUSTER_CPUS}}
        print(f"{w:14s} {per:6.2f} s per architecture (graphs {t_graph:.1f} s); phase 1 over {len(space)}: "
              f"{len(space) * per / 3600 / (os.cpu_count() or 1):.1f} h here, "
              f"{len(space) * per / 3600 / CLUSTER_CPUS:.2f} h on {CLUSTER_CPUS} CPUs", flush=True)
    return out


def prune_estimate(args, space_cfg, space) -> dict:
    """How many architectures the pruned phase 1 screens, per (variant, workload), in this process (no
    Ray): the bounds over the whole space (``screen_bound.throughput_bounds``), then
    ``--prune-sample`` seeded random architectures (a check that no value exceeds its bound) and the
    pruned screen itself in bound order (``screen_in_bound_order``), at most ``--prune-estimate``
    evaluations. If it completes, its count is what phase 1 evaluates (a Ray run may overshoot by its
    in-flight window). If the budget stops it, the architectures whose bound is already below the k-th
    best value found are pruned whatever comes later (the k-th best only rises): a lower bound on the
    pruned share, so the projected CPU time is an upper bound."""
    from archplace.platform.evaluate import evaluate_sequential
    from archplace.platform.screen_bound import kth_best, prunable, screen_in_bound_order, throughput_bounds
    from archplace.workloads.models import build_graph

    n = len(space)
    rng = np.random.default_rng(args.seed)
    sample = [int(i) for i in rng.choice(n, size=min(n, args.prune_sample), replace=False)]
    out: dict = {}
    for variant in args.variants:
        for w in args.workloads:
            s = settings_for(w, variant, args, space_cfg)
            t0 = time.perf_counter()
            graphs = {k: build_graph(k[0], seq=s.seq, mbs=k[1], tmp=k[2], capture_blocks=s.capture_blocks)
                      for k in s.graph_keys()}
            t1 = time.perf_counter()
            b = throughput_bounds(space, s, graphs)[s.models[0]]
            bound_s = time.perf_counter() - t1
            secs: dict[int, float] = {}

            def ev(i: int, s=s, graphs=graphs, secs=secs) -> dict:
                t = time.perf_counter()
                r = evaluate_sequential(space.accelerator(i).to_dict(), s, graphs)["rows"][0]
                secs[i] = time.perf_counter() - t
                return {"m": tp(r)}

            res = screen_in_bound_order(ev, {"m": b}, args.top_k, budget=args.prune_estimate, first=sample)
            v = res["values"]["m"]
            ev_idx = np.flatnonzero(~np.isnan(v))
            thr = kth_best(v, args.top_k)
            sure = int((np.isnan(v) & prunable(b, thr)).sum())
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(b[ev_idx] > 0, v[ev_idx] / b[ev_idx], 0.0)
            top = sorted(ev_idx, key=lambda i: (-v[i], i))[:args.top_k]
            per = float(np.mean(list(secs.values()))) if secs else math.nan
            rnd = [secs[i] for i in sample if i in secs]
            per_random = float(np.mean(rnd)) if rnd else per   # what the full screen costs an architecture
            work = len(res["order"]) if res["complete"] else n - sure
            spent = float(sum(secs.values()))
            row = {"architectures": n, "evaluated": len(res["order"]), "complete": res["complete"],
                   "random_sample": len(sample), "budget": args.prune_estimate,
                   "kth_best": thr, "pruned_for_sure": sure, "pruned_share_at_least": sure / n,
                   "screened_at_most": work, "best_bound": float(b.max()),
                   "value_over_bound": {"max": float(ratio.max()), "median": float(np.median(ratio)),
                                        "top_k_min": float(min(v[i] / b[i] for i in top)) if top else None,
                                        "top_k_max": float(max(v[i] / b[i] for i in top)) if top else None},
                   "bound_violations": int((ratio > 1).sum()),
                   "graphs_s": t1 - t0, "bound_s": bound_s, "per_arch_s": per,
                   "per_arch_s_random": per_random, "loadavg": os.getloadavg(),
                   # pruned: the bound, what ran, and (budget stopped it) the rest at the mean cost so far
                   "projected_phase1_cpu_s": {"pruned": bound_s + spent + (work - len(secs)) * per,
                                              "full": n * per_random}}
            out.setdefault(variant, {})[w] = row
            print(f"[{variant}] {w:14s} evaluated {row['evaluated']} (complete {row['complete']}), pruned "
                  f">= {sure}/{n} ({sure / n:.1%}); bound {bound_s:.0f} s, {per:.3f} s/arch; value/bound max "
                  f"{row['value_over_bound']['max']:.3f}; phase 1 "
                  f"{row['projected_phase1_cpu_s']['pruned'] / 3600:.2f} CPU-h vs "
                  f"{n * per_random / 3600:.2f} CPU-h full",
                  flush=True)
    return {"runs": out, "projection": project_all(out, n)}


def project_all(runs: dict, n: int) -> dict:
    """Phase-1 CPU-hours of all 8 workloads x 4 variants, with pruning and without: a measured pair
    where ``runs`` has it; otherwise the per-architecture cost of ``phaze_table2_cost.json`` (variant
    default, measured at its own load) times the architectures, with this workload's pruned share from
    another variant where one was measured ("extrapolated") and no pruning at all where none was
    ("not measured": the pruned total is then an over-estimate)."""
    cost_file = Path(__file__).parent / "results" / "phaze_table2_cost.json"
    cost = json.loads(cost_file.read_text())["measured_phase1_cost"] if cost_file.exists() else {}
    rows, tot = {}, {"pruned_cpu_h": 0.0, "full_cpu_h": 0.0}
    for v in VARIANTS:
        for w in WORKLOADS:
            r = runs.get(v, {}).get(w)
            if r is not None:
                e = {"how": "measured", "pruned_cpu_h": r["projected_phase1_cpu_s"]["pruned"] / 3600,
                     "full_cpu_h": r["projected_phase1_cpu_s"]["full"] / 3600}
            else:
                per = cost.get(w, {}).get("per_arch_s", math.nan)
                shares = [runs[u][w]["screened_at_most"] / runs[u][w]["architectures"]
                          for u in runs if w in runs[u]]
                keep = max(shares) if shares else 1.0
                e = {"how": "extrapolated" if shares else "not measured", "full_cpu_h": n * per / 3600,
                     "pruned_cpu_h": n * per * keep / 3600}
            rows[f"{v}/{w}"] = e
            tot["pruned_cpu_h"] += e["pruned_cpu_h"]
            tot["full_cpu_h"] += e["full_cpu_h"]
    return {"per_variant_workload": rows, "total": tot}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS))
    ap.add_argument("--devices", type=int, default=DEVICES)
    ap.add_argument("--global-batch", type=int, default=GLOBAL_BATCH)
    ap.add_argument("--top-k", type=int, default=32)
    ap.add_argument("--hysteresis", type=int, default=6)
    ap.add_argument("--space", help="search-space YAML (default: the packaged Phaze space, 29,831 archs)")
    ap.add_argument("--archs-per-task", type=int, default=50)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--task-timeout", type=float, default=1800.0,
                    help="seconds any one wait on a screen task or an ILP architecture's tasks may take")
    ap.add_argument("--ilp-budget", type=float, default=1.0, help="deterministic seconds per layer slice")
    ap.add_argument("--ilp-time-limit", type=float, default=300.0, help="wall-clock safety limit per slice")
    ap.add_argument("--phase", choices=("1", "all"), default="all", help="1: screen only (resume later)")
    ap.add_argument("--no-prune", action="store_true",
                    help="phase 1 screens every architecture (default: bound-and-prune, the same top k; "
                         "archplace/platform/screen_bound.py)")
    ap.add_argument("--address", help="Ray cluster: auto or HOST:PORT (default: an embedded Ray)")
    ap.add_argument("--run-dir", default="runs/phaze_table2")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--measure", type=int, default=0,
                    help="only time phase 1 on this many architectures per workload (no Ray, no screen)")
    ap.add_argument("--prune-estimate", type=int, default=0,
                    help="only estimate the pruned phase 1: at most this many evaluations per workload "
                         "(no Ray, no screen)")
    ap.add_argument("--prune-sample", type=int, default=20,
                    help="--prune-estimate: seeded random architectures evaluated first (a bound check)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="default bench/phaze/results/phaze_table2.json "
        "(--prune-estimate: "
                                                 "phaze_table2_prune_estimate.json)")
    args = ap.parse_args()
    if args.out is None:
        name = "phaze_table2_prune_estimate.json" if args.prune_estimate else "phaze_table2.json"
        args.out = str(Path(__file__).parent / "results" / name)
    load = os.getloadavg()
    bad = (set(args.workloads) - set(WORKLOADS)) | (set(args.variants) - set(VARIANTS))
    if bad:
        print(f"unknown workloads/variants {sorted(bad)}; known: {list(WORKLOADS)} / {list(VARIANTS)}",
              file=sys.stderr)
        return 2
    from archplace.hardware.space import enumerate_space, load_space_config

    # the modules the numbers depend on (not cli/api/service): a run spread over sessions survives a
    # change to the user-facing layers, and restarts when anything it computes with changes
    args.code_version = code_version(*NUMBER_MODULES)
    space_cfg = load_space_config(args.space) if args.space else None
    space = enumerate_space(space_cfg)
    if args.measure:
        results = {"measured_phase1_cost": measure(args, space_cfg, space)}
    elif args.prune_estimate:
        results = {"prune_estimate": prune_estimate(args, space_cfg, space)}
    else:
        results = {"variants": [run_variant(args, v, space_cfg, space) for v in args.variants]}
        _print(results["variants"])
    doc = {"benchmark": "phaze_table2", **git_state(), "command": command(), "machine": machine(load),
           "code_version": args.code_version, "space": {"file": args.space, "architectures": len(space)},
           "settings": {k: v for k, v in vars(args).items() if k != "code_version"},
           "solver_limits": {"phase1": {"schedule": "sequential", "layer_ilp": None, "placement": "exact DP"},
                             "phase2": {"schedule": "ilp",
                                        "ilp_budget_deterministic_s_per_slice": args.ilp_budget,
                                        "ilp_wall_clock_safety_limit_s": args.ilp_time_limit,
                                        "placement": "exact DP"}},
           **results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.out}")
    return 0


def _print(results: list[dict]) -> None:
    for v in results:
        if not v.get("complete"):
            print(f"[{v['variant']}] incomplete: {v.get('phase1_done', 'phase 1 only')}")
            continue
        print(f"\n[{v['variant']}] sync {v['sync_model']}, optimizer {v['optimizer']}")
        print(f"{'workload':14s} {'per-model best':28s} {'{p,d,t}':>13s} {'mbs':>3s} {'/s':>9s} "
              f"{'xTPU exp':>8s} {'common xexp':>11s} {'xTPU ours':>9s} {'MFU exp/ours/common %':>22s} "
              f"{'hyst left':>9s}")
        for w, r in v["workloads"].items():
            b, m, q = r["per_model"] or {}, r["mfu_pct"], r["ratios"]
            print(f"{w:14s} {b.get('arch', '-'):28s} {str(b.get('pdt', '-')):>13s} "
                  f"{b.get('microbatch', 0):3d} "
                  f"{b.get('throughput', 0):9.1f} {q['per_model_vs_tpuv4_expert']:8.2f} "
                  f"{q['common_vs_tpuv4_expert']:11.2f} {q['common_vs_tpuv4_archplace']:9.2f} "
                  f"{m['tpuv4_expert']:6.1f}/{m['tpuv4_archplace']:5.1f}/{m['common']:5.1f}       "
                  f"{r['hysteresis']['left_behind']:9.1%}")
        g, c = v["geomean"], v["common"]
        print(f"common {c['label']}; geomean per-model/TPUv4+expert {g['per_model_vs_tpuv4_expert']:.2f}x "
              f"(paper 3.6x), common/TPUv4+expert {g['common_vs_tpuv4_expert']:.2f}x (2.9x), "
              f"common/TPUv4+archplace {g['common_vs_tpuv4_archplace']:.2f}x (1.8x); hysteresis 6 picks "
              f"{c['hysteresis']['pick_label']}, leaving {c['hysteresis']['left_behind']:.1%}")


def markdown(path: str) -> str:
    """The README's Table 2 / Table 5 analogue from a bench JSON: per variant the geomean ratios beside
    the paper's, then per workload (default variant) the architecture, placement and MFU."""
    doc = json.loads(Path(path).read_text())
    vs = [v for v in doc.get("variants", []) if v.get("complete")]
    if not vs:
        raise SystemExit(f"{path}: no complete variant (run phase 2 first)")
    lines = [f"From `{path}` (commit {doc['commit'][:7]}, top-k {doc['settings']['top_k']}, "
             f"{doc['space']['architectures']:,} architectures).", "",
             "| variant (sync, optimizer) | per-model / TPUv4+expert | common / TPUv4+expert "
             "| common / TPUv4+archplace | TPUv4+archplace / TPUv4+expert | hysteresis 6 leaves (common) "
             "| common architecture |", "|---|---|---|---|---|---|---|"]
    for v in vs:
        g = v["geomean"]
        lines.append(f"| {v['variant']} ({v['sync_model']}, {v['optimizer']}) | "
                     f"{g['per_model_vs_tpuv4_expert']:.2f}× | {g['common_vs_tpuv4_expert']:.2f}× | "
                     f"{g['common_vs_tpuv4_archplace']:.2f}× | {g['tpuv4_archplace_vs_expert']:.2f}× | "
                     f"{v['common']['hysteresis']['left_behind']:.1%} | {v['common']['label']} |")
    p5 = [r["mfu_pct"]["paper_table5"] for r in vs[0]["workloads"].values()]
    placement = geomean([p["tpuv4_phaze"] / p["tpuv4_expert"] for p in p5])   # Table 5's own ratio
    lines.append(f"| Phaze paper | {PAPER_RATIOS['per_model_vs_tpuv4_expert']}× | "
                 f"{PAPER_RATIOS['common_vs_tpuv4_expert']}× | {PAPER_RATIOS['common_vs_tpuv4_solver']}× | "
                 f"{placement:.2f}× (Table 5's MFU) | - | {{2,512,256,256,256}} glb32MB |")
    lines += ["", "The headline without the two Megatron workloads (whose expert placements are the weakest "
              "baselines) and each expert baseline's MFU % beside the paper's Table 5:", "",
              "| variant | per-model / TPUv4+expert, all 8 → without Megatron | common / TPUv4+expert, "
              "all 8 → without Megatron | TPUv4 + expert MFU %, ours (paper) per workload |",
              "|---|---|---|---|"]
    for v in vs:
        g, wl = v["geomean"], v["workloads"]
        rest = {w: r for w, r in wl.items() if not w.startswith("Megatron")}
        gr = {k: geomean(r["ratios"][k] for r in rest.values()) for k in g}
        mf = ", ".join(f"{w} {r['mfu_pct']['tpuv4_expert']:.1f} "
                       f"({r['mfu_pct']['paper_table5']['tpuv4_expert']})" for w, r in wl.items())
        lines.append(f"| {v['variant']} | {g['per_model_vs_tpuv4_expert']:.2f}× → "
                     f"{gr['per_model_vs_tpuv4_expert']:.2f}× | {g['common_vs_tpuv4_expert']:.2f}× → "
                     f"{gr['common_vs_tpuv4_expert']:.2f}× | {mf} |")
    lines += ["", "| variant | phase 1: pairs screened, wall | phase 2: ILP + DP evaluations, wall "
              "(cached slice schedules at its start) | projected on 64 CPUs (phase 1 + 2) |",
              "|---|---|---|---|"]
    for v in vs:
        t = [r["timing"] for r in v["workloads"].values()]
        c0 = t[0].get("phase2_cache_slices_at_start")
        n1, w1 = sum(x["phase1_archs"] for x in t), sum(x["phase1_wall_s"] for x in t) / 60
        n2, w2 = sum(x["phase2_archs"] for x in t), sum(x["phase2_wall_s"] for x in t) / 60
        proj = sum(x["projected_64cpu_s"]["phase1"] + x["projected_64cpu_s"]["phase2"] for x in t) / 60
        lines.append(f"| {v['variant']} | {n1:,}, {w1:.0f} min | {n2}, {w2:.0f} min "
                     f"({c0 if c0 is not None else '?'}) | {proj:.1f} min |")
    v = vs[0]
    lines += ["", f"Per workload, variant `{v['variant']}` (MFU %, PaLM's formula: TPUv4 + expert / TPUv4 + "
              "archplace / common; the paper's Table 5 in brackets):", "",
              "| workload | per-model best | {p,d,t} mbs | × TPUv4+expert | paper's arch & {p,d,t} "
              "| MFU % (paper) | hysteresis-6 leaves |", "|---|---|---|---|---|---|---|"]
    for w, r in v["workloads"].items():
        b, m, pt = r["per_model"] or {}, r["mfu_pct"], r["paper_table2"]
        p5 = m["paper_table5"]
        lines.append(
            f"| {w} | {b.get('arch', '-')} | {b.get('pdt')} {b.get('microbatch')} | "
            f"{r['ratios']['per_model_vs_tpuv4_expert']:.2f} | {{{','.join(map(str, pt['arch']))}}} "
            f"glb{pt['glb_mb']}MB {pt['pdt']} | {m['tpuv4_expert']:.1f} / {m['tpuv4_archplace']:.1f} / "
            f"{m['common']:.1f} ({p5['tpuv4_expert']} / {p5['tpuv4_phaze']} / {p5['phaze_common']}) | "
            f"{r['hysteresis']['left_behind']:.1%} |")
    if len(vs) > 1:
        names = " / ".join(u["variant"] for u in vs)
        lines += ["", f"Per workload and variant ({names}): the per-model ratio over TPUv4 + expert, and "
                  "MFU % of TPUv4 + archplace and of the common architecture (the paper's Table 5 in "
                  "brackets):", "", "| workload | per-model / TPUv4+expert | MFU % TPUv4 + archplace (paper) "
                  "| MFU % common (paper) |", "|---|---|---|---|"]

        def each(rows, get, fmt):
            return " / ".join(format(get(x), fmt) for x in rows)

        for w in v["workloads"]:
            p5 = v["workloads"][w]["mfu_pct"]["paper_table5"]
            rows = [u["workloads"][w] for u in vs]
            lines.append(
                f"| {w} | {each(rows, lambda x: x['ratios']['per_model_vs_tpuv4_expert'], '.2f')} | "
                f"{each(rows, lambda x: x['mfu_pct']['tpuv4_archplace'], '.1f')} ({p5['tpuv4_phaze']}) | "
                f"{each(rows, lambda x: x['mfu_pct']['common'], '.1f')} ({p5['phaze_common']}) |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--markdown":
        print(markdown(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
