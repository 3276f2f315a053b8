"""The CP-SAT backend: Phaze's formulation with integer-scaled times, the implied constraints and
symmetry breaking that make it fast, its hint, and the compact interval model that warm-starts it.

OR-Tools is imported inside the functions only, so importing this package (as the HiGHS worker
does) never loads it; see ``workers.py`` for why that matters.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .budget import SOLVER_SEED
from .contention import SHARE_QUANTUM, demands
from .model import _Raw, _Spec, _z_argmax, _z_ops
from .problem import KIND_FUSED, KIND_TC, KIND_VC, LayerProblem
from .schedule import LayerSchedule, _asap, _rank

TIME_RESOLUTION_REL = 2.0 ** -30  # CP-SAT time unit as a fraction of H
CPSAT_INTERLEAVE = True  # several workers: interleaved search (deterministic), not the free portfolio
_CPSAT_REDUNDANT = True  # add the implied constraints of _cpsat_redundant
_CPSAT_SYMMETRY = True  # add the core-relabelling symmetry breaking of _cpsat_symmetry


def _integer_times(problem: LayerProblem) -> tuple[float, np.ndarray, np.ndarray, int]:
    """CP-SAT's integer time scale (package docstring): the unit ``res``, ℓ and ℓ̂ in units, and the
    horizon ``H = min(Σ ℓ̂, Σ ℓ)`` (both all-sequential schedules are feasible)."""
    res = problem.horizon_s() * TIME_RESOLUTION_REL
    li = np.rint(problem.latency_s / res).astype(np.int64)
    lh = np.rint(problem.intra_latency_s / res).astype(np.int64)
    return res, li, lh, int(min(li.sum(), lh.sum()))


def _solve_cpsat(problem: LayerProblem, spec: _Spec, work: float, wall_s: float, rel_gap: float,
                 hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    """One round of the formulation, limited by ``work`` deterministic seconds and (safety) ``wall_s``."""
    from ortools.sat.python import cp_model

    n = spec.n
    res, li, lh, H = _integer_times(problem)
    md = cp_model.CpModel()
    T = md.new_int_var(0, H, "T")
    t = [md.new_int_var(0, H, f"t{i}") for i in range(n)]
    p = [md.new_int_var(int(min(li[i], lh[i])), int(max(li[i], lh[i])), f"p{i}") for i in range(n)]
    y = [md.new_bool_var(f"y{i}") for i in range(n)]
    x = np.empty((n, n), dtype=object)
    for i in range(n):
        for j in range(n):
            if i != j:
                x[i, j] = md.new_bool_var(f"x{i}_{j}")
    for i in range(n):
        md.add(T >= t[i] + p[i])  # (1)
        md.add(p[i] == int(li[i]) + int(lh[i] - li[i]) * y[i])  # (2)
        if _CPSAT_REDUNDANT and problem.intra_latency_s[i] >= problem.latency_s[i]:
            md.add(y[i] == 0)  # dominance (see _cpsat_redundant)
    for i, j in zip(*np.nonzero(np.triu(~spec.reach & ~spec.reach.T, 1))):  # (3)
        md.add(x[i, j] + x[j, i] <= 1)
    for i, j, k in spec.tri.tolist():  # (4)
        md.add_bool_or([x[i, k], ~x[i, j], ~x[j, k]])
    for i, j in zip(spec.prec_i.tolist(), spec.prec_j.tolist()):
        md.add(x[i, j] == 1)  # (5)
        md.add(x[j, i] == 0)  # (6)
        md.add(t[i] + p[i] <= t[j])  # (7)
    for i, j in zip(spec.inc_i.tolist(), spec.inc_j.tolist()):
        md.add(t[i] + p[i] - H + H * x[i, j] <= t[j])  # (8)
        md.add(x[i, j] + x[j, i] >= y[i])  # (9)
    use_tc, use_vc = _z_ops(problem, spec)
    z: dict[str, np.ndarray] = {}
    for name, on, kk, use in (("tc", spec.tc, spec.k_tc, use_tc), ("vc", spec.vc, spec.k_vc, use_vc)):
        if not on:
            continue
        zz = np.empty((n, kk), dtype=object)
        for i in range(n):
            for c in range(kk):
                zz[i, c] = md.new_bool_var(f"z{name}{i}_{c}")
        z[name] = zz
        for i in range(n):
            if use[i]:
                md.add(y[i] + sum(zz[i].tolist()) == 1)  # (10)/(11)
                if problem.kind[i] == KIND_FUSED:
                    for c in range(problem.num_pairs, kk):  # implied: fused ops use pairs only
                        md.add(zz[i, c] == 0)
            else:
                for c in range(kk):
                    md.add(zz[i, c] == 0)  # (12)/(13)
        for i, j in zip(*np.nonzero(np.triu(~spec.reach & ~spec.reach.T, 1))):  # (15)/(16)
            if use[i] and use[j]:
                for c in range(kk):
                    md.add_bool_or([x[i, j], x[j, i], ~zz[i, c], ~zz[j, c]])
    if spec.tc and spec.vc:
        for i in np.flatnonzero(problem.kind == KIND_FUSED).tolist():  # (14)
            for c in range(min(spec.k_tc, spec.k_vc)):
                md.add(z["tc"][i, c] == z["vc"][i, c])
    if problem.has_contention:
        _cpsat_contention(md, problem, t, y, li)
        for i, j in spec.share_pairs.tolist():  # implied by the cumulatives; helps propagation
            md.add_bool_or([x[i, j], x[j, i]])
    if z and _CPSAT_SYMMETRY:
        _cpsat_symmetry(md, problem, spec, z)
    if _CPSAT_REDUNDANT:
        _cpsat_redundant(md, problem, spec, li, lh, T, t, p, y, z)
    if math.isfinite(lower_bound_s):
        # an earlier lazy round's bound (same integer data, a relaxation of this model) stays valid
        md.add(T >= int(math.floor(lower_bound_s / res + 1e-6)))
    md.minimize(T)
    if hint is not None:
        _cpsat_hint(md, problem, spec, hint, li, lh, T, t, p, y, x, z)
    solver = _solver(work, wall_s, num_workers)
    solver.parameters.relative_gap_limit = float(rel_gap)
    st = solver.solve(md)
    name = f"cp-sat {_ortools_version()}"
    bound = solver.best_objective_bound
    bound_s = float(bound) * res if math.isfinite(bound) else float("nan")
    dtime = float(solver.response_proto.deterministic_time)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Raw(False, False, float("nan"), bound_s, name=name,
                    stop=_stop_reason(solver, st, work, wall_s), dtime=dtime)
    sol = np.asarray(solver.response_proto.solution, dtype=np.int64)

    def val(a: np.ndarray) -> np.ndarray:
        idx = np.vectorize(lambda v: v.index, otypes=[np.int64])(a)
        return sol[idx]

    ts = val(np.asarray(t, dtype=object)).astype(np.float64)
    ps = val(np.asarray(p, dtype=object)).astype(np.float64)
    ys = val(np.asarray(y, dtype=object)).astype(bool)
    xs = np.zeros((n, n), dtype=bool)
    off = ~np.eye(n, dtype=bool)
    xs[off] = val(x[off]).astype(bool)
    zt = _z_argmax(val(z["tc"]) if "tc" in z and spec.k_tc else None, n)
    zv = _z_argmax(val(z["vc"]) if "vc" in z and spec.k_vc else None, n)
    obj = float(solver.objective_value)
    optimal = st == cp_model.OPTIMAL and obj <= bound
    return _Raw(True, bool(optimal), obj * res, bound_s, ts * res, (ts + ps) * res, ys, xs, zt, zv,
                name, "optimal" if optimal else _stop_reason(solver, st, work, wall_s), dtime)


def _solver(work: float, wall_s: float, num_workers: int) -> Any:
    """A CP-SAT solver stopped by ``work`` deterministic seconds (the budget) or ``wall_s`` (the
    safety limit), with a fixed seed. Several workers search interleaved (``interleave_search``):
    CP-SAT's parallel portfolio is not deterministic otherwise."""
    from ortools.sat.python import cp_model

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(float(wall_s), 1e-6)
    if math.isfinite(work):
        prm.max_deterministic_time = max(float(work), 1e-6)
    prm.num_workers = int(num_workers)
    prm.random_seed = SOLVER_SEED
    if num_workers > 1 and CPSAT_INTERLEAVE:
        prm.interleave_search = True
    prm.log_search_progress = False
    return solver


def _stop_reason(solver: Any, status: int, work: float, wall_s: float) -> str:
    """Why a CP-SAT solve that did not prove optimality stopped (``budget.STOP_REASONS``). The wall
    clock is checked first: where it ran out, it decided where the run ended (the interleaved search
    checks the deterministic limit only between batches, so its dtime can be past the limit too).
    A stop that neither limit explains is counted as the wall clock's (not reproducible)."""
    from ortools.sat.python import cp_model

    if status == cp_model.OPTIMAL:  # "optimal" within the relative gap limit
        return "gap_target"
    if status in (cp_model.INFEASIBLE, cp_model.MODEL_INVALID):
        return "solver_failed"
    resp = solver.response_proto
    if resp.wall_time >= max(float(wall_s), 1e-6) * 0.99:
        return "wall_limit"
    if math.isfinite(work) and resp.deterministic_time >= max(float(work), 1e-6) * (1 - 1e-9):
        return "deterministic_limit"
    return "wall_limit"


def _cpsat_contention(md: Any, problem: LayerProblem, t: list, y: list, li: np.ndarray) -> None:
    """Shared HBM / GLB bandwidth (``contention.py``): per resource a cumulative of capacity
    ``SHARE_QUANTUM`` over one interval per op, ``[t_i, t_i + ℓ_i)`` present iff ``¬y_i``, with
    demand ``ceil(share_i · Q)``. That is the interval ``(t_i, p_i, t_i + p_i)`` with demand
    ``ceil(share_i · Q)·(1 − y_i)`` of the formulation, written with a fixed size so that it needs no
    variable demand (an intra-op op demands nothing: constraint (9) keeps it apart from every other
    op anyway). An op whose float ℓ is positive but rounds to 0 units gets size 1, so that no op with
    a real duration escapes the capacity (conservative by one time unit)."""
    dem = demands(problem)
    live = [i for i in range(problem.num_ops) if problem.latency_s[i] > 0 and dem[:, i].any()]
    if not live:
        return
    iv = {i: md.new_optional_fixed_size_interval_var(t[i], max(int(li[i]), 1), ~y[i], f"B{i}") for i in live}
    for r in range(dem.shape[0]):
        ops = [i for i in live if dem[r, i] > 0]
        if sum(int(dem[r, i]) for i in ops) > SHARE_QUANTUM:
            md.add_cumulative([iv[i] for i in ops], [int(dem[r, i]) for i in ops], SHARE_QUANTUM)


def _cpsat_symmetry(md: Any, problem: LayerProblem, spec: _Spec, z: dict) -> None:
    """Core-relabelling symmetry breaking (keeps at least one optimal solution of every class).

    Relabelling the pairs ``c < m`` jointly on both sides, or the unpaired cores of one type among
    themselves, maps solutions to solutions (and, for a type without z-variables, a completion of
    the colouring to a completion). So cores can be numbered by the smallest op index using them:
    op i may use pair c >= 1 only if some op j < i uses pair c - 1; likewise for unpaired cores
    after the first one of each type. ``w_ic`` is the op's z on its own type (a fused op has the
    same c on both sides, so either side describes it; its TC side is used when present).
    """
    n = spec.n
    m = problem.num_pairs
    k = problem.kind

    def w(i: int, c: int, side: str | None = None) -> Any:
        if side is not None:
            zz = z.get(side)
            return zz[i, c] if zz is not None and c < zz.shape[1] else None
        if k[i] == KIND_TC or (k[i] == KIND_FUSED and "tc" in z):
            return w(i, c, "tc")
        if k[i] == KIND_VC or k[i] == KIND_FUSED:
            return w(i, c, "vc")
        return None

    # joint pair ordering: only when each op's pair use is described by one variable per c
    kp = min([zz.shape[1] for zz in z.values()] + [m])
    for i in range(n):
        for c in range(1, kp):
            wi = w(i, c)
            if wi is None:
                continue
            prev = [w(j, c - 1) for j in range(i)]
            prev = [v for v in prev if v is not None]
            md.add(wi <= sum(prev)) if prev else md.add(wi == 0)
    for side in z:
        zz = z[side]
        for i in range(n):
            for c in range(m + 1, zz.shape[1]):
                prev = [zz[j, c - 1] for j in range(i)]
                md.add(zz[i, c] <= sum(prev)) if prev else md.add(zz[i, c] == 0)


def _cpsat_redundant(md: Any, problem: LayerProblem, spec: _Spec, li: np.ndarray, lh: np.ndarray,
                     t_obj: Any, t: list, p: list, y: list, z: dict) -> None:
    """Implied global constraints that only strengthen CP-SAT's propagation and LP relaxation (the
    feasible set of the formulation is unchanged). Each op gets two optional fixed-size intervals
    at ``t_i``: ``ℓ̂_i`` present iff ``y_i`` and ``ℓ_i`` present iff ``¬y_i`` (fixed sizes and demands
    make the energy ``y·ℓ̂·D + (1−y)·ℓ·d`` linear). Zero-size intervals are left out (their overlap
    semantics need not match the ILP's).

    - Exclusivity as a cumulative, capacity n: demand n for the intra-op interval, 1 otherwise.
      Implied by (7)–(9): an intra-op op is ordered against every other op, so it overlaps none.
    - Dominance (not implied, but keeps an optimal solution): ``y_i = 0`` when ``ℓ̂_i >= ℓ_i``. An
      intra-op op runs alone, so in its window every core is free and running it on one core
      instead ends no later; nothing else changes.
    - For a core type with z-variables (K cores indexed): a cumulative of capacity K, where an
      intra-op op of any type demands K (it runs alone) and a non-intra op of that type 1 (implied
      by (10)–(16): ops sharing a core are ordered); and one no-overlap per core over intervals of
      size ℓ_i present iff ``z_ic`` (implied by (15)/(16) with (8); ``z_ic`` forces ``y_i = 0``).
    - With bandwidth shares, an energy bound per resource on ``W`` (see below; implied by the
      cumulatives of ``_cpsat_contention``).
    """
    n = spec.n
    # chain bound: intra-op intervals are disjoint from each other and from everything else, and
    # the non-intra ops of one chain are disjoint, so T >= Σ_i y_i ℓ̂_i + Σ_{i in C} (1 - y_i) ℓ_i
    # for every chain C; u_i is the longest such chain sum ending at i (over DAG edges).
    hz = int(max(li.sum(), lh.sum()))
    u = [md.new_int_var(0, hz, f"u{i}") for i in range(n)]
    pred = problem.predecessors()
    excl = sum(int(lh[i]) * y[i] for i in range(n))
    W = md.new_int_var(0, hz, "W")  # time not covered by intra-op ops
    for i in range(n):
        own = int(li[i]) - int(li[i]) * y[i]
        md.add(u[i] >= own)
        for j in pred[i]:
            md.add(u[i] >= u[j] + own)
        md.add(W >= u[i])
    md.add(t_obj >= excl + W)
    # energy: with z-variables for a type, at most K ops of that type run at once outside
    # intra-op time, so K·W >= Σ (1 - y_i) ℓ_i over the ops of that type
    for name, zz in z.items():
        kk = zz.shape[1]
        uses = problem.kind != (KIND_VC if name == "tc" else KIND_TC)
        if kk:
            md.add(kk * W >= sum(int(li[i]) - int(li[i]) * y[i] for i in np.flatnonzero(uses).tolist()))
    # shared-bandwidth energy: outside intra-op time the single-core ops' demand-weighted time fits
    # under the capacity, Q·W >= Σ (1 - y_i) ℓ_i d_i per resource (implied by the cumulatives)
    if problem.has_contention:
        dem = demands(problem)
        for r in range(dem.shape[0]):
            if dem[r].any():
                md.add(SHARE_QUANTUM * W >= sum(int(li[i]) * int(dem[r, i]) * (1 - y[i])
                                                for i in np.flatnonzero(dem[r]).tolist()))
    iv1: dict[int, Any] = {}
    iv0: dict[int, Any] = {}
    for i in range(n):
        if lh[i] > 0:
            iv1[i] = md.new_optional_fixed_size_interval_var(t[i], int(lh[i]), y[i], f"Ih{i}")
        if li[i] > 0:
            iv0[i] = md.new_optional_fixed_size_interval_var(t[i], int(li[i]), ~y[i], f"Il{i}")
    if len(iv1) + len(iv0) < 2:
        return
    md.add_cumulative(list(iv1.values()) + list(iv0.values()), [n] * len(iv1) + [1] * len(iv0), n)
    for name, zz in z.items():
        kk = zz.shape[1]
        if kk == 0:
            continue
        uses = problem.kind != (KIND_VC if name == "tc" else KIND_TC)
        ops0 = [i for i in iv0 if uses[i]]
        md.add_cumulative(list(iv1.values()) + [iv0[i] for i in ops0], [kk] * len(iv1) + [1] * len(ops0),
                          kk)
        if len(ops0) < 2:
            continue
        for c in range(kk):
            md.add_no_overlap([md.new_optional_fixed_size_interval_var(t[i], int(li[i]), zz[i, c],
                                                                       f"I{name}{i}_{c}") for i in ops0])


def _warm_start(problem: LayerProblem, work: float, wall_s: float, num_workers: int, capacity: bool = True
                ) -> tuple[tuple[np.ndarray, np.ndarray] | None, float]:
    """Primal heuristic for the hint (not the reported model): a compact CP-SAT interval model of
    the same problem with core *counts* instead of core indices: per op two optional fixed-size
    intervals (ℓ̂ if intra-op, ℓ otherwise), precedence, an exclusivity cumulative and one capacity
    cumulative per core type. CP-SAT's scheduling search finds good schedules here much faster than
    in the x/z formulation. With bandwidth shares, the same shared-bandwidth cumulatives as the full
    model (``_cpsat_contention``). Returns (start_s, intra) of its best schedule (re-timed ASAP with the
    float latencies along its interval order), or None; and the deterministic seconds it spent.
    Limited by ``work`` deterministic seconds and (safety) ``wall_s``."""
    from ortools.sat.python import cp_model

    n = problem.num_ops
    res, li, lh, H = _integer_times(problem)
    md = cp_model.CpModel()
    T = md.new_int_var(0, H, "T")
    t = [md.new_int_var(0, H, f"t{i}") for i in range(n)]
    e = [md.new_int_var(0, H, f"e{i}") for i in range(n)]
    y = [md.new_bool_var(f"y{i}") for i in range(n)]
    i1 = [md.new_optional_fixed_size_interval_var(t[i], int(lh[i]), y[i], f"a{i}") for i in range(n)]
    i0 = [md.new_optional_fixed_size_interval_var(t[i], int(li[i]), ~y[i], f"b{i}") for i in range(n)]
    for i in range(n):
        md.add(e[i] == t[i] + int(li[i]) + int(lh[i] - li[i]) * y[i])
        md.add(T >= e[i])
        if problem.intra_latency_s[i] >= problem.latency_s[i]:
            md.add(y[i] == 0)
    for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        md.add(t[b] >= e[a])
    md.add_cumulative(i1 + i0, [n] * n + [1] * n, n)
    if problem.has_contention:
        _cpsat_contention(md, problem, t, y, li)
    for cap, uses in ((problem.num_tc, problem.kind != KIND_VC), (problem.num_vc, problem.kind != KIND_TC)):
        if not capacity:
            break
        sel = np.flatnonzero(uses).tolist()
        md.add_cumulative(i1 + [i0[i] for i in sel], [cap] * n + [1] * len(sel), cap)
    md.minimize(T)
    solver = _solver(work, wall_s, num_workers)
    st = solver.solve(md)
    dtime = float(solver.response_proto.deterministic_time)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, dtime
    ts = np.array([solver.value(v) for v in t], dtype=np.float64)
    es = np.array([solver.value(v) for v in e], dtype=np.float64)
    ys = np.array([solver.boolean_value(v) for v in y], dtype=bool)
    rank = _rank(problem)
    key_less = (ts[:, None] < ts[None, :]) | ((ts[:, None] == ts[None, :]) & (rank[:, None] < rank[None, :]))
    order = (es[:, None] <= ts[None, :]) & key_less & ~np.eye(n, dtype=bool)
    start = _asap(order | problem.reach(), np.where(ys, problem.intra_latency_s, problem.latency_s))
    return (None if start is None else (start, ys)), dtime


def _cpsat_hint(md: Any, problem: LayerProblem, spec: _Spec, h: LayerSchedule, li: np.ndarray,
                lh: np.ndarray, T: Any, t: list, p: list, y: list, x: np.ndarray, z: dict) -> None:
    """A consistent integer hint: the heuristic schedule's order, re-timed ASAP with the rounded
    latencies."""
    n = spec.n
    d = h.durations(problem)
    e = h.start_s + d
    order = (e[:, None] <= h.start_s[None, :]) & ~np.eye(n, dtype=bool)
    rank = _rank(problem)
    key_less = (h.start_s[:, None] < h.start_s[None, :]) | (
        (h.start_s[:, None] == h.start_s[None, :]) & (rank[:, None] < rank[None, :]))
    order &= key_less
    order |= spec.reach
    pint = np.where(h.intra, lh, li).astype(np.float64)
    s_int = _asap(order, pint)
    if s_int is None:
        return
    for i in range(n):
        md.add_hint(t[i], int(s_int[i]))
        md.add_hint(p[i], int(pint[i]))
        md.add_hint(y[i], bool(h.intra[i]))
        for j in range(n):
            if i != j:
                md.add_hint(x[i, j], bool(order[i, j]))
    md.add_hint(T, int((s_int + pint).max()))
    for name, core in (("tc", h.tc_core), ("vc", h.vc_core)):
        if name in z:
            zz = z[name]
            if (core >= zz.shape[1]).any():
                continue
            for i in range(n):
                for c in range(zz.shape[1]):
                    md.add_hint(zz[i, c], bool(core[i] == c))


def _ortools_version() -> str:
    try:
        import ortools

        return ortools.__version__
    except Exception:  # pragma: no cover
        return "?"
