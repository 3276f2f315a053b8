"""Placement of a model's training on K copies of one accelerator (``archplace place``: layer-schedule
ILP + placement DP, Phaze) and the max-load split of a dnn-partitioning input (``solve-dp``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..algorithms.solvers.grad_sync import SYNC_MODELS
from ..simulators.collectives import GRAD_REDUCE_DTYPES as _GRAD_DTYPE_BYTES
from ..workloads.layers import OPTIMIZERS
from ._common import (
    InvalidRequest,
    ProgressFn,
    Request,
    Result,
    Steps,
    check_bool,
    check_capture_blocks,
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
# layer_ilp.DEFAULT_BUDGET and DEFAULT_TIME_LIMIT_S (a test keeps them equal; not imported here, so that
# importing the API stays light)
PLACE_ILP_BUDGET = 10.0
PLACE_ILP_TIME_LIMIT_S = 300.0
RECOMPUTE = (False, True)
DESIGN_HBM_GB = (32, 64, 80)   # the HBM sizes a design without one is tried at (Phaze's HBM choices)
GRAD_REDUCE_DTYPES = tuple(_GRAD_DTYPE_BYTES)   # --grad-reduce-dtype (simulators/collectives.py)


def hbm_sizes(arch: str | dict, asked: tuple[float, ...] | None) -> tuple[tuple[float, ...], str]:
    """The HBM sizes (GiB) a placement on ``arch`` tries, and where they come from: ``asked`` (--hbm),
    else the accelerator's own (a named preset is the chip it names: tpuv4 has 32 GiB; a JSON or dict
    that gives ``hbm_gb``), else ``DESIGN_HBM_GB`` for a design that states none."""
    if asked is not None:
        return tuple(asked), "asked (--hbm)"
    if isinstance(arch, str) and not arch.endswith(".json"):
        acc = load_accelerator(arch)
        return (acc.hbm_gb,), f"the {arch} preset's own"
    fields = arch if isinstance(arch, dict) else _json_fields(arch)
    if isinstance(fields, dict) and fields.get("hbm_gb") is not None:
        return (fields["hbm_gb"],), "the architecture's own (its hbm_gb)"
    return DESIGN_HBM_GB, "swept: the architecture gives no hbm_gb"


def _json_fields(path: str) -> dict | None:
    import json

    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
DP_METHODS = ("auto", "dp", "milp")
TP_FROM = ("roles", "shard")


# ---------------------------------------------------------------------- place
@dataclass(frozen=True)
class PlaceRequest(Request):
    model: str                                   # preset name (archplace.workloads.models.PRESETS)
    arch: str | dict                             # preset ("tpuv4"), a .json file, or Accelerator fields
    accelerators: int = 1024
    global_batch: int = 4096
    # HBM sizes tried (GiB); None: the accelerator's own (a preset's, or the hbm_gb its JSON gives), or
    # DESIGN_HBM_GB for an architecture that states none (a design whose HBM is part of the search)
    hbm_gb: tuple[float, ...] | None = None
    sequential: bool = False                     # layer schedules without the ILP (Phaze's baseline)
    fixed: tuple[int, int, int] | None = None    # fixed (p, d, t); the DP still chooses the stage split
    expert: tuple[int, int, int] | None = None   # the paper's expert placement (p, d, t): an even block split
    seq: int | None = None                       # sequence length (None: the preset's)
    # the layer ILP (unused when sequential): the work budget per layer slice in deterministic seconds,
    # which decides the answer (the same on an idle and on a busy machine), and the wall-clock safety
    # limit per slice, which only stops a runaway solve (such slices are counted in ilp.load_dependent)
    ilp_budget: float = PLACE_ILP_BUDGET
    ilp_time_limit_s: float = PLACE_ILP_TIME_LIMIT_S
    # False: the paper's model (concurrently running ops each get the full HBM/GLB bandwidth)
    contention: bool = True
    optimizer: str = "adam"                      # sgd, adam, adafactor: optimizer state in the HBM fit
    sync_model: str = "exposed"                  # gradient sync: "exposed" (1F1B) or "paper" (eq. 18)
    grad_reduce_dtype: str = "bf16"              # the gradients' dtype: their memory and AllReduce bytes
    capture_blocks: int = 3                      # leading blocks captured per stack (more where kinds need)
    tp_from: str = "roles"                       # TP slices: "roles" (tp_roles.py) or "shard" (ILP sharding)

    def validate(self) -> None:
        check_model(self.model, files=False)
        check_choice("tp_from", self.tp_from, TP_FROM)
        if self.tp_from == "shard":
            from .tp_shard import check_shard_model

            check_shard_model(self.model)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("sync_model", self.sync_model, SYNC_MODELS)
        check_choice("grad_reduce_dtype", self.grad_reduce_dtype, GRAD_REDUCE_DTYPES)
        check_capture_blocks(self.model, self.capture_blocks)
        load_accelerator(self.arch)
        check_int("accelerators", self.accelerators)
        check_int("global_batch", self.global_batch)
        if self.hbm_gb is not None and not (isinstance(self.hbm_gb, tuple) and self.hbm_gb
                                            and all(is_number(h) and h > 0 for h in self.hbm_gb)):
            raise invalid("hbm_gb", f"must be one or more positive sizes in GB, got {self.hbm_gb!r}")
        check_bool("sequential", self.sequential)
        check_bool("contention", self.contention)
        if self.fixed is not None and self.expert is not None:
            raise InvalidRequest("{fixed} and {expert} exclude each other: give one strategy", "fixed",
                                 "expert")
        for name in ("fixed", "expert"):
            f = getattr(self, name)
            if f is None:
                continue
            if not (isinstance(f, tuple) and len(f) == 3 and all(is_int(v) and v >= 1 for v in f)):
                raise invalid(name, f"must be p,d,t with three positive integers, got {f!r}")
            if f[0] * f[1] * f[2] > self.accelerators:
                n = f[0] * f[1] * f[2]
                raise InvalidRequest("{" + name + "} " + ",".join(map(str, f)) + f" needs {n} "
                                     "accelerators, more than {accelerators} " + str(self.accelerators),
                                     name, "accelerators")
        check_int("seq", self.seq, optional=True)
        check_positive_number("ilp_time_limit_s", self.ilp_time_limit_s)
        check_positive_number("ilp_budget", self.ilp_budget)


@dataclass
class PlaceResult(Result):
    model: str
    arch: dict[str, Any]            # the Accelerator's fields
    throughput: float               # samples/s of the best placement (0 when infeasible)
    placement: dict[str, Any]       # feasible, time_per_batch_s, p, d, t, microbatch, recompute, hbm_gb,
    #                                 stages, and reason when infeasible
    timing_s: dict[str, float]      # graph_s, estimate_s, ilp_s, dp_s
    ilp: dict[str, Any]             # unique_solved, cache_hits, status_counts, worst_gap, gap_unknown,
    #                                 worst_slice, slices (per distinct layer slice: pass, layers, status,
    #                                 gap, solver, stopped_by, dtime, peak shares, microbatch, tmp),
    #                                 stopped_by (slices per stop reason), load_dependent (slices the
    #                                 wall clock stopped), budget, contention and the peak HBM/GLB
    #                                 shares; empty counts for sequential schedules
    configs: list[dict[str, Any]]   # the best placement per (microbatch, HBM, recomputation)
    area_mm2: float
    accelerators: int
    global_batch: int
    schedule: str                   # "ilp" or "sequential"
    strategy: str = "dp"            # "dp" (best p, d, t), "fixed" (given p, d, t; DP split) or "expert"
    optimizer: str = "adam"         # the optimizer whose state the HBM fit counts
    hbm: dict[str, Any] | None = None  # tried_gb (the HBM sizes tried) and their source
    # tp_from "shard" only (absent from to_dict otherwise): per TP width the role table derived from the
    # ILP sharding, where it differs from tp_roles.py, what it could not apply, and the role tables'
    # placement beside it (tp_shard.py)
    tp_source: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if d.get("tp_source") is None:
            d.pop("tp_source", None)
        return d

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
    copies of one accelerator. Stages: ``shard`` (``tp_from`` "shard" only: the ILP sharding per TP
    width), ``layers`` once per (microbatch, TMP width) case (graph, estimates and layer schedules),
    ``dp``, ``done``."""
    from ..algorithms.solvers.throughput import (
        ThroughputResult,
        expert_sweep,
        fixed_evaluator,
        prepare_layers,
        slice_summary,
        sweep,
    )
    from ..hardware.area import accelerator_area_mm2
    from ..hardware.constants import PHAZE_LINK_BW_BYTES_PER_S as LINK_BW
    from ..workloads.models import preset

    req.validate()
    steps = Steps("place", progress, cancel)
    acc = load_accelerator(req.arch)
    # model_throughput, one (microbatch, width) case at a time, so that progress and cancellation
    # reach between the layer-schedule solves
    kind = "sequential" if req.sequential else "ilp"
    solve_kw = {} if req.sequential else {"budget": req.ilp_budget, "time_limit_s": req.ilp_time_limit_s,
                                          "contention": req.contention}
    pdt = req.fixed or req.expert
    widths = (pdt[2],) if pdt is not None else tuple(preset(req.model).tmp_widths)
    common = (req.accelerators, req.global_batch, req.optimizer, LINK_BW, req.seq, (kind,),
              req.capture_blocks)
    tp_source, graph_fn = None, None
    if req.tp_from == "shard":
        from .tp_shard import shard_graph_fn

        smallest = min((m for m in MICROBATCHES if req.global_batch % m == 0), default=1)
        tp_source, graph_fn = shard_graph_fn(req.model, [t for t in widths if 1 < t <= req.accelerators],
                                             req.seq, smallest, req.capture_blocks)
        steps.stage("shard", widths=sorted(tp_source["widths"]))
    solve_kw["graph_fn"] = graph_fn
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
    hbm, hbm_source = hbm_sizes(req.arch, req.hbm_gb)
    if req.expert is not None:   # the same call as bench/phaze/phaze_tpuv4.py's expert column
        best, rows = expert_sweep(layers[kind], req.expert, req.accelerators, req.global_batch, hbm,
                                  RECOMPUTE, LINK_BW, req.sync_model, req.grad_reduce_dtype)
    else:
        evaluate = None if req.fixed is None else fixed_evaluator(*req.fixed)
        best, rows = sweep(layers[kind], req.accelerators, req.global_batch, hbm, RECOMPUTE, LINK_BW,
                           evaluate, req.sync_model, req.grad_reduce_dtype)
    if not cases:
        best.reason = (f"no microbatch size in {list(MICROBATCHES)} divides global batch {req.global_batch} "
                       f"with a TMP width in {list(widths)} <= {req.accelerators} accelerators")
    timing["dp_s"] = time.perf_counter() - t0
    stats.update(slice_summary(stats.get("slices", [])))
    if not req.sequential:
        stats["contention"] = req.contention
        stats["budget"] = {"dtime_per_slice": req.ilp_budget, "wall_limit_s_per_slice": req.ilp_time_limit_s}
    tp = ThroughputResult(req.model, acc, best, rows, timing, stats)
    steps.stage("dp", feasible=best.feasible, throughput=tp.throughput)
    strategy = "expert" if req.expert is not None else "fixed" if req.fixed is not None else "dp"
    if tp_source is not None:   # the role tables' placement beside it (an error is its reason)
        from dataclasses import replace

        try:
            roles = place(replace(req, tp_from="roles"))
            keep = ("p", "d", "t", "microbatch", "time_per_batch_s")
            tp_source["roles"] = {"throughput": roles.throughput, "feasible": roles.feasible,
                                  "placement": {k: roles.placement.get(k) for k in keep},
                                  "reason": roles.reason}
        except ValueError as e:
            tp_source["roles"] = {"throughput": 0.0, "feasible": False, "reason": str(e).splitlines()[0]}
    res = PlaceResult(**tp.summary(), area_mm2=accelerator_area_mm2(acc), accelerators=req.accelerators,
                      global_batch=req.global_batch, schedule=kind, strategy=strategy,
                      optimizer=req.optimizer, tp_source=tp_source,
                      hbm={"tried_gb": list(hbm), "source": hbm_source})
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
        from ..workloads.dnn_partitioning import bundled_graphs, resolve_graph_file

        if resolve_graph_file(self.file) is None:
            names = ", ".join(sorted(k for k in bundled_graphs() if "/" not in k))
            raise ValueError(f"input file {self.file!r} does not exist and is not a bundled graph ({names})")
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
    reason: str | None = None     # why there is no max-load (None when there is one)


def solve_dp(req: SolveDpRequest, *, progress: ProgressFn | None = None,
             cancel: threading.Event | None = None) -> SolveDpResult:
    """Optimal max-load split of a dnn-partitioning input. Stages: ``done`` (one solve)."""
    from ..algorithms.solvers.maxload import solve_dp_command

    req.validate()
    steps = Steps("solve_dp", progress, cancel)
    from ..workloads.dnn_partitioning import resolve_graph_file

    res = SolveDpResult(**solve_dp_command(str(resolve_graph_file(req.file)), req.method, req.time_limit_s))
    if res.max_load is None:
        found = (res.stats or {}).get("reason")   # the solver's own finding, e.g. "a node fits on no device"
        res.reason = (f"{found}; " if found else "") + {
            "infeasible": "no split meets the constraints: every node on one of the k accelerators or the "
                          "CPU, within maxSizePerFPGA per accelerator, colour classes together, unsupported "
                          "nodes on the CPU, each device's nodes contiguous",
            "unknown": f"the time limit ({req.time_limit_s:g} s) ran out before any split was found; "
                       "raise --time-limit"}.get(res.status, f"the solver ended with status {res.status!r} "
                                                          "and no split")
    steps.done(status=res.status, max_load=res.max_load)
    return res
