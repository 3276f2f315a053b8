"""Throughput(model, architecture): operator estimates → layer-schedule ILP per unique layer slice →
placement DP over TMP widths, microbatches, HBM sizes and recomputation (spec phaze.md §1.2).

Everything here is plain Python (no Ray); the platform wraps it into actors and Tune trials.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...hardware.accelerator import Accelerator
from ...hardware.constants import PHAZE_LINK_BW_BYTES_PER_S
from ...simulators.estimate import estimate_graph
from ...workloads.graph import OpGraph
from ...workloads.layers import layer_graph
from .expert import expert_placement
from .layer_ilp.budget import LOAD_DEPENDENT
from .placement import Placement, PlacementLayers, TrainingSetup, best_placement


def layer_times_sequential(g: OpGraph, all_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Phaze's sequential baseline: every op intra-op parallel, one after another (Σℓ̂ per layer)."""
    L = len(g.meta["layers"])
    layer, bwd = g.nodes["layer"], g.nodes["is_backward"]
    fw = np.bincount(layer[~bwd], weights=all_s[~bwd], minlength=L)
    bw = np.bincount(layer[bwd], weights=all_s[bwd], minlength=L)
    return fw, bw


def layer_times_ilp(g: OpGraph, single_s: np.ndarray, all_s: np.ndarray, acc: Accelerator,
                    hbm_share: np.ndarray | None = None, glb_share: np.ndarray | None = None,
                    **solve_kw: Any) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Per-layer forward and backward makespans from the layer-schedule ILP; each distinct layer
    slice is solved once. With the per-row bandwidth shares (``OpEstimates``) and ``contention``
    (a ``solve_kw``, default True), concurrently running ops share the HBM and GLB bandwidth."""
    from .layer_ilp import schedule_layers

    res = schedule_layers(g, single_s, all_s, acc.num_tc, acc.num_vc, hbm_share, glb_share, **solve_kw)
    info = {"unique_solved": int(res.get("solved", 0)), "cache_hits": int(res.get("cache_hits", 0)),
            "solve_time_s": float(res.get("solve_time_s", 0.0)),
            "slices": slice_report(res["keys"], res["schedules"], res["layers"])}
    return np.asarray(res["forward_s"]), np.asarray(res["backward_s"]), info


def _gap(x: Any) -> float | None:
    """A solver gap (or peak share) as JSON: None where it is unknown (NaN)."""
    return None if x is None or x != x else float(x)


def slice_report(keys: dict[str, list[str]], schedules: dict[str, Any], names=()) -> list[dict[str, Any]]:
    """One entry per distinct layer slice (key) that the ILP answered: the pass, the layers that
    share it, the solver's status (optimal, feasible, fallback, trivial), its proven relative gap
    (None when no bound is known), its solver, which limit stopped it (``stopped_by``: optimal,
    gap_target, deterministic_limit, wall_limit, ...; ``layer_ilp.STOP_REASONS``; None when not
    known), the deterministic seconds of its budget it spent (``dtime``), and the schedule's peak
    summed HBM and GLB shares (``peak_hbm_share``/``peak_glb_share``: None when the slice was solved
    without shares). ``schedules`` maps key to a ``LayerSchedule`` or to a dict with ``status`` and
    ``gap`` (and optionally ``stopped_by``, ``dtime`` and the peaks)."""
    out: dict[str, dict[str, Any]] = {}
    for pas in ("forward", "backward"):
        for li, key in enumerate(keys[pas]):
            s = schedules.get(key)
            if s is None:
                continue
            get = s.get if isinstance(s, dict) else (lambda k, _s=s: getattr(_s, k, None))
            e = out.setdefault(key, {"key": key[:16], "pass": pas, "layers": [], "status": get("status"),
                                     "gap": _gap(get("gap")), "solver": get("solver"),
                                     "stopped_by": get("stopped_by") or None, "dtime": _gap(get("dtime")),
                                     "peak_hbm_share": _gap(get("peak_hbm_share")),
                                     "peak_glb_share": _gap(get("peak_glb_share"))})
            e["layers"].append(names[li] if li < len(names) else str(li))
    return list(out.values())


def slice_summary(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """``status_counts`` (slices per solver status), ``stopped_by`` (slices per stop reason: which
    limit ended each solve; "unknown" for entries that do not say), ``load_dependent`` (slices that
    the wall-clock safety limit or a solver failure stopped: their answers, and so this result, may
    differ on a machine under another load), ``worst_gap`` (the largest proven relative gap, 0.0
    when every slice is optimal, None when there are no slices), ``gap_unknown`` (slices not proven
    optimal whose gap is unknown), ``worst_slice`` (the entry with the worst gap) and
    ``peak_hbm_share``/``peak_glb_share`` (the largest peak summed bandwidth share over the slices
    that report one; None when none does, e.g. the paper's model without contention)."""
    counts: dict[str, int] = {}
    stops: dict[str, int] = {}
    worst, worst_slice, unknown = None, None, 0
    for e in slices:
        counts[e["status"]] = counts.get(e["status"], 0) + 1
        why = e.get("stopped_by") or "unknown"
        stops[why] = stops.get(why, 0) + 1
        g = e["gap"]
        if g is None:
            if e["status"] not in ("optimal", "trivial"):
                unknown += 1
            continue
        if worst is None or g > worst:
            worst, worst_slice = g, e
    if worst is None and slices and not unknown:
        worst = 0.0
    peaks = {f: max((e[f] for e in slices if e.get(f) is not None), default=None)
             for f in ("peak_hbm_share", "peak_glb_share")}
    return {"status_counts": counts, "stopped_by": stops,
            "load_dependent": sum(stops.get(k, 0) for k in LOAD_DEPENDENT), "worst_gap": worst,
            "gap_unknown": unknown, "worst_slice": worst_slice, **peaks}


def placement_layers(g: OpGraph, single_s: np.ndarray, all_s: np.ndarray, acc: Accelerator | None = None,
                     sequential: bool = False, optimizer: str = "adam",
                     **solve_kw: Any) -> PlacementLayers:
    """The DP's input for one graph (one TMP width and microbatch)."""
    if sequential:
        fw, bw = layer_times_sequential(g, all_s)
    else:
        if acc is None:
            raise ValueError("the layer ILP needs the accelerator (its core counts)")
        fw, bw, _ = layer_times_ilp(g, single_s, all_s, acc, **solve_kw)
    lg = layer_graph(g, optimizer=optimizer)
    L = lg.num_layers
    tp = np.zeros(L, bool)
    sliced = g.nodes["tp_role"] != ""
    tp[np.unique(g.nodes["layer"][sliced])] = True
    return PlacementLayers(int(g.meta.get("tmp", 1) or 1), fw, bw, lg.param_bytes, lg.optimizer_bytes,
                           lg.activation_bytes, tp, lg.edge_src, lg.edge_dst, lg.edge_bytes, lg.names,
                           getattr(lg, "tied_bytes", None))


@dataclass
class ThroughputResult:
    model: str
    accelerator: Accelerator
    best: Placement
    configs: list[dict[str, Any]] = field(default_factory=list)  # one row per (mbs, HBM, recompute)
    timing_s: dict[str, float] = field(default_factory=dict)  # estimate / ilp / dp
    ilp_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.best.throughput if self.best.feasible else 0.0

    def summary(self) -> dict[str, Any]:
        return {"model": self.model, "arch": self.accelerator.to_dict(), "throughput": self.throughput,
                "placement": self.best.summary(), "timing_s": self.timing_s, "ilp": self.ilp_stats,
                "configs": self.configs}


def prepare_layers(model: str, acc: Accelerator, microbatches=(1, 2, 4, 8), tmp_widths=None,
                   num_devices: int = 1024, global_batch: int = 4096, optimizer: str = "adam",
                   link_bw: float = PHAZE_LINK_BW_BYTES_PER_S, seq: int | None = None,
                   schedules=("ilp",), capture_blocks: int = 3, graph_fn=None,
                   **solve_kw: Any) -> tuple[dict, dict[str, float], dict[str, Any]]:
    """``{schedule: {mbs: {t: PlacementLayers}}}`` for the layer-schedule kinds in ``schedules``
    ("ilp" and/or "sequential"), with the time spent per step and the ILP's cache statistics.
    The ILP gets the estimates' bandwidth shares; ``solve_kw`` may set ``contention=False`` (the
    paper's model: concurrently running ops each get the full HBM/GLB bandwidth). ``graph_fn`` (default
    ``build_graph``, same arguments) builds each (microbatch, width) graph: ``place --tp-from shard``
    gives one that slices by a sharding plan instead of the role tables."""
    from ...workloads.models import build_graph, preset

    widths = tuple(tmp_widths or preset(model).tmp_widths)
    timing = {"graph_s": 0.0, "estimate_s": 0.0, "ilp_s": 0.0}
    stats: dict[str, Any] = {"unique_solved": 0, "cache_hits": 0, "slices": []}
    out: dict[str, dict[int, dict[int, PlacementLayers]]] = {k: {} for k in schedules}
    for mbs in microbatches:
        if global_batch % mbs:
            continue
        for t in widths:
            if t > num_devices:
                continue
            t0 = time.perf_counter()
            g = (graph_fn or build_graph)(model, seq=seq, mbs=mbs, tmp=t, capture_blocks=capture_blocks)
            t1 = time.perf_counter()
            est = estimate_graph(g, acc, link_bw=link_bw)
            timing["graph_s"] += t1 - t0
            timing["estimate_s"] += time.perf_counter() - t1
            base = placement_layers(g, est.single_s, est.all_s, sequential=True, optimizer=optimizer)
            shares = {"hbm_share": est.hbm_share, "glb_share": est.glb_share}
            for kind in schedules:
                if kind == "sequential":
                    ly = base
                else:
                    t2 = time.perf_counter()
                    fw, bw, info = layer_times_ilp(g, est.single_s, est.all_s, acc, **shares, **solve_kw)
                    timing["ilp_s"] += time.perf_counter() - t2
                    for k in ("unique_solved", "cache_hits"):
                        stats[k] += int(info.get(k, 0))
                    stats["slices"] += [{**e, "microbatch": mbs, "tmp": t} for e in info["slices"]]
                    ly = dataclasses.replace(base, forward_s=fw, backward_s=bw)
                out[kind].setdefault(mbs, {})[t] = ly
    return out, timing, stats


def sweep(layers_by_mbs: dict[int, dict[int, PlacementLayers]], num_devices: int, global_batch: int,
          hbm_gb=(32, 64, 80), recompute=(False, True), link_bw: float = PHAZE_LINK_BW_BYTES_PER_S,
          evaluate=None, sync_model: str = "exposed", grad_reduce_dtype: str = "bf16"
          ) -> tuple[Placement, list[dict[str, Any]]]:
    """Best placement over microbatch, HBM size and recomputation. ``evaluate(layers_by_t, setup)``
    defaults to the DP over TMP widths (``best_placement``); ``sync_model`` charges the gradient sync
    (``grad_sync.py``: "exposed", or the paper's eq. 18)."""
    evaluate = evaluate or best_placement
    best: Placement | None = None
    rows = []
    relaxed: tuple | None = None  # the least demanding configuration tried: its reason stands if none fits
    for mbs, layers in layers_by_mbs.items():
        for hbm in hbm_gb:
            for rec in recompute:
                setup = TrainingSetup(num_devices, global_batch, mbs, hbm * 2**30, rec, link_bw, sync_model,
                                      grad_reduce_dtype)
                res = evaluate(layers, setup)
                rows.append({"microbatch": mbs, "hbm_gb": hbm, "recompute": rec, "feasible": res.feasible,
                             "throughput": res.throughput if res.feasible else 0.0,
                             "p": res.p, "d": res.d, "t": res.t})
                if best is None or (res.feasible and (not best.feasible or res.throughput > best.throughput)):
                    best = res
                key = (-mbs, hbm, rec)  # a smaller microbatch, more HBM, recomputation: less memory
                if not res.feasible and (relaxed is None or key > relaxed[0]):
                    relaxed = (key, res)
    if best is not None and not best.feasible and relaxed is not None:
        best = relaxed[1]
    if best is None:
        best = Placement(False, reason="no microbatch size divides the global batch")
    return best, rows


def expert_evaluator(p: int, d: int, t: int):
    """``evaluate(layers_by_t, setup)`` for ``sweep``: the expert strategy {p, d, t} exactly as the
    Phaze code evaluates it (``expert_placement``: an even split of the transformer blocks over p
    stages, no DP over the split); infeasible when no layer graph of TMP width t is given."""
    def evaluate(layers_by_t: dict[int, PlacementLayers], setup: TrainingSetup) -> Placement:
        if t not in layers_by_t:
            return Placement(False, t=t, reason=f"no layer graph for tmp width {t}")
        return expert_placement(layers_by_t[t], setup, p, d)

    return evaluate


def fixed_evaluator(p: int, d: int, t: int):
    """``evaluate`` for ``sweep``: fixed {p, d, t} with the stage split chosen by the DP."""
    def evaluate(layers_by_t: dict[int, PlacementLayers], setup: TrainingSetup) -> Placement:
        return best_placement(layers_by_t, setup, (p, d, t))

    return evaluate


def expert_sweep(layers_by_mbs: dict[int, dict[int, PlacementLayers]], pdt: tuple[int, int, int],
                 num_devices: int, global_batch: int, hbm_gb=(32, 64, 80), recompute=(False, True),
                 link_bw: float = PHAZE_LINK_BW_BYTES_PER_S, sync_model: str = "exposed",
                 grad_reduce_dtype: str = "bf16") -> tuple[Placement, list[dict[str, Any]]]:
    """The best expert placement {p, d, t} over microbatch, HBM and recomputation: what
    ``archplace place --expert``, the search's expert column and bench/phaze/phaze_tpuv4.py report."""
    p, d, t = pdt
    only_t = {m: {t: lys[t]} for m, lys in layers_by_mbs.items() if t in lys}
    if not only_t:
        return Placement(False, t=t, reason=f"no layer graph for tmp width {t}"), []
    return sweep(only_t, num_devices, global_batch, hbm_gb, recompute, link_bw, expert_evaluator(p, d, t),
                 sync_model, grad_reduce_dtype)


def model_throughput(model: str, acc: Accelerator, num_devices: int = 1024, global_batch: int = 4096,
                     microbatches=(1, 2, 4, 8), hbm_gb=(32, 64, 80), recompute=(False, True),
                     tmp_widths=None, optimizer: str = "adam", link_bw: float = PHAZE_LINK_BW_BYTES_PER_S,
                     sequential: bool = False, fixed: tuple[int, int, int] | None = None,
                     seq: int | None = None, sync_model: str = "exposed", grad_reduce_dtype: str = "bf16",
                     **solve_kw: Any) -> ThroughputResult:
    """Best training throughput (samples/s) of ``model`` on ``num_devices`` copies of ``acc``.

    ``fixed = (p, d, t)`` evaluates one strategy (the DP still chooses the stage split);
    ``sequential`` replaces the ILP with the all-ops-intra-parallel schedule (the paper's ablation
    baseline).
    """
    kind = "sequential" if sequential else "ilp"
    widths = (fixed[2],) if fixed is not None else tmp_widths
    layers, timing, stats = prepare_layers(model, acc, microbatches, widths, num_devices, global_batch,
                                           optimizer, link_bw, seq, (kind,), **solve_kw)
    t0 = time.perf_counter()
    evaluate = None if fixed is None else fixed_evaluator(*fixed)
    best, rows = sweep(layers[kind], num_devices, global_batch, hbm_gb, recompute, link_bw, evaluate,
                       sync_model, grad_reduce_dtype)
    timing["dp_s"] = time.perf_counter() - t0
    return ThroughputResult(model, acc, best, rows, timing, stats)
