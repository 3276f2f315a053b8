"""A layer schedule and what every method shares to build or judge one: ``LayerSchedule``, the
independent checker ``check_schedule``, and the helpers on fixed timings (topological rank, tails,
ASAP starts along an order, peak core usage, exact core colouring).

These sit below the heuristics, the enumeration and the ILP rounds alike, so none of those modules
needs another to make or verify a schedule.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ....workloads.graph import kahn_order
from .contention import SHARE_QUANTUM, demands, overloaded_sets, peak_loads, resource_names
from .problem import KIND_FUSED, KIND_NAMES, KIND_TC, KIND_VC, LayerProblem

STATUSES = ("optimal", "feasible", "fallback", "trivial")
_COLOUR_NODE_LIMIT = 200_000  # search nodes of the exact core colouring before it gives up


@dataclass
class LayerSchedule:
    """A schedule: per op its start, whether it runs intra-op parallel and its cores.

    ``tc_core``/``vc_core`` are -1 for intra-op ops and for ops not of that type (0-based; fused ops
    have equal indices). ``gap`` is the proven relative gap ``1 − bound/makespan`` (0 when optimal,
    NaN when no bound is known). ``lazy_rounds`` counts the rounds re-solved after z-constraints (or,
    for HiGHS with bandwidth shares, bandwidth cuts) were added back.
    ``peak_hbm_share``/``peak_glb_share``: the largest summed share of the shared HBM / GLB bandwidth
    over the single-core ops running at one instant (``contention.py``); NaN when the problem has
    no shares of that resource (``peak_shares`` computes it for any share arrays).
    ``stopped_by`` says which limit, if any, ended the solve (``budget.STOP_REASONS``) and ``dtime``
    how much of its work budget it spent; both are reproducible unless ``stopped_by`` is
    "wall_limit" or "solver_failed". ``solve_time_s`` is wall-clock time and is not.
    """

    makespan_s: float
    start_s: np.ndarray
    intra: np.ndarray
    tc_core: np.ndarray
    vc_core: np.ndarray
    status: str
    gap: float
    solver: str
    solve_time_s: float
    lazy_rounds: int = 0
    bound_s: float = float("nan")
    from_cache: bool = False
    peak_hbm_share: float = float("nan")
    peak_glb_share: float = float("nan")
    stopped_by: str = ""  # why the solve stopped (``budget.STOP_REASONS``); "" for a bare heuristic
    dtime: float = 0.0  # deterministic seconds the solve spent (its budget's unit; ``budget.py``)

    def durations(self, problem: LayerProblem) -> np.ndarray:
        return np.where(self.intra, problem.intra_latency_s, problem.latency_s)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                d[k] = v.tolist()
        d.pop("from_cache")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerSchedule:
        d = dict(d)
        d["start_s"] = np.asarray(d["start_s"], dtype=np.float64)
        d["intra"] = np.asarray(d["intra"], dtype=bool)
        d["tc_core"] = np.asarray(d["tc_core"], dtype=np.int64)
        d["vc_core"] = np.asarray(d["vc_core"], dtype=np.int64)
        d["gap"] = float("nan") if d.get("gap") is None else float(d["gap"])
        d["bound_s"] = float("nan") if d.get("bound_s") is None else float(d["bound_s"])
        for f in ("peak_hbm_share", "peak_glb_share"):
            d[f] = float("nan") if d.get(f) is None else float(d[f])
        return cls(**d)

    def copy(self, **changes: Any) -> LayerSchedule:
        out = dataclasses.replace(self, **changes)
        for f in ("start_s", "intra", "tc_core", "vc_core"):
            setattr(out, f, getattr(out, f).copy())
        return out


def _conflicts(start: np.ndarray, end: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """``C[i, j]``: i and j run at the same time (open-interval overlap; a zero-length op at t
    conflicts with ops running strictly across t). Diagonal False."""
    c = (start[:, None] < end[None, :] - tol) & (start[None, :] < end[:, None] - tol)
    np.fill_diagonal(c, False)
    return c


def peak_shares(problem: LayerProblem, schedule: LayerSchedule, hbm_share: np.ndarray | None = None,
                glb_share: np.ndarray | None = None) -> dict[str, float]:
    """Peak summed share per resource of the schedule's single-core ops running at one instant,
    with the given shares (default: the problem's; a resource without shares is left out). Lets one
    measure a schedule made without contention against the shares it ignored."""
    d = schedule.durations(problem)
    out = {}
    for name, given, own in (("hbm", hbm_share, problem.hbm_share), ("glb", glb_share, problem.glb_share)):
        sh = own if given is None else np.asarray(given, dtype=np.float64)
        if sh is not None:
            tol = 1e-9 * max(float((schedule.start_s + d).max(initial=0.0)), 1e-300)
            out[name] = peak_loads(schedule.start_s, d, schedule.intra, sh, tol)[0]
    return out


def _check_bandwidth(problem: LayerProblem, s: np.ndarray, d: np.ndarray, intra: np.ndarray,
                     tol: float) -> None:
    """Shared-bandwidth capacity on the integer demands every method uses (``contention.py``)."""
    dem = demands(problem)
    bad = overloaded_sets(s, d, intra, dem, tol)
    if bad:
        ops = bad[0]
        lab = problem._label
        res = [r for k, r in enumerate(resource_names(problem)) if dem[k, list(ops)].sum() > SHARE_QUANTUM]
        raise ValueError(f"ops {', '.join(lab(i) for i in ops)} run at the same time and draw "
                         f"more than the whole {'/'.join(res).upper()} bandwidth")


def check_schedule(problem: LayerProblem, schedule: LayerSchedule, rel_tol: float = 1e-9) -> None:
    """Raise ``ValueError`` on any violated constraint: precedence, exclusivity of intra-op ops,
    one op per core at a time, core index ranges, fused pairing, the reported makespan, and, when
    the problem has bandwidth shares, the shared HBM/GLB capacity (summed integer demands of the
    single-core ops running at one instant ≤ ``SHARE_QUANTUM``; the float shares then sum to at most
    1 plus the ceil rounding)."""
    n = problem.num_ops
    s = np.asarray(schedule.start_s, dtype=np.float64)
    intra = np.asarray(schedule.intra, dtype=bool)
    tc = np.asarray(schedule.tc_core, dtype=np.int64)
    vc = np.asarray(schedule.vc_core, dtype=np.int64)
    for f, a in (("start_s", s), ("intra", intra), ("tc_core", tc), ("vc_core", vc)):
        if a.shape != (n,):
            raise ValueError(f"schedule.{f} has shape {a.shape}, expected ({n},)")
    if n == 0:
        if abs(schedule.makespan_s) > 0:
            raise ValueError(f"empty problem but makespan {schedule.makespan_s}")
        return
    if not np.isfinite(s).all() or (s < 0).any():
        raise ValueError("start times must be finite and >= 0")
    d = schedule.durations(problem)
    e = s + d
    span = float(e.max())
    tol = rel_tol * max(span, problem.horizon_s(), 1e-300)
    lab = problem._label
    if abs(schedule.makespan_s - span) > tol:
        raise ValueError(f"makespan_s {schedule.makespan_s} != latest finish {span}")
    for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        if e[a] > s[b] + tol:
            raise ValueError(f"precedence {lab(a)} -> {lab(b)} violated: {lab(a)} ends at {e[a]}, "
                             f"{lab(b)} starts at {s[b]}")
    k = problem.kind
    uses_tc = (k == KIND_TC) | (k == KIND_FUSED)
    uses_vc = (k == KIND_VC) | (k == KIND_FUSED)
    for i in range(n):
        if intra[i]:
            if tc[i] != -1 or vc[i] != -1:
                raise ValueError(f"op {lab(i)} is intra-op parallel but has cores ({tc[i]}, {vc[i]})")
            continue
        if uses_tc[i] and not 0 <= tc[i] < problem.num_tc:
            raise ValueError(f"op {lab(i)}: tensor core {tc[i]} outside 0..{problem.num_tc - 1}")
        if uses_vc[i] and not 0 <= vc[i] < problem.num_vc:
            raise ValueError(f"op {lab(i)}: vector core {vc[i]} outside 0..{problem.num_vc - 1}")
        if not uses_tc[i] and tc[i] != -1:
            raise ValueError(f"op {lab(i)} is a {KIND_NAMES[k[i]]} op but has tensor core {tc[i]}")
        if not uses_vc[i] and vc[i] != -1:
            raise ValueError(f"op {lab(i)} is a {KIND_NAMES[k[i]]} op but has vector core {vc[i]}")
        if k[i] == KIND_FUSED and (tc[i] != vc[i] or tc[i] >= problem.num_pairs):
            raise ValueError(f"fused op {lab(i)} runs on tensor core {tc[i]} and vector core {vc[i]}; "
                             f"it needs a pair c = c < {problem.num_pairs}")
    c = _conflicts(s, e, tol)
    ii, jj = np.nonzero(np.triu(c))
    for i, j in zip(ii.tolist(), jj.tolist()):
        if intra[i] or intra[j]:
            w = i if intra[i] else j
            raise ValueError(f"op {lab(w)} is intra-op parallel but overlaps op {lab(j if w == i else i)}")
        if tc[i] >= 0 and tc[i] == tc[j]:
            raise ValueError(f"ops {lab(i)} and {lab(j)} overlap on tensor core {tc[i]}")
        if vc[i] >= 0 and vc[i] == vc[j]:
            raise ValueError(f"ops {lab(i)} and {lab(j)} overlap on vector core {vc[i]}")
    if problem.has_contention:
        _check_bandwidth(problem, s, d, intra, tol)


def _finish(problem: LayerProblem, start: np.ndarray, intra: np.ndarray, tc: np.ndarray,
            vc: np.ndarray, status: str, solver: str, t0: float, gap: float = 0.0,
            bound_s: float = float("nan"), lazy_rounds: int = 0) -> LayerSchedule:
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    span = float((start + dur).max()) if problem.num_ops else 0.0
    out = LayerSchedule(span, np.asarray(start, dtype=np.float64), np.asarray(intra, dtype=bool),
                        np.asarray(tc, dtype=np.int64), np.asarray(vc, dtype=np.int64), status, gap,
                        solver, time.perf_counter() - t0, lazy_rounds, bound_s)
    if problem.has_contention:
        peaks = peak_shares(problem, out)
        out.peak_hbm_share = peaks.get("hbm", float("nan"))
        out.peak_glb_share = peaks.get("glb", float("nan"))
    return out


def _min_dur(problem: LayerProblem) -> np.ndarray:
    return np.minimum(problem.latency_s, problem.intra_latency_s)


def _tails(problem: LayerProblem, dur: np.ndarray) -> np.ndarray:
    """Longest path from each op to a sink, own duration included."""
    n = problem.num_ops
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        succ[s].append(d)
    tail = np.zeros(n)
    for u in problem.topo_order()[::-1].tolist():
        tail[u] = dur[u] + max((tail[v] for v in succ[u]), default=0.0)
    return tail


def _rank(problem: LayerProblem) -> np.ndarray:
    r = np.empty(problem.num_ops, dtype=np.int64)
    r[problem.topo_order()] = np.arange(problem.num_ops)
    return r


def _asap(order_rel: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
    """Earliest starts along the DAG ``order_rel`` (bool n×n, i before j); None when cyclic. An op's
    start is the latest finish of its predecessors, the same in any topological order."""
    n = len(dur)
    src, dst = np.nonzero(order_rel)
    order, stuck = kahn_order(n, src, dst)
    if stuck >= 0:
        return None
    start = np.zeros(n)
    starts = np.searchsorted(src, np.arange(n + 1))  # np.nonzero lists the edges by source
    for u in order.tolist():
        succ = dst[starts[u]:starts[u + 1]]
        if succ.size:
            np.maximum.at(start, succ, start[u] + dur[u])
    return start


def _core_usage(problem: LayerProblem, start: np.ndarray, dur: np.ndarray,
                intra: np.ndarray) -> tuple[int, int]:
    """Peak tensor and vector cores in use (spec §4.5 counting)."""
    n = problem.num_ops
    if n == 0:
        return 0, 0
    k = problem.kind
    m = problem.num_pairs
    w_tc = np.where(intra, np.where(k == KIND_TC, problem.num_tc, np.where(k == KIND_FUSED, m, 0)),
                    np.where(k == KIND_VC, 0, 1))
    w_vc = np.where(intra, np.where(k == KIND_VC, problem.num_vc, np.where(k == KIND_FUSED, m, 0)),
                    np.where(k == KIND_TC, 0, 1))
    end = start + dur
    pos = dur > 0
    # positive-length ops active at the start point of op i: s_j <= s_i < e_j ...
    at_start = (start[None, :] <= start[:, None]) & (start[:, None] < end[None, :]) & pos[None, :]
    # ... and, for a zero-length op i, those strictly across its instant, plus i itself
    across = (start[None, :] < start[:, None]) & (start[:, None] < end[None, :]) & pos[None, :]
    act = np.where(pos[:, None], at_start, across)
    act[np.arange(n), np.arange(n)] = True
    return int((act * w_tc[None, :]).sum(axis=1).max()), int((act * w_vc[None, :]).sum(axis=1).max())


def _assign_cores(problem: LayerProblem, start: np.ndarray, dur: np.ndarray, intra: np.ndarray,
                  fixed_tc: np.ndarray | None = None, fixed_vc: np.ndarray | None = None,
                  node_limit: int = _COLOUR_NODE_LIMIT) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact (bounded) colouring of a fixed-time schedule with explicit cores: ops in start order,
    each tries every compatible core, interchangeable empty cores tried once. Assignments in
    ``fixed_*`` (>= 0) are kept. Returns (tc_core, vc_core) or None when none is found within
    ``node_limit`` search nodes."""
    n = problem.num_ops
    k = problem.kind
    ntc, nvc, m = problem.num_tc, problem.num_vc, problem.num_pairs
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    need_tc = ~intra & (k != KIND_VC)
    need_vc = ~intra & (k != KIND_TC)
    if fixed_tc is not None:
        tc[need_tc] = np.where(fixed_tc[need_tc] >= 0, fixed_tc[need_tc], -1)
    if fixed_vc is not None:
        vc[need_vc] = np.where(fixed_vc[need_vc] >= 0, fixed_vc[need_vc], -1)
    conf = _conflicts(start, start + dur)
    conf_list = [np.flatnonzero(conf[i]).tolist() for i in range(n)]
    todo = [i for i in np.lexsort((_rank(problem), start)).tolist()
            if (need_tc[i] and tc[i] < 0) or (need_vc[i] and vc[i] < 0)]
    tc_cnt = np.bincount(tc[tc >= 0], minlength=ntc).tolist()
    vc_cnt = np.bincount(vc[vc >= 0], minlength=nvc).tolist()
    tcl, vcl = tc.tolist(), vc.tolist()
    nodes = [0]

    def free_tc(i: int, c: int) -> bool:
        return all(tcl[j] != c for j in conf_list[i])

    def free_vc(i: int, c: int) -> bool:
        return all(vcl[j] != c for j in conf_list[i])

    def options(i: int) -> list[tuple[int, int]]:
        out = []
        seen_empty: set[str] = set()
        want_tc = need_tc[i] and tcl[i] < 0
        want_vc = need_vc[i] and vcl[i] < 0
        if k[i] == KIND_FUSED:
            cands = range(m)
            if not want_tc:
                cands = [tcl[i]] if tcl[i] < m else []
            elif not want_vc:
                cands = [vcl[i]] if vcl[i] < m else []
            for c in cands:
                if want_tc and want_vc and tc_cnt[c] == 0 and vc_cnt[c] == 0:
                    if "pair" in seen_empty:
                        continue
                    seen_empty.add("pair")
                if (not want_tc or free_tc(i, c)) and (not want_vc or free_vc(i, c)):
                    out.append((c if want_tc else -1, c if want_vc else -1))
            return out
        if want_tc:
            for c in range(ntc):
                empty = tc_cnt[c] == 0 and (c >= m or vc_cnt[c] == 0)
                cls = "pair" if c < m else "extra"
                if empty:
                    if cls in seen_empty:
                        continue
                    seen_empty.add(cls)
                if free_tc(i, c):
                    out.append((c, -1))
        else:
            for c in range(nvc):
                empty = vc_cnt[c] == 0 and (c >= m or tc_cnt[c] == 0)
                cls = "pair" if c < m else "extra"
                if empty:
                    if cls in seen_empty:
                        continue
                    seen_empty.add(cls)
                if free_vc(i, c):
                    out.append((-1, c))
        return out

    def dfs(pos: int) -> bool:
        if pos == len(todo):
            return True
        nodes[0] += 1
        if nodes[0] > node_limit:
            return False
        i = todo[pos]
        for a, b in options(i):
            if a >= 0:
                tcl[i] = a
                tc_cnt[a] += 1
            if b >= 0:
                vcl[i] = b
                vc_cnt[b] += 1
            if dfs(pos + 1):
                return True
            if a >= 0:
                tcl[i] = -1
                tc_cnt[a] -= 1
            if b >= 0:
                vcl[i] = -1
                vc_cnt[b] -= 1
        return False

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * n + 100))
    try:
        ok = dfs(0)
    finally:
        sys.setrecursionlimit(old)
    if not ok:
        return None
    return np.asarray(tcl, dtype=np.int64), np.asarray(vcl, dtype=np.int64)
