"""What every GDP placement baseline does first: check the problem (:func:`_check`) and group its ops
into placement units (:func:`_units`), a co-location group or an op alone, so that no group is ever
split."""

from __future__ import annotations

import numpy as np

from ....simulators.gpu_placement import PlacementProblem


def _check(problem: PlacementProblem) -> None:
    """Raise ``ValueError`` naming the field when ``problem`` cannot be placed."""
    if not isinstance(problem, PlacementProblem):
        raise ValueError(f"problem is a {type(problem).__name__}, expected a PlacementProblem")
    for f in ("memory_bytes", "link_bytes_per_s"):
        v = getattr(problem, f)
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{f} is {v!r}, must be finite and > 0")
    if not (np.isfinite(problem.link_latency_s) and problem.link_latency_s >= 0):
        raise ValueError(f"link_latency_s is {problem.link_latency_s!r}, must be finite and >= 0")
    for f in ("output_bytes", "resident_bytes", "edge_bytes"):
        a = getattr(problem, f)
        if len(a) and not (np.isfinite(a).all() and (a >= 0).all()):
            i = int(np.flatnonzero(~np.isfinite(a) | (a < 0))[0])
            raise ValueError(f"{f}[{i}] is {a[i]}, must be finite and >= 0")
    if problem.num_edges:
        bad = problem.priority[problem.src] >= problem.priority[problem.dst]
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"priority is not a topological rank: edge {i} ({problem.src[i]} -> "
                             f"{problem.dst[i]}) goes from priority {problem.priority[problem.src[i]]} to "
                             f"{problem.priority[problem.dst[i]]}")


def _units(problem: PlacementProblem) -> tuple[np.ndarray, list[list[int]]]:
    """Unit per op (a co-location group, or the op alone) and each unit's ops in topological order."""
    g = problem.coloc_group
    n = len(g)
    unit = np.empty(n, np.int64)
    grouped = g >= 0
    _, inv = np.unique(g[grouped], return_inverse=True)
    ng = int(inv.max()) + 1 if inv.size else 0
    unit[grouped] = inv
    unit[~grouped] = ng + np.arange(int((~grouped).sum()))
    order = np.lexsort((problem.priority, unit))
    bounds = np.flatnonzero(np.diff(unit[order])) + 1
    members = [m.tolist() for m in np.split(order, bounds)] if n else []
    return unit, members


def _spread_units(unit: np.ndarray, unit_device: np.ndarray) -> np.ndarray:
    return np.asarray(unit_device, np.int64)[unit]
