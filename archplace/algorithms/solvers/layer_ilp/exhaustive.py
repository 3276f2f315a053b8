"""The solver-free reference: the exact optimum of a tiny layer by enumeration.

It shares no code with the ILP backends beyond the problem and schedule records, so the tests can
cross-check CP-SAT and HiGHS against it.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .contention import SHARE_QUANTUM, demands
from .problem import KIND_FUSED, KIND_TC, KIND_VC, LayerProblem
from .schedule import LayerSchedule, _finish, _rank, _tails


def exhaustive_schedule(problem: LayerProblem, max_ops: int = 7) -> LayerSchedule:
    """Exact optimum by enumeration, without an LP/CP solver (reference for tiny instances).

    Modes: per op, intra-op (using every core, so nothing overlaps it) or one explicit core (TC
    core c / VC core c / fused pair c < min(num_tc, num_vc)). For a fixed mode vector the problem is
    an RCPSP with unary resources. The serial schedule-generation scheme (SSGS: take the ops in
    list order, start each at the earliest time that respects its predecessors and is free on its
    cores over its whole duration, gaps included) is exact over all lists: given any optimal
    schedule S, SSGS on the list sorted by S's start times (ties by topological rank) starts every
    op no later than in S (induction: an earlier-placed op i that shared a core with j ended before
    s_j in S and now ends no later, so s_j is still free for j), hence is optimal too. Iterating this
    strictly decreases Σ starts until a fixed point, an optimal schedule that SSGS reproduces from
    its own (start, rank)-sorted list. So the depth-first search below enumerates lists whose SSGS
    starts are non-decreasing in (start, rank), with every mode per op, and is exact. Two further
    reductions keep exactness: intra-op is tried only when ℓ̂ < ℓ (otherwise running it on a free
    core over a sub-interval is no worse), and among cores that nothing uses yet, interchangeable
    ones (empty pairs; empty unpaired cores of one type) are tried once (relabelling). Branches
    whose critical-path lower bound cannot beat the incumbent are cut.

    Shared bandwidth (``contention.py``): a single-core op also needs room for its integer demands
    over its whole duration. The argument above still holds: in SSGS on S's list, the earlier-placed
    ops now end no later, so the set of them running at any instant of j's interval in S is a subset
    of the set running there in S, and their load is no larger. Candidate starts are then the
    release and every placed op's end (where a load can drop), not only ends on j's cores.
    """
    t0 = time.perf_counter()
    n = problem.num_ops
    if n > max_ops:
        raise ValueError(f"exhaustive_schedule is for tiny instances: {n} ops > max_ops={max_ops}")
    if n == 0:
        return _finish(problem, np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64),
                       np.zeros(0, np.int64), "optimal", "exhaustive", t0)
    ntc, nvc, m = problem.num_tc, problem.num_vc, problem.num_pairs
    lat, lath, kind = problem.latency_s.tolist(), problem.intra_latency_s.tolist(), problem.kind.tolist()
    pred = problem.predecessors()
    topo = problem.topo_order().tolist()
    rank = _rank(problem).tolist()
    mind = [min(a, b) for a, b in zip(lat, lath)]
    tail = _tails(problem, np.asarray(mind)).tolist()
    busy: list[list[tuple[float, float]]] = [[] for _ in range(ntc + nvc)]
    dem = demands(problem).T.tolist()  # per op, its demand on each resource
    placed: list[tuple[float, float, list[int]]] = []  # single-core ops with a positive demand
    start = [0.0] * n
    end = [0.0] * n
    mode: list[tuple[bool, int]] = [(False, -1)] * n
    done = [False] * n
    best = [math.inf, None]

    def room(t: float, d: float, di: list[int]) -> bool:
        if d <= 0 or not any(di):
            return True
        over = [(a, b, dd) for a, b, dd in placed if a < t + d and t < b]
        for p in [t] + [a for a, _, _ in over if a > t]:
            for r, need in enumerate(di):
                if need + sum(dd[r] for a, b, dd in over if a <= p < b) > SHARE_QUANTUM:
                    return False
        return True

    def earliest(res: list[int], rel: float, d: float, di: list[int]) -> float:
        extra = [b for _, b, _ in placed if b > rel] if any(di) else []
        cands = sorted({rel, *(e for r in res for _, e in busy[r] if e > rel), *extra})
        for t in cands:
            if not room(t, d, di):
                continue
            ok = True
            for r in res:
                for a, b in busy[r]:
                    if a < t + d and t < b:
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                return t
        raise AssertionError("unreachable")

    def modes(i: int) -> list[tuple[bool, int, list[int]]]:
        out = []
        if lath[i] < lat[i]:
            out.append((True, -1, list(range(ntc + nvc))))
        seen: set[str] = set()

        def empty_pair(c: int) -> bool:
            return not busy[c] and not busy[ntc + c]

        if kind[i] == KIND_FUSED:
            for c in range(m):
                if empty_pair(c):
                    if "p" in seen:
                        continue
                    seen.add("p")
                out.append((False, c, [c, ntc + c]))
        elif kind[i] == KIND_TC:
            for c in range(ntc):
                if c < m and empty_pair(c) or c >= m and not busy[c]:
                    cls = "p" if c < m else "x"
                    if cls in seen:
                        continue
                    seen.add(cls)
                out.append((False, c, [c]))
        else:
            for c in range(nvc):
                if c < m and empty_pair(c) or c >= m and not busy[ntc + c]:
                    cls = "p" if c < m else "x"
                    if cls in seen:
                        continue
                    seen.add(cls)
                out.append((False, c, [ntc + c]))
        return out

    def lower_bound(cur: float, floor: float) -> float:
        head = [0.0] * n
        lb = cur
        for u in topo:
            if done[u]:
                continue
            h = floor  # the remaining ops start no earlier than the last start (list restriction)
            for p in pred[u]:
                h = max(h, end[p] if done[p] else head[p] + mind[p])
            head[u] = h
            lb = max(lb, h + tail[u])
        return lb

    def dfs(count: int, last: tuple[float, int], cur: float) -> None:
        if count == n:
            if cur < best[0]:
                best[0] = cur
                best[1] = (list(start), list(mode))
            return
        if lower_bound(cur, max(last[0], 0.0)) >= best[0]:
            return
        for i in range(n):
            if done[i] or not all(done[p] for p in pred[i]):
                continue
            rel = max((end[p] for p in pred[i]), default=0.0)
            for yi, c, res in modes(i):
                d = lath[i] if yi else lat[i]
                di = [0] * len(dem[i]) if yi else dem[i]
                t = earliest(res, rel, d, di)
                if (t, rank[i]) <= last:
                    continue
                start[i], end[i], mode[i], done[i] = t, t + d, (yi, c), True
                for r in res:
                    busy[r].append((t, t + d))
                loaded = d > 0 and any(di)
                if loaded:
                    placed.append((t, t + d, di))
                dfs(count + 1, (t, rank[i]), max(cur, t + d))
                if loaded:
                    placed.pop()
                for r in res:
                    busy[r].pop()
                done[i] = False

    dfs(0, (-1.0, -1), 0.0)
    s, md = best[1]
    intra = np.array([y for y, _ in md], dtype=bool)
    tc = np.array([c if not y and kind[i] != KIND_VC else -1 for i, (y, c) in enumerate(md)], np.int64)
    vc = np.array([c if not y and kind[i] != KIND_TC else -1 for i, (y, c) in enumerate(md)], np.int64)
    return _finish(problem, np.asarray(s), intra, tc, vc, "optimal", "exhaustive", t0)
