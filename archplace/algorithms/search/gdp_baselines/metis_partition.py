"""``metis``: the graph-partitioning baseline of GDP's Table 1 ("TensorFlow METIS placement", Karypis
& Kumar 1998; spec §7). The op graph, made undirected and with every co-location group contracted to
one vertex, is cut by ``pymetis.part_graph`` into ``num_devices`` parts with vertex weight = compute
time and edge weight = bytes (summed over parallel and opposite edges; both scaled to integers, see
:func:`_int_weights`), with pymetis's defaults (recursive bisection up to 8 parts, k-way above;
METIS's default balance tolerance) and ``seed`` as METIS's seed. It balances compute and cuts bytes
but knows nothing of memory, so it may run out of memory -- as it did on 9 of GDP's 12 graphs; the
simulator reports that.
"""

from __future__ import annotations

import numpy as np

from ....simulators.gpu_placement import PlacementProblem
from .units import _check, _spread_units, _units


def _int_weights(x: np.ndarray, cap: float = 1000.0, total_cap: float = 2.0**29) -> np.ndarray:
    """Positive integers proportional to ``x`` (rounded down): the largest becomes ``cap`` (less when
    the sum would pass ``total_cap``, well inside METIS's 32-bit sums); zeros and tiny values become 1."""
    x = np.asarray(x, np.float64)
    if x.size == 0 or x.max() <= 0:
        return np.ones(x.size, np.int64)
    scale = min(cap / x.max(), total_cap / x.sum())
    return np.maximum(1, np.floor(x * scale)).astype(np.int64)


def metis(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """METIS k-way partition of the undirected graph, co-location groups contracted (module doc)."""
    _check(problem)
    n, d = problem.num_nodes, problem.num_devices
    if n == 0:
        return np.zeros(0, np.int64)
    unit, members = _units(problem)
    nu = len(members)
    if d == 1 or nu == 1:
        return np.zeros(n, np.int64)
    import pymetis  # a dependency (pyproject.toml); imported here so the module loads without it

    vw = _int_weights(np.bincount(unit, weights=problem.compute_s, minlength=nu))
    a, b = unit[problem.src], unit[problem.dst]
    keep = a != b
    lo, hi = np.minimum(a, b)[keep], np.maximum(a, b)[keep]
    key, inv = np.unique(lo * nu + hi, return_inverse=True)
    ew = _int_weights(np.bincount(inv, weights=problem.edge_bytes[keep], minlength=len(key)))
    lo, hi = key // nu, key % nu
    s = np.concatenate([lo, hi])
    t = np.concatenate([hi, lo])
    w = np.concatenate([ew, ew])
    order = np.argsort(s, kind="stable")
    xadj = np.zeros(nu + 1, np.int64)
    np.add.at(xadj, s + 1, 1)
    xadj = np.cumsum(xadj)
    adj = pymetis.CSRAdjacency(xadj, t[order])
    opts = pymetis.Options(seed=int(seed))
    _, parts = pymetis.part_graph(d, adj, vweights=vw, eweights=w[order] if len(w) else None, options=opts)
    return _spread_units(unit, np.asarray(parts, np.int64))
