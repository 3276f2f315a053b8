"""``archplace plan`` against published Megatron-LM runs: the published configuration priced by ``plan``,
the same run as ``bench/gpu/gpu_validation.py`` predicts it, and the configuration ``plan`` picks itself.

For every row of Narayanan et al. 2021 Table 1 and Korthikanti et al. 2022 Table 5 (both modes: full
recomputation, and sequence parallelism + selective recomputation), on the ``a100-80gb`` preset (8 per
node on NVLink; the preset's network, one 25 GB/s HDR NIC per GPU as on Selene):

- ``published``: the run's configuration (t, p, d, b, v, recomputation, sequence parallelism, global
  batch, GPUs) and its iteration time (Table 5's seconds; Table 1's implied ``F / (n · X)``, as
  gpu_validation computes it). Knobs the papers do not give (Table 1's b and v, Table 3's v) are
  gpu_validation's ASSUMPTIONS; its tables are imported, not copied.
- ``plan_fixed``: ``api.plan`` with every knob fixed to the published configuration (cp 1, ZeRO 0, eager
  attention: gpu_validation times the captured eager graph) on gpu_validation's GPT-2 config of the run's
  width (``_config_file``) with the run's depth, seq 2048, bf16 gradients, calibrated op model, and the
  overlap the run had as gpu_validation assumes it: Korthikanti's 2022 runs overlapped the backward
  tensor-parallel all-reduce (``overlap=True``; d = 1, so no data-parallel sync), Narayanan's 2021 runs
  overlapped nothing (``overlap=False``). Its step time, error against the published time, memory per
  GPU, and the layer split it chose (with v = 1 it may choose uneven first / last stages).
  ``plan_fixed_overlap_on`` (Table 1 rows): the same with plan's default, overlap on.
- ``gpu_validation``: gpu_validation's own prediction for the row (its ``run_korthikanti`` /
  ``run_narayanan``, calibrated) and the relative difference from ``plan_fixed``, taken apart cause by
  cause with ``simulators.train_step``'s own functions (``decomposition``): the backward TP all-reduce
  behind the weight-gradient GEMMs, plan's layer split instead of the even one, a tied embedding counted
  once when one stage holds both embedding and LM head (``train_step.step_time`` adds the head's
  parameters, the tied matrix included, to the single stage: archplace/simulators/train_step.py:269,
  so its optimizer step and data-parallel all-reduce count that matrix twice), and the data-parallel
  all-reduce hidden behind the stage's last backward (plan's overlap); the residual after the named
  causes is reported (expected ~1e-15).
- ``plan_pick``: ``api.plan`` with nothing fixed (same GPUs, batch, sequence; top 3): its knobs, step time,
  speed-up over the published configuration priced under the same assumptions (overlap on; >= 1 because
  the published configuration is in the space: asserted), memory, and ``why_different`` from the knob and
  time-part differences. ``plan_pick_eager``: the same with only the attention fixed to eager (the
  published runs predate fused FlashAttention-style kernels), to separate the kernel's gain.

Summary per table: median |relative error| of ``plan_fixed`` against the published times, Spearman's rho
(scipy.stats.spearmanr) of the times, the largest difference from gpu_validation and the largest
residual, the rows where ``plan_pick`` beats the published configuration with the geometric-mean
speed-up, and wall time per row.

    python bench/gpu/plan_validation.py [--rows SUBSTRING ...] [--out JSON]
    python bench/gpu/plan_validation.py --markdown [bench/gpu/results/plan_validation.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # bench/: _meta
sys.path.insert(0, str(HERE))         # bench/gpu/: gpu_validation's tables and functions
import gpu_validation as gv  # noqa: E402
from _meta import command, git_state, machine  # noqa: E402

OP_MODEL = "calibrated"
TOP_K = 3
OUT = HERE / "results" / "plan_validation.json"
KNOBS = ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sequence_parallel", "zero", "attention")
KOR_MODES = (("full recompute", "full", False),
             ("present work (sequence parallel + selective)", "selective", True))
GROUPS = (("korthikanti_table5", "Korthikanti Table 5"), ("narayanan_table1", "Narayanan Table 1"),
          ("all", "both tables"))


def config_file(tmp: Path, hidden: int, heads: int, layers: int) -> Path:
    """gpu_validation's GPT-2 of the run's width (``_config_file``: vocabulary 51,200, 2,048 positions,
    tanh GELU), with the run's depth: ``plan`` reads the layer count from the config."""
    cfg = json.loads(gv._config_file(tmp, hidden, heads).read_text())
    cfg["n_layer"] = layers
    out = tmp / f"gpt_h{hidden}_a{heads}_l{layers}.json"
    out.write_text(json.dumps(cfg))
    return out


def runs() -> list[dict]:
    """Every row: its name, the model's sizes, the published configuration and time."""
    out = []
    for label, heads, hidden, layers, t, p, n, batch, b, v in gv.KORTHIKANTI_T3:
        for i, (mode, rec, sp) in enumerate(KOR_MODES):
            pub = {"tp": t, "pp": p, "dp": n // (t * p), "mbs": b, "vp": v, "recompute": rec,
                   "sequence_parallel": sp, "global_batch": batch, "gpus": n,
                   "iteration_s": gv.KORTHIKANTI_T5[label][i],
                   "source": "Korthikanti et al. 2022 Table 5 (s), Table 3 configuration; v from calculon's "
                             "inputs (gpu_validation ASSUMPTIONS)"}
            out.append({"run": f"Korthikanti Table 5 {label} {mode}", "group": "korthikanti_table5",
                        "gv_label": f"{label} {mode}", "model_label": label, "heads": heads,
                        "hidden": hidden, "layers": layers, "published": pub})
    for label, _params_b, heads, hidden, layers, t, p, n, batch, tflops, _pct, _agg in gv.NARAYANAN_T1:
        flops = gv.narayanan_flops(batch, layers, hidden)
        pub = {"tp": t, "pp": p, "dp": n // (t * p), "mbs": 1, "vp": 1, "recompute": "full",
               "sequence_parallel": False, "global_batch": batch, "gpus": n,
               "iteration_s": flops / (n * tflops * 1e12), "tflops_per_gpu": tflops,
               "source": "Narayanan et al. 2021 Table 1: F / (n X) with F by Eq. 3; b = 1, v = 1 assumed "
                         "(gpu_validation ASSUMPTIONS)"}
        out.append({"run": f"Narayanan Table 1 {label}", "group": "narayanan_table1", "gv_label": label,
                    "model_label": label, "heads": heads, "hidden": hidden, "layers": layers,
                    "published": pub})
    return out


def gv_predictions(rows: list[dict], tmp: Path):
    """gpu_validation's own calibrated predictions (its run_korthikanti / run_narayanan) by (group, label),
    and its Layers object (the LayerCosts they used)."""
    L = gv.Layers(tmp, [OP_MODEL])
    pred = {}
    if any(r["group"] == "korthikanti_table5" for r in rows):
        pred.update({("korthikanti_table5", r["label"]): r for r in gv.run_korthikanti(L)})
    if any(r["group"] == "narayanan_table1" for r in rows):
        pred.update({("narayanan_table1", r["label"]): r for r in gv.run_narayanan(L, (1,))})
    return L, pred


def split_step_s(costs: dict, layers_per_stage: list[int], setup, links, *, hidden: int,
                 shared_params: int = 0, dp_behind_backward: bool = False) -> float:
    """``train_step.step_time`` for any layer split (its formulas and functions, stage by stage), with
    ``shared_params`` (a tied embedding) taken off the single stage when one stage holds embedding and
    head, and with ``dp_behind_backward`` each stage's gradient all-reduce hidden behind its last backward
    where shorter (plan's overlap rule, plan_search ``_price``). With an even split and neither option it
    is ``step_time`` exactly (checked per row: ``split_helper_vs_step_time_rel``)."""
    from archplace.simulators.train_step import (
        microbatch_time,
        pipeline_time_s,
        ring_allgather_s,
        ring_allreduce_s,
    )

    p, v, m, t = setup.pp, setup.virtual_stages, setup.microbatches, setup.tp
    layer, embed, head = costs["transformer.h.1"], costs["embed"], costs["head"]
    lt = microbatch_time(layer, setup, links)
    plain = replace(setup, recompute="none")
    shrink = (1.0 - 1.0 / t) if setup.sequence_parallel else 0.0

    def fwd(c):   # a layer's forward: compute and forward collectives (recomputation is in the backward)
        return (c.fwd_compute_s - shrink * c.replicated_fwd_s
                + sum(ring_allreduce_s(x, t, links.tp_bytes_per_s) for x in c.fwd_collective_bytes))

    p2p = 0.0
    if p > 1:
        act = setup.micro_batch * gv.SEQ * hidden * gv.BPE
        p2p = 2 * v * (act / t / links.pp_bytes_per_s + ring_allgather_s(act, t, links.tp_bytes_per_s))
    stage = np.array([k * lt.total_s + p2p for k in layers_per_stage])
    fwd_stage = np.array([k * fwd(layer) + p2p / 2 for k in layers_per_stage])
    params = np.array([k * layer.params for k in layers_per_stage], dtype=np.int64)
    stage[0] += microbatch_time(embed, plain, links).total_s
    stage[-1] += microbatch_time(head, plain, links).total_s
    fwd_stage[0] += fwd(embed)
    fwd_stage[-1] += fwd(head)
    params[0] += embed.params
    params[-1] += head.params
    if p == 1:
        params[0] -= shared_params
    busiest = int(params.max())

    def allreduce(x):
        return ring_allreduce_s(int(x) * gv.GRAD_BYTES_PER_PARAM, setup.dp, links.dp_bytes_per_s)

    if dp_behind_backward:
        dp_s = max(max(allreduce(x) - b, 0.0) for x, b in zip(params, stage - fwd_stage))
    else:
        dp_s = allreduce(busiest)
    opt_s = busiest * gv.OPTIMIZER_BYTES_PER_PARAM / links.hbm_bytes_per_s
    return pipeline_time_s(stage, m, v) + dp_s + opt_s


def shared_params_of(hidden: int, heads: int, t: int, b: int, tmp: Path) -> int:
    """Tied parameters one GPU counts in both the embedding and the head of gpu_validation's graph."""
    from archplace.workloads.hf_config import hf_ref
    from archplace.workloads.models import build_graph

    g = build_graph(hf_ref(gv._config_file(tmp, hidden, heads)), seq=gv.SEQ, mbs=b, tmp=t)
    bpe = int(g.meta.get("bytes_per_element", 2))
    return sum(int(s["bytes"]) for s in g.meta.get("shared_params") or ()
               if {"embed", "head"} <= set(s.get("layers", ()))) // bpe


def _chain(start: float, steps: list[tuple[str, float]], target: float) -> dict:
    """Successive predictions from ``start`` towards ``target``: each step's value and relative effect."""
    out, prev = {"steps_s": {}, "effect_rel": {}}, start
    for name, val in steps:
        out["steps_s"][name] = val
        out["effect_rel"][name] = val / prev - 1
        prev = val
    out["target_s"] = target
    out["residual_rel"] = target / prev - 1
    return out


def decompose(row: dict, gv_overlap: bool, L, fixed: dict, fixed_on: dict | None, tmp: Path) -> dict:
    """gpu_validation's prediction -> plan_fixed's (and, for a run priced without overlap, -> plan's default
    with overlap on), one cause at a time (module docstring)."""
    from archplace.simulators.train_step import TrainSetup, step_time

    pub = row["published"]
    t, p, d, b, v = pub["tp"], pub["pp"], pub["dp"], pub["mbs"], pub["vp"]
    costs = L.get(row["hidden"], row["heads"], t, b)[OP_MODEL]
    setup = TrainSetup(tp=t, pp=p, dp=d, micro_batch=b, global_batch=pub["global_batch"], virtual_stages=v,
                       recompute=pub["recompute"], sequence_parallel=pub["sequence_parallel"],
                       tp_bwd_overlap=gv_overlap)
    lk = gv.links(t, d)
    kw = dict(activation_bytes=b * gv.SEQ * row["hidden"] * gv.BPE, embed=costs["embed"], head=costs["head"],
              grad_bytes_per_param=gv.GRAD_BYTES_PER_PARAM,
              optimizer_bytes_per_param=gv.OPTIMIZER_BYTES_PER_PARAM,
              shared_params=costs.get("shared_params", 0))
    layer = costs["transformer.h.1"]
    base = step_time(layer, row["layers"], setup, lk, **kw).iteration_s
    hk = dict(hidden=row["hidden"])
    shared = shared_params_of(row["hidden"], row["heads"], t, b, tmp) if p == 1 else 0
    even = [row["layers"] // p] * p
    out = {"gpu_validation_recomputed_s": base, "gpu_validation_tp_bwd_overlap": gv_overlap,
           "split_helper_vs_step_time_rel": split_step_s(costs, even, setup, lk, **hk) / base - 1,
           "shared_params_per_gpu": shared}
    split = fixed["layers_per_stage"]
    out["to_plan_fixed"] = _chain(base, [
        ("plan_split", split_step_s(costs, split, setup, lk, **hk)),
        ("tied_embedding_once", split_step_s(costs, split, setup, lk, **hk, shared_params=shared))],
        fixed["step_time_s"])
    if fixed_on is not None and fixed_on.get("step_time_s") is not None:
        on = replace(setup, tp_bwd_overlap=True)
        split = fixed_on["layers_per_stage"]
        out["to_plan_overlap_on"] = _chain(base, [
            ("tp_bwd_overlap", step_time(layer, row["layers"], on, lk, **kw).iteration_s),
            ("plan_split", split_step_s(costs, split, on, lk, **hk)),
            ("tied_embedding_once", split_step_s(costs, split, on, lk, **hk, shared_params=shared)),
            ("dp_allreduce_behind_last_backward",
             split_step_s(costs, split, on, lk, **hk, shared_params=shared, dp_behind_backward=True))],
            fixed_on["step_time_s"])
    return out


def _request(row: dict, model: str, **kw):
    from archplace.api.planning import PlanRequest

    pub = row["published"]
    return PlanRequest(model=model, gpus=pub["gpus"], global_batch=pub["global_batch"], gpu=gv.GPU,
                       seq=gv.SEQ, grad_reduce_dtype="bf16", op_model=OP_MODEL, **kw)


def plan_fixed(row: dict, model: str, overlap: bool) -> dict:
    from archplace.api.planning import plan

    pub = row["published"]
    fixed = dict(tp=pub["tp"], pp=pub["pp"], dp=pub["dp"], cp=1, vp=pub["vp"], mbs=pub["mbs"],
                 recompute=pub["recompute"], sequence_parallel=pub["sequence_parallel"], zero=0,
                 attention="eager")
    t0 = time.perf_counter()
    r = plan(_request(row, model, fixed=fixed, top_k=1, overlap=overlap))
    out = {"fixed": fixed, "overlap": overlap, "fits": r.fits, "reason": r.reason,
           "wall_s": time.perf_counter() - t0, "timed": r.timed, "network": r.network}
    b = r.best
    if b is None:
        out.update(step_time_s=None, rel_error=None, layers_per_stage=None)
        return out
    lps, per = b["layers_per_stage"], row["layers"] // pub["pp"]
    out.update(step_time_s=b["step_time_s"], rel_error=b["step_time_s"] / pub["iteration_s"] - 1,
               memory_per_gpu_bytes=b["memory_per_gpu_bytes"],
               memory_per_gpu_gib=b["memory_per_gpu_bytes"] / 2 ** 30, memory=b["memory"],
               layers_per_stage=lps, even_layers_per_stage=[per] * pub["pp"],
               split=("even" if len(set(lps)) == 1 else
                      f"uneven: first stage {lps[0]}, last {lps[-1]}, middle "
                      f"{lps[1] if len(lps) > 2 else '-'} (gpu_validation: {per} each)"),
               mfu=b["mfu"], time=b["time"], microbatches=b["microbatches"])
    return out


def plan_pick(row: dict, model: str, fixed: dict | None = None) -> dict:
    from archplace.api.planning import plan

    t0 = time.perf_counter()
    r = plan(_request(row, model, fixed=fixed, top_k=TOP_K))
    out = {"fixed": fixed or {}, "fits": r.fits, "reason": r.reason, "wall_s": time.perf_counter() - t0,
           "evaluated": r.evaluated, "pruned": r.pruned, "invalid": r.invalid, "timed": r.timed,
           "splits_priced": r.splits_priced}
    b = r.best
    if b is None:
        return out
    out.update(knobs={k: b[k] for k in KNOBS}, step_time_s=b["step_time_s"],
               layers_per_stage=b["layers_per_stage"], microbatches=b["microbatches"],
               memory_per_gpu_bytes=b["memory_per_gpu_bytes"],
               memory_per_gpu_gib=b["memory_per_gpu_bytes"] / 2 ** 30, mfu=b["mfu"], time=b["time"],
               unvalidated=b["unvalidated"],
               top=[{**{k: c[k] for k in KNOBS}, "layers_per_stage": c["layers_per_stage"],
                     "step_time_s": c["step_time_s"],
                     "memory_per_gpu_gib": c["memory_per_gpu_bytes"] / 2 ** 30}
                    for c in r.top])
    return out


def why_different(fixed: dict, pick: dict) -> str:
    """One line from the knob differences between the published configuration (as plan prices it, overlap
    on) and plan's pick: the knobs, the time parts that moved most, why each knob helps in the model, and
    what in the pick no published row validates."""
    fk, pk = fixed["fixed"], pick["knobs"]
    diffs = [f"{k} {fk[k]}->{pk[k]}" for k in KNOBS if fk[k] != pk[k]]
    if not diffs:
        return ("the published configuration itself" if fixed["layers_per_stage"] == pick["layers_per_stage"]
                else f"the published knobs with layers per stage {pick['layers_per_stage']}")
    ft, pt = fixed["time"], pick["time"]
    parts = {"m x busiest stage": (ft["pipeline_s"] - ft["bubble_s"], pt["pipeline_s"] - pt["bubble_s"]),
             "bubble": (ft["bubble_s"], pt["bubble_s"]),
             "exposed DP sync": (ft["dp_sync_s"], pt["dp_sync_s"]),
             "optimizer": (ft["optimizer_s"], pt["optimizer_s"])}
    moved = sorted(parts.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))
    moved = [f"{name} {a:.3g}->{b:.3g} s" for name, (a, b) in moved
             if abs(a - b) > 1e-3 * fixed["step_time_s"]][:3]
    why = []
    if pk["attention"] != fk["attention"]:
        why.append("fused attention keeps the score matrix out of HBM" if pk["attention"] == "sdpa"
                   else "eager attention")
    if pk["recompute"] != fk["recompute"]:
        why.append(f"{'no' if pk['recompute'] == 'none' else pk['recompute']} recomputation instead of "
                   f"{fk['recompute']}: less forward work repeated")
    if pk["pp"] != fk["pp"]:
        why.append("fewer pipeline stages: less bubble and p2p" if pk["pp"] < fk["pp"]
                   else "more pipeline stages: fewer parameters per GPU")
    if pk["vp"] != fk["vp"]:
        why.append(f"{pk['vp']} interleaved chunks: bubble / {pk['vp']}")
    if pk["tp"] != fk["tp"]:
        why.append(f"tensor parallel {pk['tp']}: "
                   + ("fewer, smaller NVLink all-reduces" if pk["tp"] < fk["tp"]
                      else "more ranks share each GEMM"))
    if pk["sequence_parallel"] and not fk["sequence_parallel"]:
        why.append("sequence parallelism splits the replicated norms and dropouts over t")
    if pk["mbs"] != fk["mbs"]:
        why.append(f"micro-batch {pk['mbs']}: " + ("larger GEMMs" if pk["mbs"] > fk["mbs"] else
                                                    "more micro-batches, smaller bubble" if pk["pp"] > 1 else
                                                    "less activation memory"))
    if pk["zero"] != fk["zero"]:
        why.append(f"ZeRO {pk['zero']}: state sharded over {pk['dp'] * pk['cp']} ranks (memory)")
    line = ", ".join(diffs) + ": " + "; ".join(moved or ["the same time parts"])
    if why:
        line += " (" + "; ".join(why) + ")"
    caveats = []
    if pk["zero"] >= 1:
        caveats.append(f"ZeRO {pk['zero']}")
    if pk["dp"] * pk["cp"] > 1 and pt.get("dp_comm_s", 0.0) > pt["dp_sync_s"] + 1e-12:
        caveats.append(f"a DP sync of {pt['dp_comm_s']:.3g} s priced behind the last backward "
                       f"({pt['dp_sync_s']:.3g} s exposed)")
    if pk["cp"] > 1:
        caveats.append("context parallelism")
    if pk["attention"] == "sdpa":
        caveats.append("fused attention")
    if caveats:
        line += "; not validated by any published row here: " + ", ".join(caveats)
    return line


def geomean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return float(math.exp(sum(math.log(x) for x in xs) / len(xs))) if xs else None


def _errors(rows: list[dict], get) -> dict:
    """Median / mean / max relative error and Spearman's rho of ``get(row)`` against the published times."""
    from scipy.stats import spearmanr

    rs = [(r["published"]["iteration_s"], get(r)) for r in rows if get(r) is not None]
    if not rs:
        return {"n": 0}
    pub, pred = np.array([x for x, _ in rs]), np.array([y for _, y in rs])
    err = pred / pub - 1
    s = {"n": len(rs), "median_abs_rel_error": float(np.median(np.abs(err))),
         "mean_rel_error": float(err.mean()), "max_abs_rel_error": float(np.abs(err).max())}
    if len(rs) > 2:
        rho = spearmanr(pred, pub)
        s.update(spearman_rho=float(rho.statistic), spearman_p=float(rho.pvalue))
    return s


def summarise(rows: list[dict]) -> dict:
    out = {}
    sel = {"korthikanti_table5": lambda r: r["group"] == "korthikanti_table5",
           "narayanan_table1": lambda r: r["group"] == "narayanan_table1", "all": lambda r: True}
    for key, _ in GROUPS:
        rs = [r for r in rows if sel[key](r)]
        if not rs:
            continue
        s = {"plan_fixed": _errors(rs, lambda r: r["plan_fixed"]["step_time_s"]),
             "gpu_validation": _errors(rs, lambda r: r["gpu_validation"]["iteration_s"])}
        if any("plan_fixed_overlap_on" in r for r in rs):
            s["plan_fixed_overlap_on"] = _errors(
                rs, lambda r: r.get("plan_fixed_overlap_on", r["plan_fixed"])["step_time_s"])
        diffs = [abs(r["gpu_validation"]["rel_diff_plan_fixed"]) for r in rs
                 if r["gpu_validation"]["rel_diff_plan_fixed"] is not None]
        s["max_abs_rel_diff_plan_fixed_vs_gpu_validation"] = max(diffs) if diffs else None
        res = [abs(c["residual_rel"]) for r in rs
               for k, c in r["gpu_validation"].get("decomposition", {}).items() if k.startswith("to_")]
        s["max_abs_residual_after_causes"] = max(res) if res else None
        for name in ("plan_pick", "plan_pick_eager"):
            sp = [r[name]["speedup_over_plan_fixed"] for r in rs if r[name].get("speedup_over_plan_fixed")]
            beat = [x for x in sp if x > 1 + 1e-9]
            vs_pub = [r["published"]["iteration_s"] / r[name]["step_time_s"] for r in rs
                      if r[name].get("step_time_s")]
            s[name] = {"rows_beating_published_configuration": len(beat), "rows": len(sp),
                       "geomean_speedup_where_beating": geomean(beat),
                       "geomean_speedup_all_rows": geomean(sp),
                       "max_speedup": max(sp) if sp else None,
                       "geomean_published_time_over_pick_time": geomean(vs_pub)}
        walls = [r["wall_s"] for r in rs]
        s["wall_s_per_row"] = {"median": float(np.median(walls)), "max": float(max(walls)),
                               "total": float(sum(walls)), "rows": {r["run"]: r["wall_s"] for r in rs}}
        out[key] = s
    return out


def findings(out: dict) -> list[str]:
    """The notes written from this run's numbers (nothing hard-coded)."""
    f = []
    for key, what in GROUPS:
        s = out["summary"].get(key)
        if not s:
            continue
        e, g = s["plan_fixed"], s["gpu_validation"]
        rho = f", Spearman {e['spearman_rho']:.3f}" if "spearman_rho" in e else ""
        line = (f"{what} ({e['n']} rows): plan_fixed median |error| {e['median_abs_rel_error']:.1%} (mean "
                f"{e['mean_rel_error']:+.1%}{rho}); gpu_validation {g['median_abs_rel_error']:.1%}")
        if "plan_fixed_overlap_on" in s:
            o = s["plan_fixed_overlap_on"]
            line += (f"; with plan's default overlap on every row {o['median_abs_rel_error']:.1%} "
                     f"(mean {o['mean_rel_error']:+.1%})")
        line += (f"; largest |plan_fixed / gpu_validation - 1| "
                 f"{s['max_abs_rel_diff_plan_fixed_vs_gpu_validation']:.2e}, residual after the named causes "
                 f"{s['max_abs_residual_after_causes']:.1e}")
        pk, pe = s["plan_pick"], s["plan_pick_eager"]
        line += (f"; plan_pick beats the published configuration in "
                 f"{pk['rows_beating_published_configuration']}/{pk['rows']} rows (geomean "
                 f"{pk['geomean_speedup_where_beating'] or 1:.2f}x where it does), with eager attention in "
                 f"{pe['rows_beating_published_configuration']}/{pe['rows']} (geomean "
                 f"{pe['geomean_speedup_where_beating'] or 1:.2f}x); wall per row median "
                 f"{s['wall_s_per_row']['median']:.0f} s, max {s['wall_s_per_row']['max']:.0f} s")
        f.append(line)
    for r in out["rows"]:
        for chain, c in r["gpu_validation"].get("decomposition", {}).items():
            if not chain.startswith("to_"):
                continue
            eff = ", ".join(f"{k} {v:+.2e}" for k, v in c["effect_rel"].items() if abs(v) > 1e-9)
            total = c["target_s"] / r["gpu_validation"]["iteration_s"] - 1
            f.append(f"{r['run']}: gpu_validation -> {chain[3:]} {total:+.2e} = {eff or 'nothing'}, "
                     f"residual {c['residual_rel']:+.1e}")
    return f


def run_row(row: dict, tmp: Path, L, gvp: dict, pick_cache: dict) -> dict:
    from archplace.workloads.hf_config import hf_ref

    t0 = time.perf_counter()
    cfg = config_file(tmp, row["hidden"], row["heads"], row["layers"])
    model = hf_ref(cfg)
    row = {**row, "model": {"config": json.loads(cfg.read_text()), "file": cfg.name}}
    pub = row["published"]
    # the overlap the run had, as gpu_validation assumes it: Korthikanti's 2022 runs overlapped the backward
    # TP all-reduce (d = 1: no DP sync); Narayanan's 2021 runs overlapped nothing (Megatron's local DDP)
    era_overlap = row["group"] == "korthikanti_table5"
    fx = plan_fixed(row, model, overlap=era_overlap)
    row["plan_fixed"] = fx
    fx_on = fx if era_overlap else plan_fixed(row, model, overlap=True)
    if not era_overlap:
        row["plan_fixed_overlap_on"] = fx_on
    pr = gvp[(row["group"], row["gv_label"])]["predicted"][OP_MODEL]
    g = {"iteration_s": pr["iteration_s"], "rel_error": pr["iteration_s"] / pub["iteration_s"] - 1,
         "tp_bwd_overlap": era_overlap, "dp_overlap": False,
         "layers_per_stage": [row["layers"] // pub["pp"]] * pub["pp"],
         "rel_diff_plan_fixed": fx["step_time_s"] / pr["iteration_s"] - 1 if fx["step_time_s"] else None}
    if not era_overlap and fx_on.get("step_time_s"):
        g["rel_diff_plan_fixed_overlap_on"] = fx_on["step_time_s"] / pr["iteration_s"] - 1
    if fx["step_time_s"] is not None:
        g["decomposition"] = decompose(row, era_overlap, L, fx, None if era_overlap else fx_on, tmp)
    row["gpu_validation"] = g
    key = (row["hidden"], row["heads"], row["layers"], pub["gpus"], pub["global_batch"])
    for name, fixed in (("plan_pick", None), ("plan_pick_eager", {"attention": "eager"})):
        if (name, key) not in pick_cache:
            pick_cache[(name, key)] = (plan_pick(row, model, fixed), row["run"])
        pk, first = pick_cache[(name, key)]
        pk = dict(pk)
        if first != row["run"]:
            pk["same_search_as"] = first
            pk["wall_s"] = 0.0
        if pk.get("step_time_s") is not None and fx_on.get("step_time_s") is not None:
            # the same model assumptions (overlap on) on both sides: the configuration's gain alone
            pk["speedup_over_plan_fixed"] = fx_on["step_time_s"] / pk["step_time_s"]
            assert pk["step_time_s"] <= fx_on["step_time_s"] * (1 + 1e-12), (
                f"{row['run']}: {name} {pk['step_time_s']} s is slower than the published configuration's "
                f"{fx_on['step_time_s']} s, which is in its space")
            if not era_overlap:   # and against the run as it ran, without overlap
                pk["speedup_over_plan_fixed_as_run"] = fx["step_time_s"] / pk["step_time_s"]
            pk["why_different"] = why_different(fx_on, pk)
        row[name] = pk
    row["wall_s"] = time.perf_counter() - t0
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", nargs="+", default=None,
                    help="run only the rows whose name contains one of these (case-insensitive), e.g. "
                         "'Korthikanti Table 5 22B' or 'Narayanan Table 1 1.7B'")
    ap.add_argument("--out", default=None,
                    help="JSON to write (default bench/gpu/results/plan_validation.json; with --rows, "
                         "plan_validation_rows.json beside it)")
    ap.add_argument("--markdown", nargs="?", const=str(OUT), default=None, metavar="JSON",
                    help="print the docs results page's tables from a results JSON and exit")
    args = ap.parse_args()
    if args.markdown:
        print(markdown(args.markdown))
        return 0
    rows = runs()
    if args.rows:
        pats = [p.lower() for p in args.rows]
        rows = [r for r in rows if any(p in r["run"].lower() for p in pats)]
        if not rows:
            ap.error(f"--rows {args.rows} matches none of: {[r['run'] for r in runs()]}")
    out_path = Path(args.out) if args.out else (OUT.with_name("plan_validation_rows.json") if args.rows
                                                else OUT)
    load = os.getloadavg()
    t0 = time.perf_counter()
    done = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        L, gvp = gv_predictions(rows, tmp)
        gv_wall = time.perf_counter() - t0
        pick_cache: dict = {}
        for row in rows:
            r = run_row(row, tmp, L, gvp, pick_cache)
            done.append(r)
            fx, pk, g = r["plan_fixed"], r["plan_pick"], r["gpu_validation"]
            print(f"{r['run'][:58]:<58} published {r['published']['iteration_s']:7.2f} s, plan "
                  f"{fx['step_time_s'] or float('nan'):7.2f} s {fx.get('rel_error') or 0:+6.1%}, vs "
                  f"gpu_validation {g['rel_diff_plan_fixed'] or 0:+.1e}; pick "
                  f"{pk.get('step_time_s') or 0:7.2f} s x{pk.get('speedup_over_plan_fixed') or 0:.2f}; "
                  f"{r['wall_s']:.0f} s", flush=True)
    out = {"benchmark": "plan_validation", **git_state(), "command": command(), "machine": machine(load),
           "wall_s": time.perf_counter() - t0, "gpu_validation_wall_s": gv_wall, "gpu": gv.GPU,
           "op_model": OP_MODEL, "seq": gv.SEQ, "vocab": gv.VOCAB, "gpus_per_node": gv.GPUS_PER_NODE,
           "grad_reduce_dtype": "bf16", "top_k": TOP_K, "rows_selected": args.rows,
           "assumptions": gv.ASSUMPTIONS + [
               "plan_fixed fixes cp = 1, ZeRO 0 and eager attention (gpu_validation times the captured eager "
               "graph; the published runs used neither ZeRO nor a fused attention kernel).",
               "plan_fixed prices each run with the overlap gpu_validation assumes for it (overlap=True for "
               "Korthikanti 2022, overlap=False for Narayanan 2021); plan_fixed_overlap_on and plan_pick use "
               "plan's default (overlap on: backward TP all-reduce behind the weight-gradient GEMMs, the "
               "data-parallel collectives behind the compute), and plan_pick's speed-up is over "
               "plan_fixed_overlap_on, so that it measures the configuration alone."],
           "rows": done}
    out["summary"] = summarise(done)
    out["findings"] = findings(out)
    print("\n".join(out["findings"]))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1))
    print(f"wrote {out_path}")
    return 0


def _cfg(k: dict) -> str:
    s = f"t{k['tp']} p{k['pp']} d{k['dp']} b{k['mbs']}" + (f" v{k['vp']}" if k["vp"] > 1 else "")
    s += f" {k['recompute']}" + (" +SP" if k.get("sequence_parallel") else "")
    if k.get("cp", 1) > 1:
        s += f" cp{k['cp']}"
    if k.get("zero"):
        s += f" ZeRO{k['zero']}"
    if k.get("attention", "eager") != "eager":
        s += f" {k['attention']}"
    return s


def _split(lps) -> str:
    if not lps:
        return "-"
    return "even" if len(set(lps)) == 1 else f"{lps[0]} / {lps[1] if len(lps) > 2 else '-'} / {lps[-1]}"


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(path: str) -> str:
    """The docs results page's tables from a results JSON."""
    doc = json.loads(Path(path).read_text())
    root = HERE.parents[1]
    shown = Path(path).resolve()
    shown = shown.relative_to(root) if shown.is_relative_to(root) else Path(path)
    lines = [f"From `{shown}` (commit {str(doc['commit'])[:7]}, {doc['gpu']}, {doc['op_model']} op model, "
             f"{doc['wall_s'] / 60:.1f} min on {doc['machine']['cpu_count']} CPUs).", "",
             "The published configuration priced by `archplace plan` with every knob fixed (ZeRO 0, "
             "eager attention), with the overlap the run had (Korthikanti 2022: backward tensor-parallel "
             "all-reduce behind the weight-gradient GEMMs; Narayanan 2021: none, `--no-overlap`) and, for "
             "the 2021 runs, with plan's default overlap on; beside it `gpu_validation.py`'s prediction of "
             "the same run:", "",
             "| run | published configuration | published s | plan s | error | plan s, overlap on | error "
             "| memory GiB | layers per stage (first / middle / last) | gpu_validation s "
             "| plan / gpu_validation - 1 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        p, fx, g = r["published"], r["plan_fixed"], r["gpu_validation"]
        on = r.get("plan_fixed_overlap_on")
        on_cells = (f"{_f(on['step_time_s'], '.2f')} | {_f(on['rel_error'], '+.1%')}" if on
                    else "(same) | ")
        lines.append(f"| {r['run']} | {_cfg(p)} | {p['iteration_s']:.2f} | {_f(fx['step_time_s'], '.2f')} "
                     f"| {_f(fx['rel_error'], '+.1%')} | {on_cells} | "
                     f"{_f(fx.get('memory_per_gpu_gib'), '.1f')} | {_split(fx.get('layers_per_stage'))} | "
                     f"{g['iteration_s']:.2f} | {_f(g['rel_diff_plan_fixed'], '+.1e')} |")
    lines += ["", "| rows | n | plan median abs. error | mean error | Spearman rho (times) "
              "| gpu_validation median abs. error | plan, overlap on: median abs. error "
              "| plan beats the published configuration | geomean speed-up there "
              "| same, eager attention only |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for key, s in doc["summary"].items():
        e, pk, pe = s["plan_fixed"], s["plan_pick"], s["plan_pick_eager"]
        on = s.get("plan_fixed_overlap_on")
        lines.append(f"| {key} | {e['n']} | {e['median_abs_rel_error']:.1%} | {e['mean_rel_error']:+.1%} "
                     f"| {_f(e.get('spearman_rho'), '.3f')} | "
                     f"{s['gpu_validation']['median_abs_rel_error']:.1%} | "
                     f"{_f(on['median_abs_rel_error'], '.1%') if on else '(same)'} | "
                     f"{pk['rows_beating_published_configuration']}/{pk['rows']} | "
                     f"{pk['geomean_speedup_where_beating'] or 1:.2f}x | "
                     f"{pe['rows_beating_published_configuration']}/{pe['rows']}, "
                     f"{pe['geomean_speedup_where_beating'] or 1:.2f}x |")
    lines += ["", "Why `plan` and `gpu_validation` differ, cause by cause, each priced with "
              "`simulators.train_step`'s functions (relative change of the predicted iteration; residual: "
              "what is left after the named causes):", "",
              "| run | to | backward TP all-reduce overlapped | plan's layer split "
              "| tied embedding counted once | DP all-reduce behind the last backward | residual |",
              "|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        for chain, c in r["gpu_validation"].get("decomposition", {}).items():
            if chain.startswith("to_"):
                e = c["effect_rel"]
                cells = " | ".join(_f(e.get(k), "+.2%") for k in (
                    "tp_bwd_overlap", "plan_split", "tied_embedding_once",
                    "dp_allreduce_behind_last_backward"))
                lines.append(f"| {r['run']} | {chain[3:].replace('_', ' ')} | {cells} | "
                             f"{c['residual_rel']:+.1e} |")
    lines += ["", "What `plan` picks with nothing fixed, and with only the attention fixed to eager "
              "(speed-up over the published configuration as plan prices it with overlap on; both "
              "Korthikanti modes of a model share one search):", "",
              "| run | plan's pick | s | speed-up | memory GiB | why | eager-only pick | speed-up |",
              "|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        pk, pe = r["plan_pick"], r["plan_pick_eager"]
        if pk.get("step_time_s") is None:
            lines.append(f"| {r['run']} | none fits | - | - | - | {pk.get('reason')} | - | - |")
            continue
        lines.append(f"| {r['run']} | {_cfg(pk['knobs'])} | {pk['step_time_s']:.2f} | "
                     f"{_f(pk.get('speedup_over_plan_fixed'), '.2f')}x | "
                     f"{_f(pk['memory_per_gpu_gib'], '.1f')} | "
                     f"{pk.get('why_different', '')} | {_cfg(pe['knobs']) if pe.get('knobs') else '-'} | "
                     f"{_f(pe.get('speedup_over_plan_fixed'), '.2f')}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
