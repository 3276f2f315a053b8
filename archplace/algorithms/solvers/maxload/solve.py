"""``solve_max_load``: input checks, the choice between the DP and CP-SAT, the quick split that seeds
the DP's pruning or stands in when time runs out, and the re-evaluated ``MaxLoadResult``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from archplace.workloads.graph import OpGraph

from .contraction import _Problem
from .dp import _SMALL_LATTICE, _chain_split, _enumerate_ideals, _Lattice, _solve_dp, _TooManyIdeals
from .evaluate import evaluate_split
from .inputs import _INF
from .milp import _solve_milp

_METHODS = ("auto", "dp", "milp")


@dataclass
class MaxLoadResult:
    """A placement and its max-load.

    ``device_of[r]`` is the device of node row ``r``: accelerator ``0..k-1``, or ``k + j`` for CPU ``j``
    (``-1`` everywhere when infeasible). ``loads`` has one entry per device (``k`` accelerators, then the
    CPUs). ``max_load`` is the value recomputed by :func:`evaluate_split`; ``lower_bound`` is a proven
    lower bound on the optimum and ``gap = (max_load - lower_bound) / max_load``.
    """

    max_load: float
    device_of: np.ndarray
    loads: list[float]
    status: str  # "optimal" | "feasible" | "infeasible" ("unknown": out of time before any split)
    lower_bound: float
    gap: float
    method: str
    solve_time_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_accs(self) -> int:
        return int(self.stats.get("k", 0))

    def device_nodes(self, g: OpGraph) -> list[list[int]]:
        """Node ids per device (accelerators first, then CPUs)."""
        ids = g.nodes["id"]
        return [sorted(int(i) for i in ids[self.device_of == d]) for d in range(len(self.loads))]


def solve_max_load(g: OpGraph, method: str = "auto", time_limit_s: float = 600.0, *,
                   max_ideals: int = 250_000, threads: int = 2) -> MaxLoadResult:
    """Minimise the max-load of ``g`` (see the module docstring).

    ``method``:

    * ``"dp"`` -- the exact DP over ideals (a ``ValueError`` if there are more than ``max_ideals``).
      On more than a few thousand ideals it is pruned at a threshold: a quick split's value (the DP
      over the prefixes of one topological order) when that is close to the simple lower bound, else
      a threshold growing from the lower bound;
    * ``"milp"`` -- CP-SAT on the chain-of-ideals model (``threads`` workers): optimal up to the
      rounding bound of the scaled times (reported in ``gap``), or the best split and its bound at
      ``time_limit_s``;
    * ``"auto"`` -- the DP when the ideals number at most ``max_ideals``, else CP-SAT.

    The returned split is always re-evaluated by :func:`evaluate_split`. ``status`` is "optimal",
    "feasible" (time limit hit; ``lower_bound``/``gap`` say how far it may be) or "infeasible" (no split
    satisfies the constraints, e.g. nothing fits in memory; ``max_load`` is then ``inf``). In the rare
    case that the time limit passes before any split is found and none is proven impossible, the
    status is "unknown" (``max_load`` inf, ``device_of`` all -1).
    """
    if method not in _METHODS:
        raise ValueError(f"method: {method!r} is not one of {list(_METHODS)}")
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
        raise ValueError(f"time_limit_s: {time_limit_s!r}, expected a positive number of seconds")
    if isinstance(max_ideals, bool) or not isinstance(max_ideals, int) or max_ideals < 1:
        raise ValueError(f"max_ideals: {max_ideals!r}, expected a positive integer")
    t0 = time.monotonic()
    deadline = t0 + float(time_limit_s)
    p = _Problem(g)
    k, cpus = p.k, p.cpus
    nd = k + cpus
    stats: dict[str, Any] = {"k": k, "cpus": cpus, "nodes": p.n, "supernodes": p.F,
                             "merged_leaves": p.merged_leaves, "hyperedges": p.H}

    def done(dev: np.ndarray | None, lb: float, status: str, used: str) -> MaxLoadResult:
        elapsed = time.monotonic() - t0
        if dev is None:  # infeasible, or (status "unknown") out of time before any split was found
            infeasible = status == "infeasible"
            return MaxLoadResult(_INF, np.full(p.n, -1, dtype=np.int64), [_INF] * nd, status,
                                 _INF if infeasible else lb, 0.0 if infeasible else _INF, used, elapsed,
                                 stats)
        ev = evaluate_split(g, dev)
        if not ev.valid:  # pragma: no cover - the solvers only produce valid splits
            raise AssertionError(f"solver produced an invalid split: {ev.violations[:3]}")
        ml = ev.max_load
        if status == "optimal" and used == "dp":
            if abs(lb - ml) > 1e-9 * max(1.0, ml):  # pragma: no cover - DP and evaluator must agree
                raise AssertionError(f"DP value {lb} != evaluated {ml}")
            lb = ml
        lb = min(lb, ml)
        gap = 0.0 if ml <= 0 else max(0.0, (ml - lb) / ml)
        return MaxLoadResult(ml, dev, ev.loads, status, lb, gap, used, elapsed, stats)

    if p.n == 0:
        return done(np.zeros(0, dtype=np.int64), 0.0, "optimal", "trivial")
    lb = p.lower_bound()
    if not math.isfinite(lb) or nd == 0:
        stats["reason"] = "a node fits on no device"
        return done(None, _INF, "infeasible", method)

    lat = None
    if method in ("dp", "auto"):
        try:
            t1 = time.monotonic()
            lat = _Lattice(p, _enumerate_ideals(p, max_ideals))
            stats.update(ideals=lat.N, lattice_s=round(time.monotonic() - t1, 3))
        except _TooManyIdeals:
            if method == "dp":
                raise ValueError(f"method 'dp': the contracted graph has more than max_ideals = {max_ideals} "
                                 "ideals; use method='milp' or 'auto'") from None
            stats["ideals"] = f">{max_ideals}"

    if lat is None:  # MILP alone
        dev, mlb, optimal = _solve_milp(p, deadline, stats, threads)
        if dev is None:
            if optimal:
                return done(None, _INF, "infeasible", "milp")
            dev, _ = _chain_split(p, deadline + 60.0)  # time ran out before any split: a quick one
            if dev is None:
                return done(None, max(lb, mlb), "unknown", "milp")
        return done(dev, max(lb, mlb), "optimal" if optimal else "feasible", "milp")

    # the DP, pruned at first by a quick split's value (the DP over the topological order's prefixes)
    best, ub = None, _INF
    used = "dp"
    if lat.N > _SMALL_LATTICE:
        best, ub = _chain_split(p, deadline)
        stats["seed_max_load"] = ub
    dev, dlb, how = _solve_dp(p, lat, deadline, stats, lb, ub)
    if how == "optimal":
        return done(dev, dlb, "optimal", used)
    if how == "infeasible":
        return done(None, _INF, "infeasible", used)
    # out of time: the best split known, with the bound proven so far
    if best is None:
        best, _ = _chain_split(p, deadline + 60.0)
        if best is None:
            return done(None, max(lb, dlb), "unknown", used)
    return done(best, max(lb, dlb), "feasible", used)
