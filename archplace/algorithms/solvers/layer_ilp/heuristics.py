"""Schedules without a solver: Phaze's sequential baseline, a critical-path greedy list schedule,
and the repair of an over-subscribed lazy-round solution.

They give the ILP its first hint, the fallback when a time limit ends a solve without a solution,
and the yardstick ("sequential") that the ILP's makespans are reported against.

With bandwidth shares (``contention.py``) the list schedules start an op only where the running
single-core ops leave room for its demand; the sequential schedule needs nothing (no op overlaps).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from .contention import LoadProfile, demands
from .problem import KIND_TC, KIND_VC, LayerProblem
from .schedule import LayerSchedule, _finish, _min_dur, _rank, _tails


class _Timelines:
    """Busy intervals per core (TC c -> c, VC c -> num_tc + c) and the shared-bandwidth load of the
    single-core ops, for serial schedule generation."""

    def __init__(self, num_tc: int, num_vc: int, num_resources: int = 0) -> None:
        self.num_tc = num_tc
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(num_tc + num_vc)]
        self.load = LoadProfile(num_resources)

    def earliest(self, res: list[int], release: float, d: float, dem=()) -> float:
        """Earliest start >= ``release`` free on the cores ``res`` and with room for ``dem``; the
        load only drops at an op's end, so the candidates are the release and those ends."""
        ends = self.load.ends_after(release) if any(dem) else []
        cands = sorted({release, *(e for r in res for _, e in self.busy[r] if e > release), *ends})
        for t in cands:
            if all(not (a < t + d and t < b) for r in res for a, b in self.busy[r]) and \
                    self.load.fits(t, d, dem):
                return t
        raise AssertionError("unreachable: the latest end is always feasible")

    def add(self, res: list[int], s: float, e: float, dem=()) -> None:
        for r in res:
            self.busy[r].append((s, e))
        self.load.add(s, e, dem if len(dem) else (0,) * self.load.r)


def _mode_resources(problem: LayerProblem, i: int, intra: bool, c: int) -> list[int]:
    if intra:
        return list(range(problem.num_tc + problem.num_vc))
    k = problem.kind[i]
    if k == KIND_TC:
        return [c]
    if k == KIND_VC:
        return [problem.num_tc + c]
    return [c, problem.num_tc + c]


def sequential_schedule(problem: LayerProblem) -> LayerSchedule:
    """Phaze's "sequential scheduling" baseline (Appendix D): every operator intra-op parallel, one
    after another in topological order; makespan = Σ ℓ̂."""
    t0 = time.perf_counter()
    n = problem.num_ops
    start = np.zeros(n)
    order = problem.topo_order()
    d = problem.intra_latency_s[order]
    start[order] = np.concatenate(([0.0], np.cumsum(d)[:-1])) if n else d
    neg = np.full(n, -1, dtype=np.int64)
    return _finish(problem, start, np.ones(n, bool), neg, neg.copy(), "feasible", "sequential", t0,
                   gap=float("nan"))


def greedy_schedule(problem: LayerProblem) -> LayerSchedule:
    """Critical-path list scheduling: the ready op with the longest tail (min(ℓ, ℓ̂) durations)
    goes next, in the mode (intra-op, or a specific core / fused pair) that finishes it earliest,
    inserted into the earliest feasible gap. Ties prefer non-intra and low core indices."""
    tail = _tails(problem, _min_dur(problem))
    rank = _rank(problem)
    return _list_schedule(problem, lambda j: (-tail[j], rank[j]), None, "greedy")


def _list_schedule(problem: LayerProblem, priority: Any, modes: np.ndarray | None, name: str
                   ) -> LayerSchedule:
    """Serial schedule generation with explicit cores: the ready op with the smallest
    ``priority(op)`` goes next, at the earliest feasible time, in its given mode (``modes[i]``:
    intra-op or not) or, when ``modes`` is None, the mode and core that finish it earliest."""
    t0 = time.perf_counter()
    n = problem.num_ops
    pred = problem.predecessors()
    npred = np.array([len(p) for p in pred])
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        succ[s].append(d)
    dem = demands(problem)
    nodem = (0,) * dem.shape[0]
    tl = _Timelines(problem.num_tc, problem.num_vc, dem.shape[0])
    start = np.zeros(n)
    end = np.zeros(n)
    intra = np.zeros(n, bool)
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    ready = [i for i in range(n) if npred[i] == 0]
    left = npred.copy()
    k = problem.kind
    while ready:
        i = min(ready, key=priority)
        ready.remove(i)
        rel = max((end[p] for p in pred[i]), default=0.0)
        ncores = problem.num_tc if k[i] == KIND_TC else problem.num_vc if k[i] == KIND_VC \
            else problem.num_pairs
        best = None
        if modes is None or not modes[i]:
            for c in range(ncores):
                res = _mode_resources(problem, i, False, c)
                s = tl.earliest(res, rel, problem.latency_s[i], tuple(dem[:, i]))
                key = (s + problem.latency_s[i], 0, c)
                if best is None or key < best[0]:
                    best = (key, s, False, c, res)
        if modes is None or modes[i]:
            res = _mode_resources(problem, i, True, -1)
            s = tl.earliest(res, rel, problem.intra_latency_s[i])
            key = (s + problem.intra_latency_s[i], 1, 0)
            if best is None or key < best[0]:
                best = (key, s, True, -1, res)
        _, s, yi, c, res = best
        d = problem.intra_latency_s[i] if yi else problem.latency_s[i]
        start[i], end[i], intra[i] = s, s + d, yi
        if not yi:
            if k[i] != KIND_VC:
                tc[i] = c
            if k[i] != KIND_TC:
                vc[i] = c
        tl.add(res, s, s + d, nodem if yi else tuple(dem[:, i]))
        for v in succ[i]:
            left[v] -= 1
            if left[v] == 0:
                ready.append(v)
    return _finish(problem, start, intra, tc, vc, "feasible", name, t0, gap=float("nan"))


def _repair(problem: LayerProblem, start: np.ndarray, intra: np.ndarray) -> LayerSchedule:
    """A valid schedule close to an over-subscribed one (a lazy round's solution): list scheduling
    in its start order, once with its modes kept and once choosing modes greedily; the better."""
    rank = _rank(problem)
    prio = {i: (float(start[i]), int(rank[i])) for i in range(problem.num_ops)}
    a = _list_schedule(problem, prio.__getitem__, intra, "repaired lazy-round schedule")
    b = _list_schedule(problem, prio.__getitem__, None, "repaired lazy-round schedule")
    return a if a.makespan_s <= b.makespan_s else b


def _heuristic(problem: LayerProblem) -> LayerSchedule:
    g = greedy_schedule(problem)
    s = sequential_schedule(problem)
    return g if g.makespan_s <= s.makespan_s else s
