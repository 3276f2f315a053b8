"""Shared HBM and GLB bandwidth between operators that run at the same time (issue 19, item 4).

A ``LayerProblem`` may carry, per op, the fraction of the shared HBM and GLB bandwidth the op draws
while it runs on one core (``hbm_share`` / ``glb_share``; ``simulators.latency.bandwidth_shares``).
Each resource is a cumulative of capacity 1: at every instant the shares of the running single-core
ops sum to at most 1. Intra-op ops never overlap another op (constraint (9)), so their demand does
not matter; zero-length ops run at no instant and draw nothing.

Every method works on the same *integer* demands, ``ceil(share · SHARE_QUANTUM)`` against the
capacity ``SHARE_QUANTUM`` (CP-SAT needs integers; the heuristics, the enumeration, the HiGHS cuts
and the checker use the same numbers so that they agree exactly on which sets of ops fit). Rounding
up is conservative: a schedule that fits the integer demands has summed float shares at most
``1 + n · 1e-10``.

This module holds the demands and the peak-load computations on fixed timings that every method and
the checker share.
"""

from __future__ import annotations

import numpy as np

SHARE_QUANTUM = 10_000  # integer capacity of each shared resource
RESOURCES = ("hbm", "glb")


def demands(problem) -> np.ndarray:
    """Integer demands, shape (R, n) for the resources the problem has shares of (R may be 0):
    ``ceil(share · Q)`` (the ``1e-6`` keeps 0.3·Q from rounding up to 3001), 0 for zero-length ops."""
    rows = [s for s in (problem.hbm_share, problem.glb_share) if s is not None]
    if not rows:
        return np.zeros((0, problem.num_ops), dtype=np.int64)
    d = np.ceil(np.asarray(rows) * SHARE_QUANTUM - 1e-6).clip(0, SHARE_QUANTUM).astype(np.int64)
    d[:, problem.latency_s <= 0] = 0
    return d


def resource_names(problem) -> list[str]:
    return [r for r, s in zip(RESOURCES, (problem.hbm_share, problem.glb_share)) if s is not None]


def _active(start: np.ndarray, end: np.ndarray, on: np.ndarray, tol: float) -> np.ndarray:
    """``A[i, j]``: op j (positive length, ``on``) runs at op i's start ``s_j <= s_i < e_j``; rows of
    ops that are off or zero-length are empty. By the Helly property of intervals every set of ops
    running at one instant is the set running at the latest start among them, so the rows cover all
    instants that matter."""
    pos = on & (end - start > tol)
    a = (start[None, :] <= start[:, None] + tol) & (start[:, None] < end[None, :] - tol) & pos[None, :]
    a &= pos[:, None]
    return a


def peak_loads(start: np.ndarray, dur: np.ndarray, intra: np.ndarray, share: np.ndarray,
               tol: float = 0.0) -> tuple[float, int]:
    """(peak summed share, the op at whose start it occurs or -1) of single-core ops on fixed
    timings."""
    n = len(start)
    if n == 0:
        return 0.0, -1
    act = _active(start, start + dur, ~np.asarray(intra, bool), tol)
    load = act.astype(np.float64) @ np.asarray(share, dtype=np.float64)
    i = int(load.argmax())
    return float(load[i]), (i if load[i] > 0 else -1)


def overloaded_sets(start: np.ndarray, dur: np.ndarray, intra: np.ndarray, dem: np.ndarray,
                    tol: float = 0.0) -> list[tuple[int, ...]]:
    """The distinct sets of single-core ops that run at one instant and whose integer demand
    exceeds ``SHARE_QUANTUM`` on some resource (``dem``: (R, n)); each sorted."""
    if dem.shape[0] == 0 or len(start) == 0:
        return []
    act = _active(start, start + dur, ~np.asarray(intra, bool), tol)
    load = act.astype(np.int64) @ dem.T  # (n, R)
    out = {tuple(np.flatnonzero(act[i]).tolist()) for i in np.flatnonzero((load > SHARE_QUANTUM).any(axis=1))}
    return sorted(out)


class LoadProfile:
    """Placed single-core intervals with their demands, for serial schedule generation: where may an
    op of demand ``d`` run for ``dur`` from ``t`` without over-subscribing a resource."""

    def __init__(self, num_resources: int) -> None:
        self.r = num_resources
        self.items: list[tuple[float, float, tuple[int, ...]]] = []

    def add(self, s: float, e: float, d: np.ndarray | tuple[int, ...]) -> None:
        if self.r:  # always appended (zero demands too), so that ``pop`` undoes exactly one ``add``
            self.items.append((s, e, tuple(int(v) for v in d)))

    def pop(self) -> None:
        if self.r:
            self.items.pop()

    def ends_after(self, t: float) -> list[float]:
        return [e for _, e, _ in self.items if e > t]

    def fits(self, t: float, dur: float, d) -> bool:
        if not self.r or dur <= 0 or not any(d):
            return True
        over = [(s, e, dd) for s, e, dd in self.items if s < t + dur and t < e and any(dd)]
        if not over:
            return True
        for p in [t] + [s for s, _, _ in over if s > t]:  # the load changes only at starts
            for r in range(self.r):
                if d[r] + sum(dd[r] for s, e, dd in over if s <= p < e) > SHARE_QUANTUM:
                    return False
        return True
