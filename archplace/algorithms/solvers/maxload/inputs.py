"""Reading a ``dnn-partitioning`` graph: the device counts and memory limit from ``g.meta``, the node
and edge columns the objective needs, and a split given as an array or a mapping; each checked,
with a ``ValueError`` naming the field.

The evaluator and the solvers both start here, so they agree on what a valid input is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from archplace.workloads.graph import OpGraph

_NODE_COLUMNS = ("cpu_latency", "acc_latency", "supported_on_acc", "color_class", "mem_bytes")


_INF = math.inf


def _params(g: OpGraph) -> tuple[int, int, float]:
    """(k, cpus, memory limit) from ``g.meta``; raises ``ValueError`` naming the field."""
    if not isinstance(g, OpGraph):
        raise ValueError(f"expected an OpGraph, got {type(g).__name__}")
    out = []
    for key, kind in (("max_accs", int), ("max_cpus", int), ("max_bytes_per_acc", float)):
        if key not in g.meta:
            raise ValueError(f"graph meta: field {key!r} is missing (load the graph with "
                             "load_dnn_partitioning)")
        v = g.meta[key]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"graph meta: field {key!r} is {v!r}, expected a number")
        if kind is int and float(v) != int(v):
            raise ValueError(f"graph meta: field {key!r} is {v!r}, expected an integer")
        if not math.isfinite(float(v)) or v < 0:
            raise ValueError(f"graph meta: field {key!r} is {v!r}, must be a finite non-negative number")
        out.append(kind(v))
    return out[0], out[1], out[2]


def _columns(g: OpGraph) -> dict[str, np.ndarray]:
    """The node and edge columns the objective needs, checked; raises ``ValueError`` naming the field."""
    n = g.num_nodes
    cols: dict[str, np.ndarray] = {}
    for c in _NODE_COLUMNS:
        if c not in g.extra_nodes:
            raise ValueError(f"graph: node column {c!r} is missing "
                             "(load the graph with load_dnn_partitioning)")
        a = np.asarray(g.extra_nodes[c])
        if len(a) != n:
            raise ValueError(f"graph: node column {c!r} has {len(a)} rows, expected {n}")
        cols[c] = a
    if "cost" not in g.extra_edges:
        raise ValueError("graph: edge column 'cost' is missing (load the graph with load_dnn_partitioning)")
    cols["cost"] = np.asarray(g.extra_edges["cost"], dtype=np.float64)
    ids = g.nodes["id"]
    for c in ("cpu_latency", "acc_latency", "mem_bytes"):
        a = cols[c].astype(np.float64)
        bad = ~np.isfinite(a) | (a < 0)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(f"node {ids[r]}: field {c!r} is {a[r]}, must be a finite non-negative number")
        cols[c] = a
    cost = cols["cost"]
    bad = ~np.isfinite(cost) | (cost < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"edge {g.edges['src'][i]} -> {g.edges['dst'][i]}: field 'cost' is {cost[i]}, "
                         "must be a finite non-negative number")
    cols["supported_on_acc"] = cols["supported_on_acc"].astype(bool)
    cols["color_class"] = cols["color_class"].astype(np.int64)
    return cols


def _out_cost(g: OpGraph, cost: np.ndarray) -> np.ndarray:
    """Per node row: the cost of its out-edges (the first one; the loader checks they agree)."""
    src, _ = g.edge_pos
    out = np.zeros(g.num_nodes)
    first = np.ones(len(src), dtype=bool)
    if len(src):
        first[1:] = src[1:] != src[:-1]  # edges are sorted by source row
    out[src[first]] = cost[first]
    return out


def _device_array(g: OpGraph, device_of: Any) -> np.ndarray:
    n = g.num_nodes
    if isinstance(device_of, Mapping):
        pos = {int(i): r for r, i in enumerate(g.nodes["id"])}
        arr = np.full(n, -1, dtype=np.int64)
        for i, d in device_of.items():
            if int(i) not in pos:
                raise ValueError(f"device_of: node {i} is not in the graph")
            arr[pos[int(i)]] = int(d)
        missing = np.flatnonzero(arr < 0)
        if len(missing):
            raise ValueError(f"device_of: node {g.nodes['id'][missing[0]]} has no device")
        return arr
    arr = np.asarray(device_of)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"device_of: expected {n} devices (one per node row), got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"device_of: expected integer devices, got dtype {arr.dtype}")
    return arr.astype(np.int64)
