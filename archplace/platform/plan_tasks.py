"""``archplace plan --address``: the plan search split into Ray tasks, one per (tensor, pipeline) slice of
the space, merged into the same answer.

Why slices by (tp, pp): every configuration belongs to exactly one slice, each slice's own top K holds
every configuration of that slice that can be in the global top K, so the merged top K (ordered as
``plan_search.Candidate.order``, time then knobs) is the single-process answer to the bit. Only the
counts differ: a slice's time bound starts from its own K-th best, so it prunes less than one search
that has seen the others, and each slice times the layers it needs itself. Tasks are job-owned and
retried on a worker's death (``platform/tasks.py``'s rules); every ``ray.get`` has a timeout.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ray

from ..algorithms.search import plan_search as S
from .tasks import SPREAD, TASK_RETRIES

SLICE_TIMEOUT_S = 3600.0   # an outer safety limit: a slice is deterministic work, seconds not hours


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, scheduling_strategy=SPREAD)
def plan_slice_task(model: str, spec: Any, op_model: str, dtype: str, kwargs: dict) -> S.SearchResult:
    from ..simulators.plan_costs import model_layer_costs

    return S.search(costs=model_layer_costs(model, spec, op_model, dtype), **kwargs)


def search_in_tasks(model: str, spec: Any, op_model: str, *, shape, cluster: S.Cluster, space: S.Space,
                    dtype: str = "bf16", timeout_s: float = SLICE_TIMEOUT_S,
                    **kw) -> tuple[S.SearchResult, int]:
    """``plan_search.search`` over ``space``, one Ray task per (tp, pp); returns (the merged result, the
    number of tasks). Needs Ray started (``platform.search.connect``)."""
    if not ray.is_initialized():
        raise RuntimeError("plan --address runs on Ray, which is not started in this process")
    top_k = int(kw.get("top_k", 5))
    refs = [plan_slice_task.remote(model, spec, op_model, dtype,
                                   dict(shape=shape, cluster=cluster,
                                        space=replace(space, tp=(tp,), pp=(pp,)), **kw))
            for tp in space.tp for pp in space.pp]
    parts: list[S.SearchResult] = ray.get(refs, timeout=timeout_s)
    top = sorted((c for p in parts for c in p.top), key=S.Candidate.order)[:top_k]
    least = None
    if not top:
        cands = [p.least_memory for p in parts if p.least_memory is not None]
        least = min(cands, key=lambda c: (c.memory["total_bytes"], c.order())) if cands else None
    merged = S.SearchResult(
        top=top, evaluated=sum(p.evaluated for p in parts), splits_priced=sum(p.splits_priced for p in parts),
        pruned={k: sum(p.pruned[k] for p in parts) for k in ("memory", "time")},
        invalid=sum(p.invalid for p in parts), least_memory=least, captured=sum(p.captured for p in parts),
        model_params=parts[0].model_params)
    return merged, len(refs)
