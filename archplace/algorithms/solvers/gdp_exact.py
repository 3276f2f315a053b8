"""Exact placement *and* schedule of minimum step time for small operator graphs (GDP, issue 18).

Why: the GDP bench reports, for heuristic and learned placements, the "gap to the CP-SAT optimum on the
small graphs". This module is that yardstick: a CP-SAT model that chooses every op's GPU and the order of
every op and transfer together, for graphs of at most 40 ops on 2-4 GPUs (larger graphs are refused;
``max_nodes`` overrides the op limit for experiments). It returns the best placement found, CP-SAT's lower
bound on the step time of *every* placement and schedule, and the gap between them. On 2 cores (workers=2,
30 s) random DAGs with transfers comparable to compute (P100-PCIe-like link) prove optimal at 20 ops on 2
and 4 GPUs in about a second and at 30 ops on 4 GPUs in 2-15 s; 30 ops on 2 GPUs keep a gap of ~3 % and
40 ops one of 9-18 %: the LP bound sees the compute load per device but little of the communication.

What is modelled -- the rules of ``simulators/gpu_placement.py`` (its module doc) except its greedy dispatch:

* every op on exactly one device, ops of one device never overlap (``NoOverlap`` of optional intervals per
  device), each lasting ``compute_s``; a co-location group shares one device;
* for every op ``u`` and device ``f`` that holds a consumer of ``u`` while ``u`` is elsewhere, ONE transfer
  of ``u``'s output to ``f`` (an optional interval present iff so) lasting ``link_latency_s + bytes /
  link_bytes_per_s`` with ``bytes`` = the largest edge from ``u`` to an op on ``f``; it starts after ``u``
  ends and every consumer on ``f`` starts after it ends (consumers on ``u``'s device after ``u`` ends);
* link contention: ``pcie`` -- a transfer occupies the sender's send port and the receiver's receive port
  (``NoOverlap`` per port), ``nvlink`` -- the directed pair's link (``NoOverlap`` per directed pair);
* memory: the resident bytes of the ops on a device fit ``memory_bytes`` (``memory=False`` drops this);
* objective: the makespan (the last op's end), i.e. the step time. Redundant constraints for the bound:
  at most ``num_devices`` ops run at once (cumulative), and the makespan is at least every device's load.

What is not modelled: the simulator's *activation* memory over time (outputs live from an op's start to
its last consumer or transfer, received copies from their transfer's start). The model therefore may
return a placement that the simulator finds out of memory; the solution is always re-checked with
:func:`simulate` and then reported with ``valid=False`` and the simulator's ``reason`` -- there is no
fallback to another placement. The simulator's dispatch is greedy (an idle device starts its ready op of
lowest ``priority``, transfers go in finish order), so for the returned placement the simulator's step
time is at least the best schedule of that placement and can exceed the model's; the model's optimum is
over all schedules the rules allow. Devices are identical (one memory size, symmetric links), so devices
are numbered in order of first use along a topological order (symmetry breaking; a ``hint`` is relabelled
the same way).

Time is integer ticks. One tick is a power of ten seconds, at most ``RESOLUTION * LB0 / (2n)`` where
``LB0 = max(critical path of compute, total compute / num_devices)`` is a lower bound on any step time,
e.g. 1e-8 s for a 40-op graph with a 1 ms critical path. Durations are rounded DOWN to whole ticks, and
that is the direction that makes CP-SAT's bound valid: flooring the start times of any real schedule gives
a schedule of the floored durations (``floor(a + b) >= floor(a) + floor(b)`` keeps every precedence and
every no-overlap), so the model's optimum (and any bound on it) is at most the real optimum. Rounding up
would instead make the model's schedules realisable and its optimum an *upper* bound. Conversely, the
model's schedule, re-timed with the real durations in the model's orders (``schedule_step_time_s``), ends
at most one tick per op and per transfer on its critical chain later -- at most ``(2n - 1)`` ticks, i.e.
below ``RESOLUTION`` (0.1 %) of the step time (unless transfers are so long against the compute that
the horizon -- all compute and every possible transfer back to back -- would exceed ``MAX_TICKS``; the
tick is then coarsened, and ``tick_s`` says by how much). So, up to floating-point rounding of the division:

    lower_bound_s <= best real step time (resident memory only) <= schedule_step_time_s
    model_step_time_s <= schedule_step_time_s <= model_step_time_s + (2n - 1) * tick_s

and when the status is OPTIMAL also ``model_step_time_s <= simulated_step_time_s`` (a FEASIBLE schedule
need not beat the simulator's greedy one). Resident bytes are scaled to units of ``2**k`` bytes (1 unless
the capacity exceeds ``2**31`` bytes): per-op bytes rounded up, the capacity down, so every placement the
model accepts fits, and exactly so when the byte counts are multiples of the unit (they are for fp32
weights). No Ray import here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ...simulators.gpu_placement import PlacementProblem, simulate
from ...workloads.graph import kahn_order

__all__ = ["ExactResult", "MAX_NODES", "DEVICES", "RESOLUTION", "exact_placement", "tick_seconds"]

MAX_NODES = 40  # ops: beyond this CP-SAT rarely closes the gap in minutes
DEVICES = (2, 3, 4)  # allowed num_devices
RESOLUTION = 1e-3  # bound on the relative rounding error of the tick scale (module doc)
MEM_UNITS = 2**31  # the memory capacity spans at most this many units
MAX_TICKS = 2**36  # the horizon spans at most this many ticks (CP-SAT is unreliable near 1e12)


@dataclass
class ExactResult:
    """Best placement CP-SAT found (``None`` when it found none) and what it is worth.

    ``model_step_time_s`` is CP-SAT's makespan in seconds (tick durations), ``schedule_step_time_s`` the
    same orders re-timed with the real durations (``start_s`` per op), ``simulated_step_time_s`` the
    simulator's step time of the placement; ``lower_bound_s`` bounds the step time of every placement that
    fits the resident memory; ``gap = (model - bound) / model``; ``valid``/``reason`` are the simulator's."""

    placement: np.ndarray | None
    model_step_time_s: float
    simulated_step_time_s: float
    lower_bound_s: float
    status: str  # "OPTIMAL" | "FEASIBLE" | "INFEASIBLE" | "UNKNOWN" | "MODEL_INVALID"
    gap: float
    wall_s: float
    valid: bool
    reason: str
    schedule_step_time_s: float = math.nan
    start_s: np.ndarray | None = None
    tick_s: float = math.nan


# ---------------------------------------------------------------------------------------------- instance
def _topo_rank(n: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Rank of every op in a topological order (Kahn, smallest index first); raises on a cycle."""
    order, stuck = kahn_order(n, src, dst)
    if stuck >= 0:
        raise ValueError("the graph has a cycle: it has no schedule")
    rank = np.full(n, -1, np.int64)
    rank[order] = np.arange(n)
    return rank


def _consumers(problem: PlacementProblem) -> list[dict[int, float]]:
    """Per op: consumer -> largest edge bytes to it (duplicate edges merged)."""
    cons: list[dict[int, float]] = [{} for _ in range(problem.num_nodes)]
    for a, b, nb in zip(problem.src.tolist(), problem.dst.tolist(), problem.edge_bytes.tolist()):
        cons[a][b] = max(cons[a].get(b, 0.0), nb)
    return cons


def tick_seconds(problem: PlacementProblem) -> float:
    """The tick (a power of ten seconds) of :func:`exact_placement` for ``problem`` (module doc)."""
    n, D = problem.num_nodes, problem.num_devices
    comp = problem.compute_s
    cons = _consumers(problem)
    lb0 = 0.0
    if n:
        rank = _topo_rank(n, problem.src, problem.dst)
        finish = comp.copy()
        for u in np.argsort(rank):
            for w in cons[u]:
                finish[w] = max(finish[w], finish[u] + comp[w])
        lb0 = max(float(finish.max()), float(comp.sum()) / D)
    big = max(problem.edge_bytes, default=0.0)
    if lb0 <= 0:  # no compute: transfers set the scale
        lb0 = problem.link_latency_s + big / problem.link_bytes_per_s
    if lb0 <= 0:
        return 1e-6
    tick = 10.0 ** math.floor(math.log10(RESOLUTION * lb0 / (2 * n)))
    # every activity back to back (the horizon) must stay below MAX_TICKS
    total = float(comp.sum()) + (D - 1) * sum(
        problem.link_latency_s + max(c.values()) / problem.link_bytes_per_s for c in cons if c)
    if total / tick > MAX_TICKS:
        tick = 10.0 ** math.ceil(math.log10(total / MAX_TICKS))
    return tick


def _in_edges(cons: list[dict[int, float]]) -> list[list[int]]:
    """Per op: its producers."""
    inn: list[list[int]] = [[] for _ in range(len(cons))]
    for a, d in enumerate(cons):
        for b in d:
            inn[b].append(a)
    return inn


def _earliest(P, cons, rank, op_dur, x_dur, pcie, op_key=None, x_key=None):
    """Earliest-start schedule of placement ``P`` with every device's ops and every channel's transfers
    in the order of their keys (default: topological rank, ``u``'s transfers right after ``u``).

    ``x_dur(u, f)`` is the duration of ``u``'s transfer to ``f``. Keys must increase along precedences
    (true for the default and for ``(model start, default key)``), so one pass in key order suffices.
    Returns op starts, op ends, {(u, f): (start, end)} and the makespan."""
    n = len(P)
    inn = _in_edges(cons)
    acts = []
    for u in range(n):
        acts.append(((op_key[u] if op_key is not None else ()) + (2 * rank[u],), 0, u, -1))
        for f in sorted({int(P[w]) for w in cons[u]} - {int(P[u])}):
            acts.append(((x_key[(u, f)] if x_key is not None else ()) + (2 * rank[u] + 1,), 1, u, f))
    acts.sort()
    zero = 0 * op_dur[0]
    start: list = [None] * n
    end: list = [None] * n
    xfer: dict[tuple[int, int], tuple] = {}
    free: dict[tuple, object] = {}
    for _, typ, u, f in acts:
        e = int(P[u])
        if typ == 0:
            ready = [end[a] if int(P[a]) == e else xfer.get((a, e), (None, None))[1] for a in inn[u]]
            if any(r is None for r in ready):
                raise AssertionError("schedule keys do not follow the precedences")
            t = max([free.get(("dev", e), zero)] + ready)
            start[u], end[u] = t, t + op_dur[u]
            free[("dev", e)] = end[u]
        else:
            chans = [("send", e), ("recv", f)] if pcie else [("pair", e, f)]
            if end[u] is None:
                raise AssertionError("schedule keys do not follow the precedences")
            t = max([end[u]] + [free.get(c, zero) for c in chans])
            xfer[(u, f)] = (t, t + x_dur(u, f))
            for c in chans:
                free[c] = xfer[(u, f)][1]
    return start, end, xfer, max(end)


def _first_use_labels(placement: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Relabel devices in order of first use along ``order`` (the model's symmetry breaking)."""
    lab: dict[int, int] = {}
    for u in order:
        lab.setdefault(int(placement[u]), len(lab))
    for d in range(int(placement.max()) + 1 if len(placement) else 0):
        lab.setdefault(d, len(lab))
    return np.array([lab[int(d)] for d in placement], np.int64)


# ---------------------------------------------------------------------------------------------- model
def exact_placement(problem: PlacementProblem, *, time_limit_s: float = 30.0, workers: int = 2, seed: int = 0,
                    hint=None, memory: bool = True, max_nodes: int = MAX_NODES,
                    symmetry_breaking: bool = True) -> ExactResult:
    """Minimise the step time over placements and schedules with CP-SAT (module doc).

    ``hint``: a placement (length ``num_nodes``) handed to CP-SAT as a complete starting solution (with its
    topological-order schedule). ``memory=False`` drops the resident-memory constraint. Raises
    ``ValueError`` for more than ``max_nodes`` ops or ``num_devices`` outside 2..4."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    n, D = problem.num_nodes, int(problem.num_devices)
    if n > max_nodes:
        raise ValueError(f"num_nodes is {n}; exact_placement solves at most {max_nodes} ops "
                         f"(max_nodes={max_nodes}; pass a larger max_nodes to try anyway)")
    if D not in DEVICES:
        raise ValueError(f"num_devices is {D}; exact_placement allows {DEVICES[0]}..{DEVICES[-1]}")
    if hint is not None:
        hint = np.asarray(hint, np.int64)
        if hint.shape != (n,):
            raise ValueError(f"hint has shape {hint.shape}, expected ({n},)")
        if n and (hint.min() < 0 or hint.max() >= D):
            bad = int(hint[(hint < 0) | (hint >= D)][0])
            raise ValueError(f"hint holds device {bad}, allowed 0..{D - 1}")
    if n == 0:
        return ExactResult(np.zeros(0, np.int64), 0.0, 0.0, 0.0, "OPTIMAL", 0.0, time.perf_counter() - t0,
                           True, "", 0.0, np.zeros(0), 1e-6)

    rank = _topo_rank(n, problem.src, problem.dst)
    order = np.argsort(rank)
    cons = _consumers(problem)
    pcie = problem.interconnect == "pcie"
    tick = tick_seconds(problem)
    lat, bw = float(problem.link_latency_s), float(problem.link_bytes_per_s)
    op_real = problem.compute_s.astype(np.float64)
    op_t = np.floor(op_real / tick).astype(np.int64)
    edge_t = [{w: int(math.floor((lat + b / bw) / tick)) for w, b in cons[u].items()} for u in range(n)]
    x_max = [max(et.values(), default=0) for et in edge_t]
    horizon = int(op_t.sum() + (D - 1) * sum(x_max)) + 1

    md = cp_model.CpModel()
    x = [[md.new_bool_var(f"x{u}_{d}") for d in range(D)] for u in range(n)]
    s = [md.new_int_var(0, horizon - int(op_t[u]), f"s{u}") for u in range(n)]
    dev_iv: list[list] = [[] for _ in range(D)]
    all_iv = []
    for u in range(n):
        md.add_exactly_one(x[u])
        for d in range(D):
            dev_iv[d].append(md.new_optional_fixed_size_interval_var(s[u], int(op_t[u]), x[u][d],
                                                                     f"o{u}_{d}"))
        all_iv.append(md.new_fixed_size_interval_var(s[u], int(op_t[u]), f"o{u}"))
    for d in range(D):
        md.add_no_overlap(dev_iv[d])
    md.add_cumulative(all_iv, [1] * n, D)  # redundant: at most D ops at a time
    for u in range(n):
        for w in cons[u]:
            md.add(s[w] >= s[u] + int(op_t[u]))
    g = problem.coloc_group
    for gid in np.unique(g[g >= 0]):
        members = np.flatnonzero(g == gid).tolist()
        for a, b in zip(members[:-1], members[1:]):
            for d in range(D):
                md.add(x[a][d] == x[b][d])

    # transfers: (u, f) present iff a consumer of u is on f and u is not
    send_iv: list[list] = [[] for _ in range(D)]
    recv_iv: list[list] = [[] for _ in range(D)]
    pair_iv: dict[tuple[int, int], list] = {(e, f): [] for e in range(D) for f in range(D) if e != f}
    xv: dict[tuple[int, int], tuple] = {}  # (u, f) -> (present, start, size, end, {e: q})
    for u in range(n):
        if not cons[u]:
            continue
        lo, hi = min(edge_t[u].values()), x_max[u]
        for f in range(D):
            p = md.new_bool_var(f"p{u}_{f}")
            xs = md.new_int_var(0, horizon, f"xs{u}_{f}")
            sz = md.new_int_var(lo, hi, f"xz{u}_{f}")
            xe = md.new_int_var(0, horizon, f"xe{u}_{f}")
            md.add_implication(p, ~x[u][f])
            md.add_bool_or([~p] + [x[w][f] for w in cons[u]])
            for w, dt in edge_t[u].items():
                md.add_bool_or([~x[w][f], x[u][f], p])
                if dt > lo:
                    md.add(sz >= dt).only_enforce_if([x[w][f], p])
                md.add(s[w] >= xe).only_enforce_if([x[w][f], ~x[u][f]])
            md.add(xs >= s[u] + int(op_t[u])).only_enforce_if(p)
            if pcie:
                recv_iv[f].append(md.new_optional_interval_var(xs, sz, xe, p, f"r{u}_{f}"))
            qs = {}
            for e in range(D):
                if e == f:
                    continue
                q = md.new_bool_var(f"q{u}_{e}_{f}")
                md.add_implication(q, x[u][e])
                md.add_implication(q, p)
                md.add_bool_or([~x[u][e], ~p, q])
                iv = md.new_optional_interval_var(xs, sz, xe, q, f"t{u}_{e}_{f}")
                (send_iv[e] if pcie else pair_iv[(e, f)]).append(iv)
                qs[e] = q
            xv[(u, f)] = (p, xs, sz, xe, qs)
    for ivs in (send_iv + recv_iv) if pcie else list(pair_iv.values()):
        if len(ivs) > 1:
            md.add_no_overlap(ivs)

    # memory: resident bytes per device, in units of 2**k bytes (items up, capacity down)
    cap = float(problem.memory_bytes)
    res = problem.resident_bytes
    if memory and math.isfinite(cap) and (res > 0).any():
        unit = 2.0 ** max(0, math.ceil(math.log2(max(cap, 1.0) / MEM_UNITS)))
        res_u = np.ceil(res / unit).astype(np.int64).tolist()
        cap_u = int(math.floor(cap / unit))
        for d in range(D):
            md.add(sum(r * x[u][d] for u, r in enumerate(res_u) if r) <= cap_u)

    if symmetry_breaking:  # device d is used only after device d-1, along the topological order
        for k, u in enumerate(order.tolist()):
            for d in range(1, D):
                md.add_bool_or([~x[u][d]] + [x[v][d - 1] for v in order[:k].tolist()])

    mk = md.new_int_var(0, horizon, "makespan")
    for u in range(n):
        if not cons[u]:
            md.add(mk >= s[u] + int(op_t[u]))
    for d in range(D):  # redundant: a device's busy time (lifts the LP bound to total compute / D)
        md.add(mk >= sum(int(op_t[u]) * x[u][d] for u in range(n) if op_t[u]))
    md.minimize(mk)

    if hint is not None:
        hp = _first_use_labels(hint, order) if symmetry_breaking else hint
        xdur = {(u, f): max(dt for w, dt in edge_t[u].items() if hp[w] == f) for u in range(n)
                for f in {int(hp[w]) for w in cons[u]}}
        hs, he, hx, hm = _earliest(hp, cons, rank, op_t.tolist(), lambda u, f: xdur[(u, f)], pcie)
        for u in range(n):
            md.add_hint(s[u], int(hs[u]))
            for d in range(D):
                md.add_hint(x[u][d], int(hp[u]) == d)
        for (u, f), (p, xs, sz, xe, qs) in xv.items():
            on = (u, f) in hx
            md.add_hint(p, on)
            a, b = hx[(u, f)] if on else (0, min(edge_t[u].values()))  # absent: any consistent values
            md.add_hint(xs, int(a))
            md.add_hint(sz, int(b - a))
            md.add_hint(xe, int(b))
            for e, q in qs.items():
                md.add_hint(q, on and int(hp[u]) == e)
        md.add_hint(mk, int(hm))

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(float(time_limit_s), 1e-3)
    prm.num_workers = int(workers)
    prm.random_seed = int(seed)
    st = solver.solve(md)
    status = solver.status_name(st)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        why = "the constraints admit no placement (resident memory or co-location)" \
            if st == cp_model.INFEASIBLE else "no placement found within the time limit"
        bound = solver.best_objective_bound * tick if st == cp_model.UNKNOWN else math.nan
        return ExactResult(None, math.nan, math.nan, float(bound), status, math.nan,
                           time.perf_counter() - t0, False, f"CP-SAT {status}: {why}", tick_s=tick)

    P = np.array([next(d for d in range(D) if solver.boolean_value(x[u][d])) for u in range(n)], np.int64)
    obj = int(solver.value(mk))
    bound = obj if st == cp_model.OPTIMAL else int(math.ceil(solver.best_objective_bound - 1e-9))
    # re-time the model's orders with the real durations
    op_key = {u: (int(solver.value(s[u])),) for u in range(n)}
    x_key = {(u, f): (int(solver.value(xv[(u, f)][1])),) for (u, f) in xv
             if solver.boolean_value(xv[(u, f)][0])}

    def x_real(u: int, f: int) -> float:
        return lat + max(b for w, b in cons[u].items() if P[w] == f) / bw

    rs, _, _, rmk = _earliest(P, cons, rank, op_real.tolist(), x_real, pcie, op_key, x_key)
    sim = simulate(problem, P)
    model_s, bound_s = obj * tick, bound * tick
    return ExactResult(P, model_s, float(sim.step_time_s), bound_s, status,
                       (obj - bound) / obj if obj > 0 else 0.0, time.perf_counter() - t0, bool(sim.valid),
                       sim.reason, float(rmk), np.asarray(rs, np.float64), tick)
