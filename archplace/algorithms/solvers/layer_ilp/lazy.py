"""Appendix A's lazy resource constraints: rounds of the ILP that add the core-assignment variables
of a core type back only once a solution over-subscribes that type.

``_LazyState`` is what the rounds carry from one call to the next (the quick first attempt and the
second phase of ``solve._solve_connected`` share it), so a later call neither repeats a round nor
forgets a bound.

With bandwidth shares the HiGHS backend has only pairwise no-overlap constraints; a rebuilt schedule
in which a larger set of single-core ops overlaps above the capacity adds a cut for that set
(``milp.py``) and the round is re-solved, like a core type added back (CP-SAT's cumulatives never
need one; the check runs for every backend all the same).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from .budget import Allowance
from .contention import demands, overloaded_sets
from .cpsat import _solve_cpsat
from .heuristics import _repair
from .model import _build_spec, _Raw, _Spec
from .problem import LayerProblem
from .schedule import LayerSchedule, _asap, _assign_cores, _core_usage, _finish
from .workers import _call_isolated, _cpsat_in_process


@dataclass
class _LazyState:
    """What the lazy rounds of one ``_solve_connected`` call carry across ``_lazy_solve`` calls.

    The quick first attempt and the second phase share one state so that the second phase starts
    with the z-types the first one had to add, the best bound it proved (passed to the next round as
    a lower bound on ``T``) and the best valid schedule found so far (the next round's hint, and the
    fallback when no round finds a solution in time).
    """

    z_types: dict[str, bool]  # "tc" / "vc": whether that core type's z-variables are in the model
    hint: LayerSchedule  # the best valid schedule known (heuristic, warm start or repaired round)
    lazy_rounds: int = 0  # rounds re-solved after adding z-variables or bandwidth cuts (LayerSchedule's)
    bound_s: float = float("nan")  # best proven lower bound on the makespan, seconds; NaN: none yet
    solver: str = ""  # name of the backend that answered the last round
    share_cuts: list = field(default_factory=list)  # op sets of the HiGHS bandwidth cuts so far
    stopped_by: str = "deterministic_limit"  # why the last round stopped (``budget.STOP_REASONS``)


def _run_backend(backend: str, problem: LayerProblem, spec: _Spec, work: float, wall_s: float, rel_gap: float,
                 hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    """One round on ``backend``, limited by ``work`` deterministic seconds and (safety) ``wall_s``."""
    args = (problem, spec, work, wall_s, rel_gap, hint, num_workers, lower_bound_s)
    if backend == "cpsat" and _cpsat_in_process():
        return _solve_cpsat(*args)
    fn = "cpsat._solve_cpsat" if backend == "cpsat" else "milp._solve_milp"
    raw = _call_isolated(backend, fn, *args, timeout_s=wall_s + 120.0)
    if raw is None:
        return _Raw(False, False, float("nan"), float("nan"), name=f"{backend} (worker failed)")
    return raw


def _rebuild(problem: LayerProblem, raw: _Raw, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float schedule from a solver solution: ASAP along x ∪ ≺ ∪ (solver t-order)."""
    n = problem.num_ops
    intra = raw.y.copy()
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    base = raw.x | problem.reach()
    eps = 1e-9 * max(problem.horizon_s(), 1e-300)
    s, e = raw.start_s, raw.end_s
    key_less = (s[:, None] < s[None, :]) | ((s[:, None] == s[None, :]) & (rank[:, None] < rank[None, :]))
    torder = (e[:, None] <= s[None, :] + eps) & key_less & ~np.eye(n, dtype=bool)
    start = _asap(base | torder, dur)
    if start is None:
        start = _asap(base, dur)
    if start is None:  # x not acyclic (numerical trouble)
        raise RuntimeError("solver x-order is cyclic")
    return start, intra


def _lazy_solve(problem: LayerProblem, backend: str, allow: Allowance, rel_gap: float, num_workers: int,
                rank: np.ndarray, st: _LazyState) -> LayerSchedule | None:
    """Lazy rounds until a solution fits the cores (returned, status "optimal" when its round was
    solved to optimality) or the budget ``allow`` runs out / a round has no solution (None). Each
    round gets what is left of ``allow`` and is charged the deterministic time it spent. ``st``
    carries the active z-types, the number of rounds, the best bound, the best valid schedule (the
    hint) and why the last round stopped across calls and is updated in place; an over-subscribed
    solution is repaired into a valid one for the next hint."""
    t0 = time.perf_counter()
    active = st.z_types
    while True:
        stop = allow.stop()
        if stop is not None:
            st.stopped_by = stop
            return None
        spec = _build_spec(problem, active["tc"], active["vc"], st.share_cuts)
        raw = _run_backend(backend, problem, spec, allow.work_left(), allow.wall_left(), rel_gap, st.hint,
                           num_workers, st.bound_s)
        allow.spend(raw.dtime)
        st.solver = raw.name
        st.stopped_by = raw.stop
        # every round's model is a relaxation of (or equal to) the full one: its bound is valid
        if math.isfinite(raw.bound_s):
            st.bound_s = raw.bound_s if not math.isfinite(st.bound_s) else max(st.bound_s, raw.bound_s)
        if not raw.has_solution:
            return None
        try:
            start, intra = _rebuild(problem, raw, rank)
        except RuntimeError:
            return None
        dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
        if problem.has_contention:
            tol = 1e-9 * max(problem.horizon_s(), 1e-300)
            cuts = [c for c in overloaded_sets(start, dur, intra, demands(problem), tol)
                    if c not in st.share_cuts]
            if cuts:
                st.share_cuts.extend(cuts)
                st.lazy_rounds += 1
                fixed = _repair(problem, start, intra)
                if fixed.makespan_s < st.hint.makespan_s:
                    st.hint = fixed
                continue
        use_tc, use_vc = _core_usage(problem, start, dur, intra)
        need = set()
        if not active["tc"] and use_tc > problem.num_tc:
            need.add("tc")
        if not active["vc"] and use_vc > problem.num_vc:
            need.add("vc")
        cores = None
        if not need:
            cores = _assign_cores(problem, start, dur, intra,
                                  raw.z_tc if active["tc"] else None, raw.z_vc if active["vc"] else None)
            if cores is None:
                need = {t for t in ("tc", "vc") if not active[t]}
                if not need:  # cannot happen with a full model
                    return None
        if need:
            for t in need:
                active[t] = True
            st.lazy_rounds += 1
            fixed = _repair(problem, start, intra)
            if fixed.makespan_s < st.hint.makespan_s:
                st.hint = fixed  # the next round starts from the repaired solution
            continue
        return _finish(problem, start, intra, cores[0], cores[1], "optimal" if raw.optimal else "feasible",
                       raw.name, t0, bound_s=st.bound_s)
