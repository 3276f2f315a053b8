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

from .problem import LayerProblem
from .schedule import LayerSchedule

_CACHE: collections.OrderedDict[str, LayerSchedule] = collections.OrderedDict()
CACHE_MAX_ENTRIES = 4096


def effective_time_limit_s(num_ops: int, time_limit_s: float, large_time_limit_s: float | None = None,
                           large_min_ops: int = 40) -> float:
    """The time limit one slice gets: ``large_time_limit_s`` for slices of at least ``large_min_ops``
    ops when it is given, else ``time_limit_s``. Large backward slices (Llama's 48 ops) are where a
    short limit leaves a gap of several percent; the small ones are proven optimal in well under a
    second, so a longer limit only for the large ones buys the gap back at little cost."""
    if large_time_limit_s is not None and not large_time_limit_s > 0:
        raise ValueError(f"large_time_limit_s must be > 0, got {large_time_limit_s}")
    if isinstance(large_min_ops, bool) or not isinstance(large_min_ops, int | np.integer) \
            or large_min_ops < 1:
        raise ValueError(f"large_min_ops must be an integer >= 1, got {large_min_ops!r}")
    if large_time_limit_s is not None and num_ops >= large_min_ops:
        return float(large_time_limit_s)
    return float(time_limit_s)


def schedule_cache_key(problem: LayerProblem, backend: str = "cpsat", time_limit_s: float = 30.0,
                       rel_gap: float = 0.0, lazy: bool = True, decompose: bool = True,
                       contention: bool = True, large_time_limit_s: float | None = None,
                       large_min_ops: int = 40) -> str:
    """Content hash of the op kinds, ℓ and ℓ̂ bytes, edges, core counts and solver settings (op
    names are ignored); the bandwidth shares when the problem has them (a problem without shares,
    the paper's model, keeps the key it always had). ``contention=False`` leaves the shares out:
    ``solve_layer`` then solves the problem without them, so the key is that problem's. The time
    limit in the key is the one this slice gets (``effective_time_limit_s``), so a small slice shares
    its entry whatever the large-slice rule."""
    time_limit_s = effective_time_limit_s(problem.num_ops, time_limit_s, large_time_limit_s, large_min_ops)
    h = hashlib.blake2b(digest_size=16)
    h.update(b"phaze-layer-ilp-v1")
    for a in (problem.kind.astype(np.int8), problem.latency_s.astype("<f8"),
              problem.intra_latency_s.astype("<f8"), problem.edge_src.astype("<i8"),
              problem.edge_dst.astype("<i8")):
        h.update(np.int64(a.size).tobytes())
        h.update(np.ascontiguousarray(a).tobytes())
    for tag, a in ((b"hbm_share", problem.hbm_share), (b"glb_share", problem.glb_share)):
        if a is not None and contention:
            h.update(tag)
            h.update(np.ascontiguousarray(a.astype("<f8")).tobytes())
    h.update(json.dumps([problem.num_tc, problem.num_vc, backend, float(time_limit_s), float(rel_gap),
                         bool(lazy), bool(decompose)]).encode())
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
