"""Exact reference for multi-chip-module partitioning: CP-SAT maximises the analytical throughput under the
static constraints (spec ``mcm.md`` §1.3, paper Eqs. 2–4). Small graphs only: on 2 cores, 40 nodes / 8 chips
prove optimal in seconds, 50–60 nodes / 8 chips in one to two minutes on some graphs, while others keep a
gap of about 10% after two minutes (the LP bound sees little of the communication).

Cost model (the shared "analytical cost model"): chip ``d`` runs its nodes' ``time_s`` (compute) and sends,
on its outgoing ring link ``d -> d+1``, ``out_bytes[u]`` of every node ``u`` with ``f(u) <= d < m(u)``, where
``m(u)`` is the largest chip of ``u``'s successors (``f(u)`` when none is further). ``L_d = compute_d +
link_bytes_d / link_bw``; the throughput is ``1 / max_d L_d``, so the model minimises ``max_d L_d``.

CP-SAT model (``C' = min(C, N)`` chips: Eq. 3 makes more unusable):

* ``x[u, d]`` (node on chip), exactly one per node; ``y_u = sum_d d x[u, d]``; Eq. 2 as ``y_src <= y_dst``;
* Eq. 3: ``used_d`` with ``x[u, d] => used_d``, ``used_d => OR_u x[u, d]``, ``used_{d+1} => used_d``;
* Eq. 4: chip-pair booleans for ``a < b``: ``e[a, b]`` is implied by ``x[u, a] and x[v, b]`` for every edge
  ``(u, v)``; reachability ``r[a, b]`` is implied by ``e[a, b]`` and by ``r[a, k] and e[k, b]``; and
  ``not (e[a, b] and r[a, k] and r[k, b])`` for ``a < k < b``. Only the implying direction is needed: the
  true chip graph's edges and reachability satisfy the clauses exactly when the partition meets Eq. 4, and
  setting more of them true only forbids more;
* forwarding spans: ``g[u, l]`` is implied by ``y_v > l`` for a successor ``v`` (the output goes past chip
  ``l``), ``z[u, l] >= [y_u <= l] + g[u, l] - 1`` (link ``l`` carries ``out_bytes[u]``); again lower bounds
  suffice because the objective only grows with them. Redundant cut: in a weakly connected graph, when
  chip ``l+1`` is used some edge crosses boundary ``l``, so link ``l`` carries at least the smallest output
  of a node with successors (it lifts the LP bound, which otherwise ignores communication);
* memory: per chip, weights + the outputs of its nodes + the outputs it receives from other chips
  (``rcv[u, d]`` is implied by ``x[v, d] and not x[u, d]`` for a successor ``v``) ``<= sram_bytes``. Every
  byte that is ever resident or live on a chip is counted at once, so this is a *sufficient* (conservative)
  condition for the dynamic memory constraint H of the shared definitions, whatever the schedule; it can
  exclude partitions that H accepts, so the optimum is taken over a subset of the H-valid partitions;
* objective: ``M >= L_d`` for every chip, minimise ``M``.

Times are scaled to integers: one tick is ``UB / 2**33`` seconds, with ``UB = sum(time_s) +
sum(out_bytes) / link_bw`` (no chip latency can exceed it), so every coefficient is
``rint(seconds / tick)`` and scaled latencies stay below ``2**33`` (CP-SAT is unreliable near 1e12). The
returned partition is re-scored exactly in floating point (``max_latency_s``, ``throughput``); "optimal"
means optimal for the scaled model, whose per-chip error is at most ``N / 2`` ticks (about ``N * 6e-11``
of UB). ``bound_s`` is CP-SAT's lower bound converted back to seconds, lowered by that rounding error, so
it bounds the real-valued optimum of the model; ``gap = (max_latency_s - bound_s) / max_latency_s``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ExactResult", "chip_latencies", "solve_exact", "TICKS"]

TICKS = 2**33  # integer time units spanned by the latency upper bound UB


@dataclass
class ExactResult:
    """Best partition found (``None`` unless status is "optimal" or "feasible"), its exact max chip
    latency and throughput, the solver status, a lower bound on the max latency, the relative gap and the
    wall time."""

    partition: np.ndarray | None
    max_latency_s: float
    throughput: float
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    bound_s: float
    gap: float
    wall_s: float


def _arrays(problem: Any) -> tuple:
    """``(C, src, dst, time_s, out_bytes, weight_bytes, link_bw, sram)``, validated."""
    C = int(problem.num_chips)
    src = np.asarray(problem.src, dtype=np.int64).ravel()
    dst = np.asarray(problem.dst, dtype=np.int64).ravel()
    t = np.asarray(problem.time_s, dtype=np.float64).ravel()
    ob = np.asarray(problem.out_bytes, dtype=np.float64).ravel()
    wb = np.asarray(problem.weight_bytes, dtype=np.float64).ravel()
    n = t.size
    if C < 1:
        raise ValueError(f"num_chips is {C}, must be >= 1")
    if src.shape != dst.shape:
        raise ValueError(f"src and dst differ in length: {src.size} vs {dst.size}")
    if ob.size != n or wb.size != n:
        raise ValueError(f"time_s, out_bytes, weight_bytes must have equal lengths, got {n}, {ob.size}, "
                         f"{wb.size}")
    if src.size and (min(src.min(), dst.min()) < 0 or max(src.max(), dst.max()) >= n):
        raise ValueError(f"src/dst hold node indices outside [0, {n})")
    for name, a in (("time_s", t), ("out_bytes", ob), ("weight_bytes", wb)):
        if not np.isfinite(a).all() or (a < 0).any():
            raise ValueError(f"{name} must be finite and non-negative")
    bw = float(problem.link_bw_bytes_per_s)
    if not bw > 0:
        raise ValueError(f"link_bw_bytes_per_s is {bw}, must be > 0")
    return C, src, dst, t, ob, wb, bw, float(problem.sram_bytes)


def chip_latencies(problem: Any, partition) -> np.ndarray:
    """``L_d = compute_d + link_d`` of every chip under the shared cost model (no validity check)."""
    C, src, dst, t, ob, _, bw, _ = _arrays(problem)
    f = np.asarray(partition, dtype=np.int64)
    comp = np.bincount(f, weights=t, minlength=C)[:C]
    m = f.copy()
    np.maximum.at(m, src, f[dst])
    diff = np.zeros(C + 1)
    np.add.at(diff, f, ob)
    np.add.at(diff, m, -ob)
    link = np.cumsum(diff)[:C]
    return comp + link / bw


def _weakly_connected(n: int, pairs: list[tuple[int, int]]) -> bool:
    parent = list(range(n))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in pairs:
        parent[find(a)] = find(b)
    return len({find(a) for a in range(n)}) <= 1


def solve_exact(problem: Any, time_limit_s: float = 60.0, num_workers: int = 8, hint=None) -> ExactResult:
    """Minimise the max chip latency under Eqs. 2–4 and the conservative memory bound (module doc).

    ``problem`` has ``num_chips, src, dst, time_s, out_bytes, weight_bytes, link_bw_bytes_per_s,
    sram_bytes``. ``hint`` is an optional partition (length N) given to CP-SAT as a solution hint.
    """
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    C, src, dst, t, ob, wb, bw, sram = _arrays(problem)
    n = t.size
    if hint is not None:
        hint = np.asarray(hint)
        if hint.shape != (n,):
            raise ValueError(f"hint must have shape ({n},), got {hint.shape}")
    if n == 0:
        return ExactResult(np.zeros(0, dtype=np.int64), 0.0, math.inf, "optimal", 0.0, 0.0,
                           time.perf_counter() - t0)
    Ce = min(C, n)
    pairs = sorted({(a, b) for a, b in zip(src.tolist(), dst.tolist()) if a != b})
    succs: list[list[int]] = [[] for _ in range(n)]
    for a, b in pairs:
        succs[a].append(b)

    ub = float(t.sum() + ob.sum() / bw)
    tick = ub / TICKS if ub > 0 else 1.0
    ti = np.rint(t / tick).astype(np.int64).tolist()
    bi = np.rint(ob / bw / tick).astype(np.int64).tolist()
    mem = np.ceil(wb + ob).astype(np.int64).tolist()  # rounded up: the bound stays conservative
    obc = np.ceil(ob).astype(np.int64).tolist()

    md = cp_model.CpModel()
    x = [[md.new_bool_var(f"x{u}_{d}") for d in range(Ce)] for u in range(n)]
    y = [md.new_int_var(0, Ce - 1, f"y{u}") for u in range(n)]
    for u in range(n):
        md.add_exactly_one(x[u])
        md.add(y[u] == sum(d * x[u][d] for d in range(1, Ce)))
    for a, b in pairs:  # Eq. 2
        md.add(y[a] <= y[b])
    used = [md.new_bool_var(f"used{d}") for d in range(Ce)]  # Eq. 3
    for d in range(Ce):
        for u in range(n):
            md.add_implication(x[u][d], used[d])
        md.add_bool_or([x[u][d] for u in range(n)] + [~used[d]])
        if d + 1 < Ce:
            md.add_implication(used[d + 1], used[d])
    e: dict[tuple[int, int], Any] = {}  # Eq. 4
    r: dict[tuple[int, int], Any] = {}
    for a in range(Ce):
        for b in range(a + 1, Ce):
            e[a, b] = md.new_bool_var(f"e{a}_{b}")
            r[a, b] = md.new_bool_var(f"r{a}_{b}")
            md.add_implication(e[a, b], r[a, b])
    for u, v in pairs:
        for a in range(Ce):
            for b in range(a + 1, Ce):
                md.add_bool_or([~x[u][a], ~x[v][b], e[a, b]])
    for a in range(Ce):
        for k in range(a + 1, Ce):
            for b in range(k + 1, Ce):
                md.add_bool_or([~r[a, k], ~e[k, b], r[a, b]])
                md.add_bool_or([~e[a, b], ~r[a, k], ~r[k, b]])
    # cost model
    load: list[list[tuple[int, Any]]] = [[(ti[u], x[u][d]) for u in range(n) if ti[u]] for d in range(Ce)]
    links: list[list[tuple[int, Any]]] = [[] for _ in range(Ce)]
    for u in range(n):
        if not succs[u] or not bi[u]:
            continue
        for l in range(Ce - 1):
            g = md.new_bool_var(f"g{u}_{l}")
            for v in succs[u]:
                md.add(g >= sum(x[v][l + 1:]))
            z = md.new_bool_var(f"z{u}_{l}")
            md.add(z >= sum(x[u][:l + 1]) + g - 1)
            links[l].append((bi[u], z))
    if _weakly_connected(n, pairs):
        # with nodes on both sides of boundary l (chip l+1 used) some edge crosses it
        bmin = min((bi[u] for u in range(n) if succs[u]), default=0)
        for l in range(Ce - 1):
            if bmin and links[l]:
                md.add(sum(c * v for c, v in links[l]) >= bmin * used[l + 1])
    for d in range(Ce):
        load[d] += links[d]
    hi = int(sum(ti) + sum(bi))
    M = md.new_int_var(0, hi, "M")
    for d in range(Ce):
        if load[d]:
            md.add(M >= sum(c * v for c, v in load[d]))
    cap = int(math.floor(sram))
    for d in range(Ce):  # memory: sufficient condition for H
        terms = [(mem[u], x[u][d]) for u in range(n) if mem[u]]
        for u in range(n):
            if succs[u] and obc[u] > 0:
                rc = md.new_bool_var(f"rcv{u}_{d}")
                for v in succs[u]:
                    md.add_bool_or([~x[v][d], x[u][d], rc])
                terms.append((obc[u], rc))
        md.add(sum(c * v for c, v in terms) <= cap)
    md.minimize(M)
    if hint is not None:
        for u in range(n):
            hu = int(hint[u])
            md.add_hint(y[u], min(max(hu, 0), Ce - 1))
            for d in range(Ce):
                md.add_hint(x[u][d], d == hu)

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(float(time_limit_s), 1e-3)
    prm.num_workers = int(num_workers)
    prm.random_seed = 0
    st = solver.solve(md)
    wall = time.perf_counter() - t0
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        status = "infeasible" if st == cp_model.INFEASIBLE else "unknown"
        return ExactResult(None, math.inf, 0.0, status, math.nan, math.nan, wall)
    part = np.array([solver.value(y[u]) for u in range(n)], dtype=np.int64)
    lat = float(chip_latencies(problem, part).max())
    err = 0.5 * n * tick  # rounding of the scaled coefficients, per chip
    bound = max(0.0, float(solver.best_objective_bound) * tick - err)
    if st == cp_model.OPTIMAL:
        bound = min(bound, lat)
    gap = (lat - bound) / lat if lat > 0 else 0.0
    thr = 1.0 / lat if lat > 0 else math.inf
    return ExactResult(part, lat, thr, "optimal" if st == cp_model.OPTIMAL else "feasible", bound,
                       max(gap, 0.0), wall)
