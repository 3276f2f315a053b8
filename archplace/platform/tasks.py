"""The Ray tasks a search runs: model graphs, per-architecture estimates and layer plans, layer-slice
ILPs, the placement DP, and the whole no-ILP (``--schedule sequential``) evaluation.

Why plain tasks rather than pools of named actors (what the search used before):

* **Lifetimes.** A task, its retries and its result belong to the process that submitted it (the
  search's driver or one of its Tune trials). A driver that dies takes all of them with it; there
  is nothing detached or named that could outlive it, hold CPUs and stall the next search.
* **Restarts.** Ray re-executes a task whose worker process or node died (``max_retries``) and
  rebuilds a lost result from its lineage; no hand-written re-create-and-resend is needed. An
  exception raised by our own code is not retried here: it fails the trial, whose architectures
  the searcher retries (``tune_searchers``).
* **Sizing.** Tasks go wherever a CPU is free, so a node that joins (autoscaler) takes work at
  once and one that leaves hands its tasks back; no pool has to be resized.
* **Graphs once.** ``build_graph_task`` traces each (model, microbatch, TMP width) graph once per
  search; the driver owns the refs and every ``prepare_task`` / ``sequential_task`` gets the graph
  from the object store (numpy arrays: zero-copy on the same node) instead of re-tracing it.

Every task takes one CPU and is spread over the nodes: CP-SAT runs with one worker, the estimate and
the DP are single-threaded numpy, so one task per core keeps the machine busy without oversubscribing it.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.exceptions import GetTimeoutError

TASK_RETRIES = 3      # re-executions after a worker or node death (not after our own exceptions)
# An explicit strategy also keeps a trial's tasks out of the trial's own (tiny) placement group, which
# Tune would otherwise capture them into. SPREAD: successive tasks go to different nodes.
SPREAD = "SPREAD"


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def build_graph_task(model: str, seq: int | None, mbs: int, tmp: int, capture_blocks: int = 3):
    from ..workloads.models import build_graph

    return build_graph(model, seq=seq, mbs=mbs, tmp=tmp, capture_blocks=capture_blocks)


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def prepare_task(arch: dict[str, Any], cases: list[tuple[int, int]], optimizer: str, link_bw: float,
                 ilp_settings: dict[str, Any], *graphs: Any) -> dict[str, Any]:
    """For each (microbatch, TMP width) of one model: the DP input with sequential layer times and
    the layer plan (its unique ILP instances). ``graphs`` are in the order of ``cases``."""
    from ..algorithms.solvers.layer_ilp import plan_layer_schedules
    from ..algorithms.solvers.throughput import placement_layers
    from ..hardware.accelerator import Accelerator
    from ..simulators.estimate import estimate_graph

    acc = Accelerator.from_dict(arch)
    t0 = time.perf_counter()
    out: dict[str, Any] = {}
    for (mbs, t), g in zip(cases, graphs):
        est = estimate_graph(g, acc, link_bw=link_bw)
        base = placement_layers(g, est.single_s, est.all_s, sequential=True, optimizer=optimizer)
        # the bandwidth shares are attached unless ilp_settings says contention=False
        plan = plan_layer_schedules(g, est.single_s, est.all_s, acc.num_tc, acc.num_vc, est.hbm_share,
                                    est.glb_share, **ilp_settings)
        out[(mbs, t)] = (base, plan)
    return {"cases": out, "estimate_s": time.perf_counter() - t0}


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def solve_task(items: list[tuple[str, Any]], settings: dict[str, Any]) -> list[dict[str, Any]]:
    """Solve a few layer-slice ILPs (CP-SAT, one worker). A slice this worker process solved before
    (``solve_layer``'s in-process cache) comes back with ``solved`` False."""
    from ..algorithms.solvers.layer_ilp import solve_layer

    out = []
    for key, problem in items:
        s = solve_layer(problem, num_workers=1, **settings)
        gap = None if s.gap != s.gap else float(s.gap)   # NaN: no bound proven
        peaks = {f: None if getattr(s, f) != getattr(s, f) else float(getattr(s, f))
                 for f in ("peak_hbm_share", "peak_glb_share")}  # NaN: solved without shares
        out.append({"key": key, "makespan_s": float(s.makespan_s), "status": s.status, "gap": gap,
                    "stopped_by": s.stopped_by, "dtime": float(s.dtime), "solved": not s.from_cache,
                    "solve_time_s": float(s.solve_time_s), **peaks})
    return out


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def dp_task(layers_by_t: dict[int, Any], num_devices: int, global_batch: int, mbs: int,
            hbm_gb: tuple[float, ...], recompute: tuple[bool, ...], link_bw: float,
            expert_pdt: tuple[int, int, int] | None, sync_model: str = "exposed",
            grad_reduce_dtype: str = "bf16") -> dict[str, Any]:
    """The placement DP for one microbatch size over HBM sizes and recomputation, and the expert
    strategy's throughput when one is given."""
    from .evaluate import dp_for_microbatch

    out = dp_for_microbatch(layers_by_t, num_devices, global_batch, mbs, hbm_gb, recompute, link_bw,
                            expert_pdt, sync_model, grad_reduce_dtype)
    return {**out, "node_id": ray.get_runtime_context().get_node_id()}


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def sequential_task(archs: list[dict[str, Any]], settings_dict: dict[str, Any],
                    case_keys: list[tuple[str, int, int]], *graphs: Any) -> list[dict[str, Any]]:
    """The whole ``--schedule sequential`` evaluation of several architectures in one task (no ILP:
    every op intra-op parallel, Phaze's baseline): estimates, DP input and DP per model. Returns one
    ``{"rows": [...], "value": avg}`` per architecture, in order."""
    from .evaluate import evaluate_sequential
    from .settings import SearchSettings

    settings = SearchSettings.from_dict(settings_dict)
    by_case = dict(zip(case_keys, graphs))
    node = ray.get_runtime_context().get_node_id()
    outs = [evaluate_sequential(arch, settings, by_case) for arch in archs]
    for o in outs:
        for r in o["rows"]:
            r["task_nodes"] = node
    return outs


def get(refs: Any, what: str, timeout_s: float) -> Any:
    """``ray.get`` with a timeout; on timeout, a one-line error that names what was waited for and
    what the cluster has free (the usual cause: no node offers the CPU a task needs)."""
    try:
        return ray.get(refs, timeout=timeout_s)
    except GetTimeoutError:
        raise TimeoutError(f"{what} did not finish within {timeout_s:.0f} s; {resources_line()}") from None


def resources_line() -> str:
    total, free = ray.cluster_resources(), ray.available_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return (f"each task needs 1 CPU and the cluster has {free.get('CPU', 0.0):g} of "
            f"{total.get('CPU', 0.0):g} "
            f"CPUs free on {nodes} alive node(s)")


def wait_for_cpus(timeout_s: float, poll_s: float = 1.0) -> float:
    """Total CPUs of the cluster once it has at least one (an autoscaler may still be adding the
    first worker); a one-line error after ``timeout_s`` if it never does."""
    deadline = time.monotonic() + timeout_s
    while True:
        cpus = float(ray.cluster_resources().get("CPU", 0.0))
        if cpus >= 1:
            return cpus
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the Ray cluster offers {cpus:g} CPUs after {timeout_s:.0f} s; a search "
                               "needs "
                               "at least 1 (start a worker node, or let the autoscaler add one)")
        time.sleep(poll_s)
