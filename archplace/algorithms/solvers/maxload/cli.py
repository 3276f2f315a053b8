"""``archplace solve-dp FILE.json``: load, solve, and summarise as strict JSON (numpy scalars to
Python, non-finite floats to None).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .reference import REFERENCE_MAX_LOADS, _reference_key
from .solve import solve_max_load


def solve_dp_command(path: str, method: str = "auto", time_limit_s: float = 600.0) -> dict[str, Any]:
    """``archplace solve-dp FILE.json``: load, solve, and return a JSON-able summary."""
    from archplace.workloads.dnn_partitioning import load_dnn_partitioning

    fpath = Path(path)
    g = load_dnn_partitioning(fpath)
    res = solve_max_load(g, method=method, time_limit_s=time_limit_s)
    k = res.stats.get("k", 0)
    ids = g.nodes["id"]
    devices = []
    for d, load in enumerate(res.loads):
        rows = np.flatnonzero(res.device_of == d)
        devices.append({"device": d, "kind": "accelerator" if d < k else "cpu",
                        "index": d if d < k else d - k, "load": _num(load),
                        "nodes": sorted(int(i) for i in ids[rows])})
    out: dict[str, Any] = {
        "file": str(fpath),
        "nodes": int(g.num_nodes),
        "k": int(k),
        "cpus": int(res.stats.get("cpus", 0)),
        "max_load": _num(res.max_load),
        "status": res.status,
        "lower_bound": _num(res.lower_bound),
        "gap": _num(res.gap),
        "method": res.method,
        "solve_time_s": round(res.solve_time_s, 3),
        "devices": devices,
        "stats": _jsonable(res.stats),
    }
    ref_key = _reference_key(fpath)
    if ref_key is not None:
        ref = REFERENCE_MAX_LOADS[ref_key]
        out["reference"] = ref
        out["rel_diff"] = _num((res.max_load - ref) / ref) if math.isfinite(res.max_load) else None
    else:
        out["reference"] = None
        out["rel_diff"] = None
    return out


def _jsonable(x: Any) -> Any:
    """Strict JSON: numpy scalars to Python, non-finite floats to None, anything else to a string."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in x]
    x = _num(x)
    return x if x is None or isinstance(x, (bool, int, float, str)) else str(x)


def _num(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x
