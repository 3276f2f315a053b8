"""The HiGHS backend (through PuLP): the formulation alone, without CP-SAT's redundant constraints,
so that it stays an independent cross-check of the CP-SAT model.

Shared bandwidth (``contention.py``) has no cumulative here. Two single-core ops whose demands sum
above the capacity must not overlap: ``x_ij + x_ji >= 1`` for every such incomparable pair (an
intra-op op is ordered by (9) anyway). A larger set S that overlaps in a rebuilt schedule with
summed demand above the capacity gets the lazy cut ``Σ_{i<j in S} (x_ij + x_ji) >= 1`` (``lazy.py``
re-solves): valid because single-core ops that pairwise overlap share an instant (Helly), where
they would over-subscribe the resource, and a pair ordered by x cannot overlap.

It always runs in a worker subprocess (``workers.py``): highspy and OR-Tools cannot share a process.
Its work budget is a node limit (``MILP_NODES_PER_DTIME`` nodes per deterministic second of the
budget), on one thread with a fixed seed, so that its answer does not depend on the machine's load.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .budget import SOLVER_SEED
from .model import _Raw, _Spec, _z_argmax, _z_ops
from .problem import KIND_FUSED, LayerProblem
from .schedule import LayerSchedule

MILP_TIME_UNITS = 1000.0  # HiGHS: H is this many time units
# HiGHS has no deterministic clock: its work budget is branch-and-bound nodes, this many for one
# deterministic second of the CP-SAT budget (``budget.py``)
MILP_NODES_PER_DTIME = 1000


def _milp_model(problem: LayerProblem, spec: _Spec) -> tuple[Any, dict[str, Any]]:
    """The PuLP model (times in units of H/MILP_TIME_UNITS) and its variables."""
    import pulp

    n = spec.n
    hz = problem.horizon_s()
    unit = hz / MILP_TIME_UNITS
    li = problem.latency_s / unit
    lh = problem.intra_latency_s / unit
    H = float(min(lh.sum(), li.sum()))
    lp = pulp.LpProblem("phaze_layer", pulp.LpMinimize)
    T = pulp.LpVariable("T", lowBound=0)
    t = [pulp.LpVariable(f"t{i}", lowBound=0) for i in range(n)]
    p = [pulp.LpVariable(f"p{i}", lowBound=0) for i in range(n)]
    y = [pulp.LpVariable(f"y{i}", cat="Binary") for i in range(n)]
    x = np.empty((n, n), dtype=object)
    for i in range(n):
        for j in range(n):
            if i != j:
                x[i, j] = pulp.LpVariable(f"x{i}_{j}", cat="Binary")
    lp += T
    for i in range(n):
        lp += T >= t[i] + p[i]  # (1)
        lp += p[i] == float(lh[i]) * y[i] + float(li[i]) * (1 - y[i])  # (2)
    unordered = list(zip(*np.nonzero(np.triu(~spec.reach & ~spec.reach.T, 1))))
    for i, j in unordered:
        lp += x[i, j] + x[j, i] <= 1  # (3)
    for i, j, k in spec.tri.tolist():
        lp += x[i, k] >= x[i, j] + x[j, k] - 1  # (4)
    for i, j in zip(spec.prec_i.tolist(), spec.prec_j.tolist()):
        lp += x[i, j] == 1  # (5)
        lp += x[j, i] == 0  # (6)
        lp += t[i] + p[i] <= t[j]  # (7)
    for i, j in zip(spec.inc_i.tolist(), spec.inc_j.tolist()):
        lp += t[i] + p[i] - H * (1 - x[i, j]) <= t[j]  # (8)
        lp += x[i, j] + x[j, i] >= y[i]  # (9)
    use_tc, use_vc = _z_ops(problem, spec)
    z: dict[str, np.ndarray] = {}
    for name, on, kk, use in (("tc", spec.tc, spec.k_tc, use_tc), ("vc", spec.vc, spec.k_vc, use_vc)):
        if not on:
            continue
        zz = np.empty((n, kk), dtype=object)
        for i in range(n):
            for c in range(kk):
                zz[i, c] = pulp.LpVariable(f"z{name}{i}_{c}", cat="Binary")
        z[name] = zz
        for i in range(n):
            if use[i]:
                lp += y[i] + pulp.lpSum(zz[i].tolist()) == 1  # (10)/(11)
                if problem.kind[i] == KIND_FUSED:
                    for c in range(problem.num_pairs, kk):
                        lp += zz[i, c] == 0
            else:
                for c in range(kk):
                    lp += zz[i, c] == 0  # (12)/(13)
        for i, j in unordered:  # (15)/(16)
            if use[i] and use[j]:
                for c in range(kk):
                    lp += x[i, j] + x[j, i] >= zz[i, c] + zz[j, c] - 1
    if spec.tc and spec.vc:
        for i in np.flatnonzero(problem.kind == KIND_FUSED).tolist():  # (14)
            for c in range(min(spec.k_tc, spec.k_vc)):
                lp += z["tc"][i, c] == z["vc"][i, c]
    for i, j in spec.share_pairs.tolist():  # shared bandwidth: pairs that cannot overlap
        lp += x[i, j] + x[j, i] >= 1
    for cut in spec.share_cuts:  # shared bandwidth: lazy cuts on larger sets
        lp += pulp.lpSum(x[a, b] + x[b, a] for k, a in enumerate(cut) for b in cut[k + 1:]) >= 1
    return lp, {"T": T, "t": t, "p": p, "y": y, "x": x, "z": z, "unit": unit}


def _solve_milp(problem: LayerProblem, spec: _Spec, work: float, wall_s: float, rel_gap: float,
                hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    """One round of the formulation on HiGHS: at most ``work · MILP_NODES_PER_DTIME`` branch-and-bound
    nodes (the deterministic budget), one thread and a fixed seed; ``wall_s`` is the safety limit."""
    import pulp

    n = spec.n
    lp, v_ = _milp_model(problem, spec)
    T, t, p, y, x, z, unit = (v_[k] for k in ("T", "t", "p", "y", "x", "z", "unit"))
    nodes = milp_node_limit(work)
    # HiGHS 1.15.1's symmetry handling (full orbitopes over the z columns) returned a suboptimal
    # point as "Optimal" on a 7-op instance of the random cross-check (seed 39 of tests); off.
    opts = {"mip_detect_symmetry": False, "random_seed": SOLVER_SEED}
    if nodes is not None:
        opts["mip_max_nodes"] = nodes
    solver = pulp.HiGHS(msg=False, timeLimit=max(float(wall_s), 1e-3), gapRel=float(rel_gap), threads=1,
                        **opts)
    _run_highs(lp, solver)
    name = "highs (pulp)"
    hs = lp.solverModel
    info = hs.getInfo()
    bound = getattr(info, "mip_dual_bound", float("nan"))
    bound_s = float(bound) * unit if bound is not None and math.isfinite(bound) else float("nan")
    import highspy

    mstat = hs.getModelStatus()
    gap = info.mip_gap if math.isfinite(getattr(info, "mip_gap", math.inf)) else math.inf
    optimal = mstat == highspy.HighsModelStatus.kOptimal and gap <= 1e-9
    stop = _stop_reason(mstat, optimal)
    dtime = max(int(getattr(info, "mip_node_count", 0) or 0), 1) / MILP_NODES_PER_DTIME
    has = int(getattr(info, "primal_solution_status", 0)) == 2 and mstat not in (
        highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kNotset)
    if not has or T.varValue is None:
        return _Raw(False, False, float("nan"), bound_s, name=name, stop=stop, dtime=dtime)

    def v(a: Any) -> float:
        return float(a.varValue or 0.0)

    ts = np.array([v(a) for a in t]) * unit
    ps = np.array([v(a) for a in p]) * unit
    ys = np.array([v(a) for a in y]) > 0.5
    xs = np.zeros((n, n), dtype=bool)
    for i in range(n):
        for j in range(n):
            if i != j:
                xs[i, j] = v(x[i, j]) > 0.5
    zt = _z_argmax(np.vectorize(v)(z["tc"]) if "tc" in z and spec.k_tc else None, n)
    zv = _z_argmax(np.vectorize(v)(z["vc"]) if "vc" in z and spec.k_vc else None, n)
    obj = v(T) * unit
    return _Raw(True, bool(optimal), obj, bound_s, ts, ts + ps, ys, xs, zt, zv, name, stop, dtime)


def _run_highs(lp: Any, solver: Any) -> None:
    """PuLP's ``HiGHS.actualSolve`` without its status table, which has no entry for the status of
    a node limit (``kSolutionLimit``, PuLP 3.3: a KeyError after the solve): build the HiGHS model,
    run it and copy the column values to the variables. The caller reads the status from HiGHS."""
    solver.createAndConfigureSolver(lp)
    solver.buildSolverModel(lp)
    solver.callSolver(lp)
    col = list(lp.solverModel.getSolution().col_value)
    for var in lp.variables():
        var.varValue = col[var.index] if col else None


def milp_node_limit(work: float) -> int | None:
    """HiGHS's node limit for ``work`` deterministic seconds (None: no limit)."""
    return max(1, math.ceil(work * MILP_NODES_PER_DTIME)) if math.isfinite(work) else None


def _stop_reason(mstat: Any, optimal: bool) -> str:
    """Why HiGHS stopped (``budget.STOP_REASONS``)."""
    import highspy

    S = highspy.HighsModelStatus
    if optimal:
        return "optimal"
    if mstat == S.kOptimal:  # within the relative gap target
        return "gap_target"
    if mstat == S.kTimeLimit:
        return "wall_limit"
    if mstat in (S.kSolutionLimit, S.kIterationLimit):  # the node limit
        return "deterministic_limit"
    return "solver_failed"
