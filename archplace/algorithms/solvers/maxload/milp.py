"""Method ``milp``: the chain of ideals as a CP-SAT model with integer-scaled times, for inputs whose
ideals are too many to enumerate. Its bound is corrected for the rounding of the scaled times, so it
stays a valid bound on the real-valued optimum.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .contraction import _Problem
from .evaluate import evaluate_split
from .inputs import _INF

_MILP_RANGE = 1e10  # scaled times stay below this (CP-SAT gave wrong optima at about 1e12)


def _solve_milp(p: _Problem, deadline: float, stats: dict, threads: int) -> tuple[np.ndarray | None, float,
                                                                                 bool]:
    """CP-SAT on the chain-of-ideals model. Returns (device_of or None, proven lower bound, optimal).

    Times are scaled by a power of two and rounded; ``err`` bounds how far any device's rounded load
    can be from its real load, so ``bound / scale - err`` is a valid bound on the real optimum."""
    k = p.k
    if k + p.cpus == 0 or p.F == 0:
        return (np.zeros(p.n, dtype=np.int64) if p.F == 0 else None), 0.0, True
    total = float(max(p.acc.sum() + p.h_cost.sum(), p.cpu.sum(), 1e-12))
    scale = 2.0 ** math.floor(math.log2(_MILP_RANGE / total))
    acc_q = np.rint(p.acc * scale)
    cpu_q = np.rint(p.cpu * scale)
    hc_q = np.rint(p.h_cost * scale)
    err = max(np.abs(acc_q - p.acc * scale).sum() + np.abs(hc_q - p.h_cost * scale).sum(),
              np.abs(cpu_q - p.cpu * scale).sum()) / scale
    stats.update(milp_scale=scale, milp_rounding_bound=float(err))
    for presolve in (True, False):
        solved = _cp_sat(p, [int(v) for v in acc_q], [int(v) for v in cpu_q], [int(v) for v in hc_q],
                         deadline, threads, presolve)
        status, value, bound, sn_dev, info = solved
        stats.update({f"milp_{key}": (v / scale if key in ("objective", "bound") else v)
                      for key, v in info.items()})
        if sn_dev is None:
            break
        real = evaluate_split(p.g, sn_dev[p.sn]).max_load
        # the objective bounds the split's rounded loads, and equals the largest one when optimal
        tol = err + 1e-9 * max(1.0, real)
        if real <= value / scale + tol and (status != "OPTIMAL" or value / scale <= real + tol):
            break
        # the solver's value does not match its own split: do not trust it; solve again without presolve
        stats["milp_inconsistent"] = {"objective": value / scale, "evaluated": real, "presolve": presolve}
    else:
        return sn_dev[p.sn], 0.0, False  # keep the split, trust no bound
    if status == "INFEASIBLE":
        return None, _INF, True
    lb = max(0.0, bound / scale - err)
    if sn_dev is None:
        return None, lb, False
    return sn_dev[p.sn], lb, status == "OPTIMAL"


def _cp_sat(p: _Problem, acc_q: list[int], cpu_q: list[int], hc_q: list[int], deadline: float,
            threads: int, presolve: bool):
    """The chain model. Positions: a block of ``cpus`` CPU slots, then an accelerator slot, then a CPU
    block, ..., ending with a CPU block, so that any order of the non-empty pieces fits, and no slot
    needs a big-M to switch between kinds. ``z[v][j]``: supernode v lies in the ideal made of
    positions ``0..j``; piece ``j`` is ``z[., j] - z[., j-1]``."""
    from ortools.sat.python import cp_model

    k, cpus, M, F = p.k, p.cpus, p.mem, p.F
    kinds: list[str] = ["cpu"] * cpus
    for _ in range(k):
        kinds += ["acc"] + ["cpu"] * cpus
    m = len(kinds)
    model = cp_model.CpModel()
    z = [[model.NewBoolVar(f"z{v}_{j}") for j in range(m - 1)] for v in range(F)]

    def zz(v: int, j: int):
        return 0 if j < 0 else 1 if j >= m - 1 else z[v][j]

    for v in range(F):
        for j in range(m - 2):
            model.AddImplication(z[v][j], z[v][j + 1])
    for a, b in p.dag_edges:
        for j in range(m - 1):
            model.AddImplication(z[b][j], z[a][j])
    x = [[None] * m for _ in range(F)]
    for v in range(F):
        for j in range(m):
            xv = model.NewBoolVar(f"x{v}_{j}")
            model.Add(xv == zz(v, j) - zz(v, j - 1))
            x[v][j] = xv
    T = model.NewIntVar(0, max(sum(acc_q) + sum(hc_q), sum(cpu_q)) + 1, "T")
    mem_binds = math.isfinite(M) and float(p.size.sum()) > M
    sz = [int(math.ceil(s_)) for s_ in p.size]
    cpu_used, acc_used = [], []
    for j in range(m):
        used = model.NewBoolVar(f"used{j}")
        for v in range(F):
            model.AddImplication(x[v][j], used)
        model.AddBoolOr([x[v][j] for v in range(F)]).OnlyEnforceIf(used)
        if kinds[j] == "cpu":
            cpu_used.append(used)
            model.Add(sum(cpu_q[v] * x[v][j] for v in range(F)) <= T)
            continue
        acc_used.append(used)
        cut = []
        for h, members in enumerate(p.h_members):
            cv = model.NewBoolVar(f"cut{h}_{j}")
            c0 = int(members[0])
            for o in members[1:]:
                model.AddBoolOr([x[c0][j].Not(), x[int(o)][j], cv])
                model.AddBoolOr([x[int(o)][j].Not(), x[c0][j], cv])
            cut.append(cv)
        model.Add(sum(acc_q[v] * x[v][j] for v in range(F)) + sum(hc_q[h] * cut[h] for h in range(p.H)) <= T)
        if mem_binds:
            model.Add(sum(sz[v] * x[v][j] for v in range(F)) <= int(math.floor(M)))
        for v in range(F):
            if p.unsup[v] > 0:
                model.Add(x[v][j] == 0)
    model.Add(sum(cpu_used) <= cpus)
    for a, b in zip(acc_used, acc_used[1:]):  # empty accelerator slots last (a symmetry)
        model.AddImplication(b, a)
    model.Minimize(T)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(1.0, deadline - time.monotonic())
    solver.parameters.num_workers = max(1, threads)
    # CP-SAT 9.15 returned wrong "optimal" values when the scaled times were large (about 1e12 on this
    # model; 1e10 on an earlier big-M one) and, once, from the dual reductions of presolve: the times
    # are scaled to at most 1e10 (_MILP_RANGE), dual reductions are off, and _solve_milp checks the
    # objective against the re-evaluated split
    solver.parameters.keep_all_feasible_solutions_in_presolve = True
    solver.parameters.cp_model_presolve = presolve
    code = solver.Solve(model)
    status = solver.StatusName(code)
    info = {"status": status, "wall_s": round(solver.WallTime(), 3), "presolve": presolve}
    if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        bound = solver.BestObjectiveBound() if code == cp_model.UNKNOWN else 0.0
        return status, _INF, bound, None, info
    sn_dev = np.full(F, -1, dtype=np.int64)
    na = nc = 0
    for j in range(m):
        mask = np.array([solver.Value(x[v][j]) for v in range(F)], dtype=bool)
        if not mask.any():
            continue
        if kinds[j] == "cpu":
            sn_dev[mask] = k + nc
            nc += 1
        else:
            sn_dev[mask] = na
            na += 1
    value = solver.ObjectiveValue()
    info.update(objective=value, bound=solver.BestObjectiveBound())
    return status, value, solver.BestObjectiveBound(), sn_dev, info
