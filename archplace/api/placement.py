"""Placement of a model's training on K copies of one accelerator (``archplace place``: layer-schedule
ILP + placement DP, Phaze) and the max-load split of a dnn-partitioning input (``solve-dp``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import (
    InvalidRequest,
    ProgressFn,
    Request,
    Result,
    Steps,
    check_bool,
    check_choice,
    check_int,
    check_model,
    check_positive_number,
    invalid,
    is_int,
    is_number,
)
from .graphs import load_accelerator

MICROBATCHES = (1, 2, 4, 8)    # model_throughput's defaults: the microbatch sizes a placement tries
RECOMPUTE = (False, True)
DP_METHODS = ("auto", "dp", "milp")


# ---------------------------------------------------------------------- place
@dataclass(frozen=True)
class PlaceRequest(Request):
    model: str                                   # preset name (archplace.workloads.models.PRESETS)
    arch: str | dict                             # preset ("tpuv4"), a .json file, or Accelerator fields
    accelerators: int = 1024
    global_batch: int = 4096
    hbm_gb: tuple[float, ...] = (32.0, 64.0, 80.0)   # HBM sizes tried
    sequential: bool = False                     # layer schedules without the ILP (Phaze's baseline)
    fixed: tuple[int, int, int] | None = None    # evaluate one strategy (p, d, t)
    seq: int | None = None                       # sequence length (None: the preset's)
    ilp_time_limit_s: float = 30.0               # per layer ILP (unused when sequential)

    def validate(self) -> None:
        check_model(self.model, files=False)
        load_accelerator(self.arch)
        check_int("accelerators", self.accelerators)
        check_int("global_batch", self.global_batch)
        if not (isinstance(self.hbm_gb, tuple) and self.hbm_gb
                and all(is_number(h) and h > 0 for h in self.hbm_gb)):
            raise invalid("hbm_gb", f"must be one or more positive sizes in GB, got {self.hbm_gb!r}")
        check_bool("sequential", self.sequential)
        if self.fixed is not None:
            f = self.fixed
            if not (isinstance(f, tuple) and len(f) == 3 and all(is_int(v) and v >= 1 for v in f)):
                raise invalid("fixed", f"must be p,d,t with three positive integers, got {f!r}")
            if f[0] * f[1] * f[2] > self.accelerators:
                raise InvalidRequest("{fixed} " + ",".join(map(str, f)) + f" needs {f[0] * f[1] * f[2]} "
                                     "accelerators, more than {accelerators} " + str(self.accelerators),
                                     "fixed", "accelerators")
        check_int("seq", self.seq, optional=True)
        check_positive_number("ilp_time_limit_s", self.ilp_time_limit_s)


@dataclass
class PlaceResult(Result):
    model: str
    arch: dict[str, Any]            # the Accelerator's fields
    throughput: float               # samples/s of the best placement (0 when infeasible)
    placement: dict[str, Any]       # feasible, time_per_batch_s, p, d, t, microbatch, recompute, hbm_gb,
    #                                 stages, and reason when infeasible
    timing_s: dict[str, float]      # graph_s, estimate_s, ilp_s, dp_s
    ilp: dict[str, Any]             # unique_solved, cache_hits
    configs: list[dict[str, Any]]   # the best placement per (microbatch, HBM, recomputation)
    area_mm2: float
    accelerators: int
    global_batch: int
    schedule: str                   # "ilp" or "sequential"

    @property
    def feasible(self) -> bool:
        return bool(self.placement["feasible"])

    @property
    def reason(self) -> str | None:
        """Why no placement fits (None when one does)."""
        return self.placement.get("reason")


def place(req: PlaceRequest, *, progress: ProgressFn | None = None,
          cancel: threading.Event | None = None) -> PlaceResult:
    """Best training placement (data, pipeline, tensor parallel) of a model on ``req.accelerators``
    copies of one accelerator. Stages: ``layers`` once per (microbatch, TMP width) case (graph,
    estimates and layer schedules), ``dp``, ``done``."""
    from ..algorithms.solvers.placement import best_placement
    from ..algorithms.solvers.throughput import ThroughputResult, prepare_layers, sweep
    from ..hardware.area import accelerator_area_mm2
    from ..hardware.constants import PHAZE_LINK_BW_BYTES_PER_S as LINK_BW
    from ..workloads.models import preset

    req.validate()
    steps = Steps("place", progress, cancel)
    acc = load_accelerator(req.arch)
    # model_throughput, one (microbatch, width) case at a time, so that progress and cancellation
    # reach between the layer-schedule solves
    kind = "sequential" if req.sequential else "ilp"
    solve_kw = {} if req.sequential else {"time_limit_s": req.ilp_time_limit_s}
    widths = (req.fixed[2],) if req.fixed is not None else tuple(preset(req.model).tmp_widths)
    common = (req.accelerators, req.global_batch, "sgd", LINK_BW, req.seq, (kind,))
    layers, timing, stats = prepare_layers(req.model, acc, (), widths, *common, **solve_kw)  # zero totals
    cases = [(m, t) for m in MICROBATCHES if req.global_batch % m == 0
             for t in widths if t <= req.accelerators]
    for i, (m, t) in enumerate(cases, 1):
        one, t_case, s_case = prepare_layers(req.model, acc, (m,), (t,), *common, **solve_kw)
        layers[kind].setdefault(m, {})[t] = one[kind][m][t]
        for k, v in t_case.items():
            timing[k] += v
        for k, v in s_case.items():
            stats[k] += v
        steps.stage("layers", microbatch=m, tmp=t, case=i, cases=len(cases))
    t0 = time.perf_counter()
    fixed = req.fixed
    evaluate = None if fixed is None else (lambda lys, setup: best_placement(lys, setup, fixed))
    best, rows = sweep(layers[kind], req.accelerators, req.global_batch, req.hbm_gb, RECOMPUTE, LINK_BW,
                       evaluate)
    timing["dp_s"] = time.perf_counter() - t0
    tp = ThroughputResult(req.model, acc, best, rows, timing, stats)
    steps.stage("dp", feasible=best.feasible, throughput=tp.throughput)
    res = PlaceResult(**tp.summary(), area_mm2=accelerator_area_mm2(acc), accelerators=req.accelerators,
                      global_batch=req.global_batch, schedule=kind)
    steps.done(feasible=res.feasible, throughput=res.throughput)
    return res


# ---------------------------------------------------------------------- solve-dp
@dataclass(frozen=True)
class SolveDpRequest(Request):
    file: str                     # a dnn-partitioning .json input
    method: str = "auto"          # auto, dp or milp
    time_limit_s: float = 600.0

    def validate(self) -> None:
        if not (isinstance(self.file, str) and self.file):
            raise invalid("file", f"must be the path of a dnn-partitioning .json file, got {self.file!r}")
        if not Path(self.file).exists():
            raise ValueError(f"input file {self.file!r} does not exist")
        check_choice("method", self.method, DP_METHODS)
        check_positive_number("time_limit_s", self.time_limit_s)


@dataclass
class SolveDpResult(Result):
    file: str
    nodes: int
    k: int                        # accelerators
    cpus: int
    max_load: float | None
    status: str                   # optimal, time_limit, ...
    lower_bound: float | None
    gap: float | None
    method: str
    solve_time_s: float
    devices: list[dict[str, Any]]  # per device: kind, index, load, nodes
    stats: dict[str, Any]
    reference: float | None       # the published optimum, for the known inputs
    rel_diff: float | None


def solve_dp(req: SolveDpRequest, *, progress: ProgressFn | None = None,
             cancel: threading.Event | None = None) -> SolveDpResult:
    """Optimal max-load split of a dnn-partitioning input. Stages: ``done`` (one solve)."""
    from ..algorithms.solvers.maxload import solve_dp_command

    req.validate()
    steps = Steps("solve_dp", progress, cancel)
    res = SolveDpResult(**solve_dp_command(req.file, req.method, req.time_limit_s))
    steps.done(status=res.status, max_load=res.max_load)
    return res
