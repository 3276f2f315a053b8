"""One Tune trial = one architecture, evaluated for every model of the search.

Per model: the simulator pool turns the architecture into layer-slice ILP instances for every
(microbatch, TMP width); the solver pool (through the shared cache) gives their makespans; the
placement DP runs as one Ray task per microbatch over HBM sizes and recomputation. The trial
reports the across-model average throughput (the searchers' metric) and one result row per model.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import ray

from ..algorithms.solvers.placement import PlacementLayers
from ..hardware.constants import PHAZE_LINK_BW_BYTES_PER_S
from .pools import Pools, _stable_hash, call_with_restart, dp_sweep, solve_unique, where_am_i

METRIC = "throughput_avg"
FAULT_ENV = "ARCHPLACE_FAULT_INJECT"


@dataclass(frozen=True)
class SearchSettings:
    """Everything that defines a search's results (a resumed search must match it)."""

    models: tuple[str, ...]
    num_devices: int = 1024
    global_batch: int = 4096
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    hbm_gb: tuple[float, ...] = (32, 64, 80)
    recompute: tuple[bool, ...] = (False, True)
    seq: int | None = None
    optimizer: str = "sgd"
    link_bw_bytes_per_s: float = PHAZE_LINK_BW_BYTES_PER_S
    ilp_time_limit_s: float = 5.0
    space_path: str | None = None
    tmp_widths: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["models"] = list(self.models)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchSettings:
        d = dict(d)
        for k in ("models", "microbatches", "hbm_gb", "recompute"):
            d[k] = tuple(d[k])
        d["tmp_widths"] = {m: tuple(v) for m, v in (d.get("tmp_widths") or {}).items()}
        return cls(**d)

    def widths(self, model: str) -> tuple[int, ...]:
        from ..workloads.models import preset

        w = self.tmp_widths.get(model) or preset(model).tmp_widths
        return tuple(t for t in w if t <= self.num_devices)

    def cases(self, model: str) -> list[tuple[int, int]]:
        return [(m, t) for m in self.microbatches if self.global_batch % m == 0 for t in self.widths(model)]


def arch_key(acc) -> str:
    glb = int(acc.glb_mb) if float(acc.glb_mb).is_integer() else acc.glb_mb
    return f"{acc.num_tc}-{acc.num_vc}-{acc.pe_x}-{acc.pe_y}-{acc.pe_vc}-glb{glb}"


def _inject_fault(key: str, out_dir: str | None, spec: str = "") -> None:
    """Fault injection for tests and chaos runs: ``ARCHPLACE_FAULT_INJECT="fail:KEY"`` makes that
    architecture's evaluation always raise; ``"flaky:KEY:N"`` raises on its first N attempts
    (counted in ``OUT/.faults``). Several specs are separated by commas."""
    for item in filter(None, spec.split(",")):
        parts = item.split(":")
        if parts[0] == "fail" and parts[1] == key:
            raise RuntimeError(f"injected failure for architecture {key}")
        if parts[0] == "flaky" and parts[1] == key and out_dir:
            marker = Path(out_dir) / ".faults" / key
            marker.parent.mkdir(parents=True, exist_ok=True)
            n = int(marker.read_text()) if marker.exists() else 0
            marker.write_text(str(n + 1))
            if n < int(parts[2]):
                raise RuntimeError(f"injected transient failure {n + 1}/{parts[2]} for architecture {key}")


def evaluate_model(acc, model: str, settings: SearchSettings, pools: Pools) -> dict[str, Any]:
    """Best placement of ``model`` on ``acc`` through the actor pools; one result row."""
    from ..workloads.models import EXPERT_STRATEGIES

    t_start = time.perf_counter()
    ilp = {"time_limit_s": settings.ilp_time_limit_s}
    cases = settings.cases(model)
    if not cases:
        raise ValueError(f"no microbatch in {list(settings.microbatches)} divides the global batch "
                         f"{settings.global_batch}")
    # spread trials over the simulators (each keeps its own graphs), so one model's trials do not queue
    sim = _stable_hash(f"{model}|{arch_key(acc)}") % pools.num_simulators
    prep, sim_restarts = call_with_restart(pools, "simulator", sim, "prepare", model, acc.to_dict(),
                                           cases, settings.seq, settings.optimizer,
                                           settings.link_bw_bytes_per_s, ilp)
    problems: dict[str, Any] = {}
    for _, plan in prep["cases"].values():
        problems.update(plan.problems)
    t_ilp = time.perf_counter()
    sol = solve_unique(pools, problems, ilp)
    ilp_s = time.perf_counter() - t_ilp
    by_mbs: dict[int, dict[int, PlacementLayers]] = {}
    for (mbs, t), (base, plan) in prep["cases"].items():
        fw, bw = plan.assemble(sol["makespan_s"])
        by_mbs.setdefault(mbs, {})[t] = PlacementLayers(
            base.tmp, fw, bw, base.weight_bytes, base.optimizer_bytes, base.activation_bytes,
            base.tensor_parallel, base.edge_src, base.edge_dst, base.edge_bytes, base.names)
    expert = EXPERT_STRATEGIES.get(model)
    if expert is not None and math.prod(expert) > settings.num_devices:
        expert = None
    t_dp = time.perf_counter()
    dp = dp_sweep.options(scheduling_strategy="SPREAD")  # not inside the trial's placement group
    outs = ray.get([dp.remote(lys, settings.num_devices, settings.global_batch, mbs, settings.hbm_gb,
                              settings.recompute, settings.link_bw_bytes_per_s, expert)
                    for mbs, lys in by_mbs.items()])
    dp_wall = time.perf_counter() - t_dp
    best = None
    for o in outs:
        b = o["best"]
        if best is None or (b.feasible and (not best.feasible or b.throughput > best.throughput)):
            best = b
    exp_tp = float("nan")
    if expert is not None:
        feas = [o["expert"].throughput for o in outs if o["expert"] is not None and o["expert"].feasible]
        exp_tp = max(feas) if feas else 0.0
    lookups = sum(plan.lookups for _, plan in prep["cases"].values())
    row: dict[str, Any] = {
        "model": model, "status": "ok" if best.feasible else "infeasible",
        "error": "" if best.feasible else (best.reason or "no placement fits"),
        "throughput": float(best.throughput) if best.feasible else 0.0,
        "time_per_batch_s": float(best.time_per_batch_s) if best.feasible else float("nan"),
        "p": int(best.p or 0) if best.feasible else 0, "d": int(best.d or 0) if best.feasible else 0,
        "t": int(best.t or 0) if best.feasible else 0,
        "microbatch": int(best.microbatch or 0) if best.feasible else 0,
        "hbm_gb": float(best.hbm_bytes / 2**30) if best.feasible else float("nan"),
        "recompute": bool(best.recompute) if best.feasible else False,
        "num_stages": len(best.stages) if best.feasible else 0,
        "stages_json": json.dumps([{"first": s.first, "last": s.last, "devices": s.devices,
                                    "load_s": s.load_s} for s in best.stages]) if best.feasible else "[]",
        "expert_throughput": exp_tp, "expert_pdt": ",".join(map(str, expert)) if expert else "",
        "estimate_s": float(prep["estimate_s"] + prep["graph_s"]), "ilp_s": float(ilp_s),
        "dp_s": float(max(dp_wall, max(o["dp_s"] for o in outs))),
        "ilp_solved": int(sol["solved"]), "cache_hits": int(lookups - sol["solved"]),
        "actor_restarts": int(sol["restarts"] + sim_restarts),
    }
    row["total_s"] = time.perf_counter() - t_start
    return row


def arch_columns(acc) -> dict[str, Any]:
    """The result-store columns that describe an architecture."""
    from ..hardware.area import accelerator_area_mm2
    from ..hardware.presets import TPUV4

    key = arch_key(acc)
    return {"arch_key": key, "arch_label": acc.label(), "num_tc": acc.num_tc, "num_vc": acc.num_vc,
            "pe_x": acc.pe_x, "pe_y": acc.pe_y, "pe_vc": acc.pe_vc, "glb_mb": float(acc.glb_mb),
            "area_mm2": float(accelerator_area_mm2(acc)), "is_reference": key == arch_key(TPUV4)}


def evaluate_architecture(acc, settings: SearchSettings, pools: Pools, out_dir: str | None = None,
                          faults: str = "") -> tuple[float, list[dict[str, Any]]]:
    """(across-model average throughput, one row per model) for one architecture."""
    common = arch_columns(acc)
    _inject_fault(common["arch_key"], out_dir, faults)
    rows = []
    for model in settings.models:
        rows.append({**common, **evaluate_model(acc, model, settings, pools)})
    avg = float(np.mean([r["throughput"] for r in rows]))
    return avg, rows


def search_trainable(config: dict[str, Any], settings_dict: dict[str, Any], pools: Pools,
                     out_dir: str, faults: str = "") -> None:
    """The Tune function trainable (one report per trial). ``faults`` is the driver's
    ``ARCHPLACE_FAULT_INJECT`` (forwarded, since trial workers do not inherit its environment)."""
    from ray import tune

    from ..algorithms.search import nearest_index
    from ..hardware.space import enumerate_space

    settings = SearchSettings.from_dict(settings_dict)
    space = enumerate_space(settings.space_path)
    idx = nearest_index(space, config)
    acc = space.accelerator(idx)
    avg, rows = evaluate_architecture(acc, settings, pools, out_dir, faults)
    here = where_am_i()
    ctx = tune.get_context()
    for r in rows:
        r.update(here)
        r["trial_id"] = ctx.get_trial_id()
        r["space_index"] = idx
        r["finished_at"] = time.time()
    tune.report({METRIC: avg, "arch_key": rows[0]["arch_key"], "space_index": idx,
                 "rows_json": json.dumps(rows)})
