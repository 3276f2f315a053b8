"""What a search computes for one architecture, as plain functions (no Ray): the DP per microbatch,
the result row of one model, and the whole ``--schedule sequential`` evaluation. The Ray tasks in
``tasks.py`` call these, and so do the benches' in-process loops, so both paths compute the same
numbers by construction.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from ..algorithms.solvers.placement import PlacementLayers


def arch_key(acc) -> str:
    glb = int(acc.glb_mb) if float(acc.glb_mb).is_integer() else acc.glb_mb
    return f"{acc.num_tc}-{acc.num_vc}-{acc.pe_x}-{acc.pe_y}-{acc.pe_vc}-glb{glb}"


def arch_columns(acc) -> dict[str, Any]:
    """The result-store columns that describe an architecture."""
    from ..hardware.area import accelerator_area_mm2
    from ..hardware.presets import TPUV4

    key = arch_key(acc)
    return {"arch_key": key, "arch_label": acc.label(), "num_tc": acc.num_tc, "num_vc": acc.num_vc,
            "pe_x": acc.pe_x, "pe_y": acc.pe_y, "pe_vc": acc.pe_vc, "glb_mb": float(acc.glb_mb),
            "area_mm2": float(accelerator_area_mm2(acc)), "is_reference": key == arch_key(TPUV4)}


def hbm_for(acc, settings) -> tuple[float, ...]:
    """The HBM sizes (GiB) an architecture's placements try: the search's ``hbm_gb`` (HBM is a design
    choice of the architectures searched), except for the reference TPUv4, which is the chip it names
    (its own 32 GiB), so no baseline quietly runs with more HBM than its chip."""
    from ..hardware.presets import TPUV4

    return (TPUV4.hbm_gb,) if arch_key(acc) == arch_key(TPUV4) else tuple(settings.hbm_gb)


def expert_for(model: str, num_devices: int) -> tuple[int, int, int] | None:
    from ..workloads.models import EXPERT_STRATEGIES

    expert = EXPERT_STRATEGIES.get(model)
    return None if expert is None or math.prod(expert) > num_devices else expert


def dp_for_microbatch(layers_by_t: dict[int, PlacementLayers], num_devices: int, global_batch: int, mbs: int,
                      hbm_gb: tuple[float, ...], recompute: tuple[bool, ...], link_bw: float,
                      expert_pdt: tuple[int, int, int] | None, sync_model: str = "exposed",
                      grad_reduce_dtype: str = "bf16") -> dict[str, Any]:
    """The placement DP for one microbatch size over HBM sizes and recomputation, and the expert
    strategy's throughput when one is given."""
    from ..algorithms.solvers.throughput import expert_sweep, sweep

    t0 = time.perf_counter()
    best, _ = sweep({mbs: layers_by_t}, num_devices, global_batch, hbm_gb, recompute, link_bw,
                    sync_model=sync_model, grad_reduce_dtype=grad_reduce_dtype)
    expert = None
    if expert_pdt is not None and expert_pdt[2] in layers_by_t:
        expert, _ = expert_sweep({mbs: layers_by_t}, expert_pdt, num_devices, global_batch, hbm_gb, recompute,
                                 link_bw, sync_model, grad_reduce_dtype)
    return {"best": best, "expert": expert, "dp_s": time.perf_counter() - t0}


def placement_row(model: str, outs: list[dict[str, Any]], expert: tuple[int, int, int] | None
                  ) -> dict[str, Any]:
    """The result row of one model from the DP outputs of its microbatch sizes (the best feasible
    placement over them; ``infeasible`` with the DP's reason when none fits)."""
    best = None
    for o in outs:
        b = o["best"]
        if best is None or (b.feasible and (not best.feasible or b.throughput > best.throughput)):
            best = b
    exp_tp = float("nan")
    if expert is not None:
        feas = [o["expert"].throughput for o in outs if o["expert"] is not None and o["expert"].feasible]
        exp_tp = max(feas) if feas else 0.0
    ok = bool(best.feasible)
    return {
        "model": model, "status": "ok" if ok else "infeasible",
        "error": "" if ok else (best.reason or "no placement fits"),
        "throughput": float(best.throughput) if ok else 0.0,
        "time_per_batch_s": float(best.time_per_batch_s) if ok else float("nan"),
        "p": int(best.p or 0) if ok else 0, "d": int(best.d or 0) if ok else 0,
        "t": int(best.t or 0) if ok else 0,
        "microbatch": int(best.microbatch or 0) if ok else 0,
        "hbm_gb": float(best.hbm_bytes / 2**30) if ok else float("nan"),
        "recompute": bool(best.recompute) if ok else False,
        "num_stages": len(best.stages) if ok else 0,
        "stages_json": json.dumps([{"first": s.first, "last": s.last, "devices": s.devices,
                                    "load_s": s.load_s} for s in best.stages]) if ok else "[]",
        "expert_throughput": exp_tp, "expert_pdt": ",".join(map(str, expert)) if expert else "",
        "dp_s": float(max(o["dp_s"] for o in outs)),
    }


def evaluate_sequential(arch: dict[str, Any], settings, graphs: dict[tuple[str, int, int], Any]
                        ) -> dict[str, Any]:
    """One architecture under Phaze's sequential schedule (no ILP) for every model of ``settings``:
    ``{"rows": one row per model, "value": the across-model average throughput}``. ``graphs`` maps
    (model, microbatch, TMP width) to the operator graph."""
    from ..algorithms.solvers.throughput import placement_layers
    from ..hardware.accelerator import Accelerator
    from ..simulators.estimate import estimate_graph

    acc = Accelerator.from_dict(arch)
    common = arch_columns(acc)
    rows = []
    for model in settings.models:
        t0 = time.perf_counter()
        by_mbs: dict[int, dict[int, PlacementLayers]] = {}
        for mbs, t in settings.cases(model):
            g = graphs[(model, mbs, t)]
            est = estimate_graph(g, acc, link_bw=settings.link_bw_bytes_per_s)
            by_mbs.setdefault(mbs, {})[t] = placement_layers(g, est.single_s, est.all_s, sequential=True,
                                                             optimizer=settings.optimizer)
        t1 = time.perf_counter()
        expert = expert_for(model, settings.num_devices)
        hbm = hbm_for(acc, settings)
        outs = [dp_for_microbatch(lys, settings.num_devices, settings.global_batch, mbs, hbm,
                                  settings.recompute, settings.link_bw_bytes_per_s, expert,
                                  settings.sync_model, settings.grad_reduce_dtype)
                for mbs, lys in by_mbs.items()]
        row = {**common, **placement_row(model, outs, expert), "schedule": "sequential",
               "estimate_s": t1 - t0, "ilp_s": 0.0}
        row["total_s"] = time.perf_counter() - t0
        rows.append(row)
    return {"rows": rows, "value": float(np.mean([r["throughput"] for r in rows]))}
