"""Schedules cached by a content hash of the instance and the solver settings: in memory (an LRU
of ``CACHE_MAX_ENTRIES``) and, when asked, as one JSON file per key in a directory.

Repeated transformer blocks, and the same architecture seen again by a search, then cost no solve.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .budget import DEFAULT_BUDGET
from .problem import LayerProblem
from .schedule import LayerSchedule

_CACHE: collections.OrderedDict[str, LayerSchedule] = collections.OrderedDict()
CACHE_MAX_ENTRIES = 4096


def effective_limit(num_ops: int, value: float, large_value: float | None = None, large_min_ops: int = 40,
                    large_name: str = "large_budget") -> float:
    """The limit one slice gets (a work budget or a wall-clock limit): ``large_value`` for slices of
    at least ``large_min_ops`` ops when it is given, else ``value``. Large backward slices (Llama's 48
    ops) are where a small budget leaves a gap of several percent; the small ones are proven optimal
    with a fraction of it, so a larger budget only for the large ones buys the gap back at little
    cost."""
    if large_value is not None and not large_value > 0:
        raise ValueError(f"{large_name} must be > 0, got {large_value}")
    if isinstance(large_min_ops, bool) or not isinstance(large_min_ops, int | np.integer) \
            or large_min_ops < 1:
        raise ValueError(f"large_min_ops must be an integer >= 1, got {large_min_ops!r}")
    if large_value is not None and num_ops >= large_min_ops:
        return float(large_value)
    return float(value)


def effective_time_limit_s(num_ops: int, time_limit_s: float, large_time_limit_s: float | None = None,
                           large_min_ops: int = 40) -> float:
    """``effective_limit`` for the wall-clock safety limit."""
    return effective_limit(num_ops, time_limit_s, large_time_limit_s, large_min_ops, "large_time_limit_s")


def schedule_cache_key(problem: LayerProblem, backend: str = "cpsat", budget: float = DEFAULT_BUDGET,
                       rel_gap: float = 0.0, lazy: bool = True, decompose: bool = True,
                       contention: bool = True, large_budget: float | None = None, large_min_ops: int = 40,
                       num_workers: int = 1, time_limit_s: float | None = None,
                       large_time_limit_s: float | None = None) -> str:
    """Content hash of the op kinds, ℓ and ℓ̂ bytes, edges, core counts and the settings that decide
    the answer (op names are ignored): the backend, the work budget this slice gets
    (``effective_limit``, so a small slice shares its entry whatever the large-slice rule), the gap
    target, ``lazy``, ``decompose`` and the CP-SAT workers; the bandwidth shares when the problem has
    them. ``contention=False`` leaves the shares out: ``solve_layer`` then solves the problem without
    them, so the key is that problem's. The wall-clock safety limits (``time_limit_s``,
    ``large_time_limit_s``) are not in the key: they do not change a reproducible answer, and one
    they cut short is not cached. Keys of the wall-clock era (``phaze-layer-ilp-v1``) never match."""
    budget = effective_limit(problem.num_ops, budget, large_budget, large_min_ops, "large_budget")
    h = hashlib.blake2b(digest_size=16)
    h.update(b"phaze-layer-ilp-v2")
    for a in (problem.kind.astype(np.int8), problem.latency_s.astype("<f8"),
              problem.intra_latency_s.astype("<f8"), problem.edge_src.astype("<i8"),
              problem.edge_dst.astype("<i8")):
        h.update(np.int64(a.size).tobytes())
        h.update(np.ascontiguousarray(a).tobytes())
    for tag, a in ((b"hbm_share", problem.hbm_share), (b"glb_share", problem.glb_share)):
        if a is not None and contention:
            h.update(tag)
            h.update(np.ascontiguousarray(a.astype("<f8")).tobytes())
    h.update(json.dumps([problem.num_tc, problem.num_vc, backend, {"budget_dtime": float(budget)},
                         float(rel_gap), bool(lazy), bool(decompose), int(num_workers)]).encode())
    return h.hexdigest()


def clear_schedule_cache() -> None:
    _CACHE.clear()


def _cache_get(key: str, cache_dir: str | Path | None) -> LayerSchedule | None:
    hit = _CACHE.get(key)
    if hit is None and cache_dir is not None:
        f = Path(cache_dir) / f"{key}.json"
        if f.is_file():
            try:
                hit = LayerSchedule.from_dict(json.loads(f.read_text()))
            except (ValueError, KeyError, TypeError):
                hit = None
            if hit is not None:
                _CACHE[key] = hit
    if hit is None:
        return None
    _CACHE.move_to_end(key)
    return hit.copy(from_cache=True)


def _cache_put(key: str, sched: LayerSchedule, cache_dir: str | Path | None) -> None:
    _CACHE[key] = sched.copy()
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_MAX_ENTRIES:
        _CACHE.popitem(last=False)
    if cache_dir is not None:
        d = Path(cache_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(sched.to_dict(), allow_nan=True))
        tmp.replace(d / f"{key}.json")
