"""``solve_layer``: validation, the cache, the closed forms, the series decomposition and the
two-phase work budget (``budget.py``) around the lazy rounds; a valid schedule is returned whatever
happens.

This is the only module that decides *what* to run; the backends, the lazy rounds and the
heuristics each live in their own module and are called from here.
"""

from __future__ import annotations

import math
import time
import warnings
from pathlib import Path

import numpy as np

from .budget import (
    DEFAULT_BUDGET,
    DEFAULT_TIME_LIMIT_S,
    LOAD_DEPENDENT,
    Allowance,
    check_budget,
    worst_stop,
)
from .cache import _cache_get, _cache_put, effective_limit, schedule_cache_key
from .cpsat import _warm_start
from .heuristics import _heuristic
from .lazy import _lazy_solve, _LazyState
from .problem import KIND_TC, KIND_VC, LayerProblem
from .schedule import LayerSchedule, _assign_cores, _finish, _rank, check_schedule
from .workers import _call_isolated, _cpsat_in_process

BACKENDS = ("cpsat", "milp")
# CP-SAT on WARM_START_MIN_OPS+ ops: a first attempt of QUICK_ATTEMPT_DTIME deterministic seconds,
# then the interval warm start (WARM_START_SHARE of the budget left, at most WARM_START_MAX_DTIME)
# and the rest of the lazy rounds
QUICK_ATTEMPT_DTIME = 0.5
WARM_START_MIN_OPS = 8
WARM_START_SHARE = 0.2
WARM_START_MAX_DTIME = 2.0


def _run_warm_start(problem: LayerProblem, allow: Allowance, num_workers: int) -> LayerSchedule | None:
    """The compact model's schedule with cores assigned, when it is valid; else None. Charges the
    deterministic time it spent to ``allow``."""
    t0 = time.perf_counter()
    work, wall = allow.work_left(), allow.wall_left()
    if _cpsat_in_process():
        got, dtime = _warm_start(problem, work, wall, num_workers)
    else:
        out = _call_isolated("cpsat", "cpsat._warm_start", problem, work, wall, num_workers,
                             timeout_s=wall + 120.0)
        got, dtime = out if out is not None else (None, 0.0)
    allow.spend(dtime)
    if got is None:
        return None
    start, intra = got
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    cores = _assign_cores(problem, start, dur, intra)
    if cores is None:
        return None
    out = _finish(problem, start, intra, cores[0], cores[1], "feasible", "cp-sat interval warm start", t0,
                  gap=float("nan"))
    try:
        check_schedule(problem, out, rel_tol=1e-7)
    except ValueError:
        return None
    return out


def solve_layer(problem: LayerProblem, backend: str = "cpsat", time_limit_s: float = DEFAULT_TIME_LIMIT_S,
                rel_gap: float = 0.0, lazy: bool = True, *, budget: float = DEFAULT_BUDGET,
                decompose: bool = True, num_workers: int | None = None, cache: bool = True,
                cache_dir: str | Path | None = None, contention: bool = True,
                large_time_limit_s: float | None = None, large_min_ops: int = 40,
                large_budget: float | None = None) -> LayerSchedule:
    """Optimal (or budget-limited best) schedule of one layer by Phaze's ILP.

    ``backend``: "cpsat" (OR-Tools CP-SAT, integer-scaled times) or "milp" (PuLP + HiGHS).
    ``budget`` bounds the work of the whole call (all segments, phases and lazy rounds) in
    deterministic seconds (``budget.py``): the answer does not depend on the machine's load.
    ``time_limit_s`` is the wall-clock safety limit of the whole call; a slice it stops says so
    (``stopped_by == "wall_limit"``). ``rel_gap`` is the solver's relative gap target (0 = prove
    optimality). ``lazy`` applies Appendix A (z-variables only when needed). ``decompose`` solves the
    series segments of the DAG separately (exact; see ``_solve_layer``). ``num_workers``: CP-SAT
    search workers (default 1; more run CP-SAT's interleaved search, deterministic for a fixed
    number of workers). ``contention``: respect the problem's shared-bandwidth shares
    (``contention.py``) when it has them; False solves the paper's model (concurrent ops each get
    the full HBM/GLB bandwidth). ``large_budget`` / ``large_time_limit_s`` replace ``budget`` /
    ``time_limit_s`` for slices of at least ``large_min_ops`` ops (``effective_limit``).
    Results are cached in memory (and under ``cache_dir`` when given) by ``schedule_cache_key``,
    except those the wall clock or a solver failure stopped (their answer is not reproducible).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} unknown; allowed: {list(BACKENDS)}")
    if not (time_limit_s > 0):
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    if not (rel_gap >= 0):
        raise ValueError(f"rel_gap must be >= 0, got {rel_gap}")
    check_budget("budget", budget)
    time_limit_s = effective_limit(problem.num_ops, time_limit_s, large_time_limit_s, large_min_ops,
                                   "large_time_limit_s")
    budget = effective_limit(problem.num_ops, budget, large_budget, large_min_ops, "large_budget")
    workers = num_workers or _default_workers()
    if isinstance(workers, bool) or not isinstance(workers, int | np.integer) or workers < 1:
        raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
    if not contention:
        problem = problem.without_contention()
    key = schedule_cache_key(problem, backend=backend, budget=budget, rel_gap=rel_gap, lazy=lazy,
                             decompose=decompose, num_workers=workers) if cache else None
    if key is not None:
        hit = _cache_get(key, cache_dir)
        if hit is not None:
            return hit
    out = _solve_layer(problem, backend, Allowance(budget, float(time_limit_s)), float(rel_gap), lazy,
                       int(workers), decompose)
    if key is not None and out.stopped_by not in LOAD_DEPENDENT:
        _cache_put(key, out, cache_dir)
    return out


def _default_workers() -> int:
    return 1


def _trivial(problem: LayerProblem, t0: float) -> LayerSchedule | None:
    """Closed form when the DAG is a total order (or empty, or all latencies are zero)."""
    n = problem.num_ops
    if n == 0:
        z = np.zeros(0, np.int64)
        out = _finish(problem, np.zeros(0), np.zeros(0, bool), z, z.copy(), "trivial", "closed-form", t0)
        out.stopped_by = "closed_form"
        return out
    r = problem.reach()
    total_order = bool((r | r.T | np.eye(n, dtype=bool)).all())
    if not total_order and problem.horizon_s() > 0:
        return None
    if total_order:
        intra = problem.intra_latency_s < problem.latency_s
        dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
        order = problem.topo_order()
        start = np.zeros(n)
        start[order] = np.concatenate(([0.0], np.cumsum(dur[order])[:-1]))
    else:  # H = 0: all ℓ or all ℓ̂ are zero; every op at time 0 in its zero-length mode
        intra = problem.intra_latency_s < problem.latency_s
        start = np.zeros(n)
    k = problem.kind
    tc = np.where(~intra & (k != KIND_VC), 0, -1)
    vc = np.where(~intra & (k != KIND_TC), 0, -1)
    out = _finish(problem, start, intra, tc, vc, "trivial", "closed-form", t0)
    out.bound_s = out.makespan_s
    out.stopped_by = "closed_form"
    return out


def _series_segments(problem: LayerProblem) -> list[np.ndarray]:
    """Split the ops into series segments: prefixes A of the topological order with every op of A
    preceding every op after it (``a ≺ b``). Such an A is a prefix of every topological order, so
    checking the prefixes of one order finds all of them."""
    n = problem.num_ops
    order = problem.topo_order()
    if n < 2:
        return [order]
    m = problem.reach()[np.ix_(order, order)]
    row_suffix_all = np.flip(np.logical_and.accumulate(np.flip(m, axis=1), axis=1), axis=1)
    col_prefix_all = np.logical_and.accumulate(row_suffix_all, axis=0)
    cuts = [k for k in range(1, n) if col_prefix_all[k - 1, k]]
    bounds = [0, *cuts, n]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _subproblem(problem: LayerProblem, idx: np.ndarray) -> LayerProblem:
    local = np.full(problem.num_ops, -1, dtype=np.int64)
    local[idx] = np.arange(len(idx))
    inside = (local[problem.edge_src] >= 0) & (local[problem.edge_dst] >= 0)
    names = tuple(problem.names[i] for i in idx) if problem.names is not None else None
    return LayerProblem(problem.kind[idx], problem.latency_s[idx], problem.intra_latency_s[idx],
                        local[problem.edge_src[inside]], local[problem.edge_dst[inside]], problem.num_tc,
                        problem.num_vc, names,
                        None if problem.hbm_share is None else problem.hbm_share[idx],
                        None if problem.glb_share is None else problem.glb_share[idx])


def _solve_layer(problem: LayerProblem, backend: str, allow: Allowance, rel_gap: float, lazy: bool,
                 num_workers: int, decompose: bool = True) -> LayerSchedule:
    """Series decomposition (exact): when every op of a prefix A precedes every other op, nothing
    of A can overlap anything after it (they are ordered by (5)/(7)), so the optimum is the sum of
    the optima of the segments, each solved by the full formulation, and the schedule is their
    concatenation. A segment's bound adds up the same way. The segments share the work budget by
    weight (n² of each), in deterministic seconds; the wall deadline is the slice's."""
    t0 = time.perf_counter()
    triv = _trivial(problem, t0)
    if triv is not None:
        return triv
    segs = _series_segments(problem) if decompose else [problem.topo_order()]
    if len(segs) == 1:
        return _solve_connected(problem, backend, allow, rel_gap, lazy, num_workers)
    weight = [float(len(sg)) ** 2 if len(sg) > 1 else 0.0 for sg in segs]
    n = problem.num_ops
    start = np.zeros(n)
    intra = np.zeros(n, bool)
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    offset = 0.0
    bound = 0.0
    rounds = 0
    statuses, stops = [], []
    names = []
    for k, sg in enumerate(segs):
        sub = _subproblem(problem, sg)
        share = weight[k] / max(sum(weight[k:]), 1e-300) if weight[k] else 1.0
        stop = allow.stop()
        if stop is not None and _trivial(sub, t0) is None:
            r = _fallback(sub, _heuristic(sub), float("nan"), time.perf_counter(), 0, "the budget", stop)
        else:
            r = _solve_connected(sub, backend, allow.part(share), rel_gap, lazy, num_workers)
        start[sg] = r.start_s + offset
        intra[sg] = r.intra
        tc[sg] = r.tc_core
        vc[sg] = r.vc_core
        offset += r.makespan_s
        bound += r.bound_s
        rounds += r.lazy_rounds
        statuses.append(r.status)
        stops.append(r.stopped_by)
        if r.status != "trivial" and r.solver not in names:
            names.append(r.solver)
    status = ("trivial" if all(st == "trivial" for st in statuses) else "fallback" if "fallback" in statuses
              else "feasible" if "feasible" in statuses else "optimal")
    solver = f"{'+'.join(names) or 'closed-form'} [{len(segs)} series segments]"
    out = _finish(problem, start, intra, tc, vc, status, solver, t0, lazy_rounds=rounds, bound_s=bound)
    out.gap = 0.0 if status in ("optimal", "trivial") else _gap(out.makespan_s, bound)
    out.stopped_by = worst_stop(stops)
    out.dtime = allow.spent
    try:
        check_schedule(problem, out, rel_tol=1e-7)
    except ValueError as exc:  # should never happen; never return an invalid schedule
        warnings.warn(f"layer ILP produced an invalid schedule ({exc}); using the heuristic", stacklevel=3)
        return _fallback(problem, _heuristic(problem), bound, t0, rounds, solver, "solver_failed",
                         allow.spent)
    return out


def _solve_connected(problem: LayerProblem, backend: str, allow: Allowance, rel_gap: float, lazy: bool,
                     num_workers: int) -> LayerSchedule:
    """The ILP on one (series-indecomposable) DAG, with the lazy z-rounds of Appendix A.

    With CP-SAT on 8+ ops the budget goes in two phases: a quick attempt (``QUICK_ATTEMPT_DTIME``
    deterministic seconds) hinted by the greedy/sequential schedule; if that does not prove
    optimality, the interval warm start (``cpsat._warm_start``, ``WARM_START_SHARE`` of what is left,
    at most ``WARM_START_MAX_DTIME``) provides a better hint and the lazy rounds continue (z-types
    already added and the best bound so far are kept) for the rest of the budget."""
    t0 = time.perf_counter()
    triv = _trivial(problem, t0)
    if triv is not None:
        return triv
    rank = _rank(problem)
    heur = _heuristic(problem)
    st = _LazyState(z_types={"tc": not lazy, "vc": not lazy}, hint=heur, solver=backend)
    two_phases = backend == "cpsat" and problem.num_ops >= WARM_START_MIN_OPS
    best: LayerSchedule | None = None
    for ph in range(2 if two_phases else 1):
        if ph:
            stop = allow.stop()
            if stop is not None:
                st.stopped_by = stop
                break
            ws = _run_warm_start(problem, allow.part(WARM_START_SHARE, WARM_START_MAX_DTIME), num_workers)
            if ws is not None and ws.makespan_s < st.hint.makespan_s:
                st.hint = ws
        phase = allow.part(1.0, QUICK_ATTEMPT_DTIME) if two_phases and not ph else allow
        got = _lazy_solve(problem, backend, phase, rel_gap, num_workers, rank, st)
        if got is not None and (best is None or got.status == "optimal" or got.makespan_s < best.makespan_s):
            best = got
        if best is not None and (best.status == "optimal" or st.stopped_by == "gap_target"):
            break
    bound = st.bound_s
    heur = st.hint  # the best valid schedule the heuristics found
    if best is None:
        return _fallback(problem, heur, bound, t0, st.lazy_rounds, st.solver, st.stopped_by, allow.spent)
    best.lazy_rounds = st.lazy_rounds
    if best.status != "optimal" and heur.makespan_s < best.makespan_s:
        best = heur.copy(solver=f"{st.solver}+{heur.solver}", lazy_rounds=st.lazy_rounds, status="feasible")
    if best.status == "optimal":
        best.gap = 0.0
        best.bound_s = min(bound, best.makespan_s) if math.isfinite(bound) else best.makespan_s
        best.stopped_by = "optimal"
    else:
        best.gap = _gap(best.makespan_s, bound)
        best.bound_s = bound
        best.stopped_by = st.stopped_by
    best.dtime = allow.spent
    try:
        check_schedule(problem, best, rel_tol=1e-7)
    except ValueError as exc:  # should never happen; never return an invalid schedule
        warnings.warn(f"layer ILP produced an invalid schedule ({exc}); using the heuristic", stacklevel=3)
        return _fallback(problem, heur, bound, t0, st.lazy_rounds, st.solver, "solver_failed", allow.spent)
    best.solve_time_s = time.perf_counter() - t0
    return best


def _gap(makespan: float, bound: float) -> float:
    if not math.isfinite(bound) or makespan <= 0:
        return float("nan") if not math.isfinite(bound) else 0.0
    return max(0.0, 1.0 - bound / makespan)


def _fallback(problem: LayerProblem, heur: LayerSchedule, bound_s: float, t0: float, rounds: int,
              name: str, stopped_by: str, dtime: float = 0.0) -> LayerSchedule:
    """The list schedule ``heur`` as the answer (no solver solution): status "fallback", its gap
    against the best bound, and why the solver stopped."""
    return heur.copy(status="fallback", gap=_gap(heur.makespan_s, bound_s), bound_s=bound_s,
                     solver=f"{heur.solver} (fallback after {name})", lazy_rounds=rounds,
                     solve_time_s=time.perf_counter() - t0, stopped_by=stopped_by, dtime=dtime)
