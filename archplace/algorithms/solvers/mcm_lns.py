"""Large-neighbourhood search (LNS) for multi-chip-module partitioning: CP-SAT re-solves one neighbourhood
of a valid partition at a time, everything else fixed, and keeps the result when it is no worse.

Why: the constructive repair (``mcm_repair``) only ever produces *some* valid partition near a proposal;
it never optimises. The exact CP-SAT model (``mcm_exact``) optimises but does not scale past about 50
nodes on 8 chips. Re-solving small neighbourhoods exactly (a window of consecutive chips, or a subset of
nodes) with the rest fixed keeps each sub-problem small and lets the whole partition improve
monotonically from any sampler's best (greedy, Random, SA, PPO). This is archplace's addition; the MCM
paper has no improvement stage.

Sub-problem (:func:`solve_neighbourhood`). Given a valid partition ``f``, a set of *free* nodes and a chip
interval ``[lo_u, hi_u]`` per free node:

* ``x[u, d]`` for free ``u`` and ``d`` in its interval, exactly one per node; Eq. 2 between free nodes
  as ``y_u <= y_v``, against fixed neighbours by narrowing the intervals;
* Eq. 3: ``used_d`` is 1 on chips holding a fixed node, a variable on chips some free node may take,
  0 elsewhere; ``used_{d+1} => used_d``;
* Eq. 4 exactly over the *whole* chip graph (the model of ``mcm_exact``: chip-pair booleans ``e[a, b]``
  implied by the edges, fixed ones set, reachability ``r`` implied by ``e``, and ``not (e[a, b] and
  r[a, k] and r[k, b])``); only the implying direction is needed;
* cost (the shared analytical model, in integer ticks as in ``mcm_exact``): every chip's compute and
  link load split into a constant part (fixed nodes whose output span cannot change) and variable terms.
  A node's contribution to link ``l`` is variable only when its own chip or its farthest successor's
  chip may fall on either side of ``l``; those get ``z[u, l] >= [y_u <= l] + g[u, l] - 1`` with
  ``g[u, l]`` implied by any successor beyond ``l`` (lower bounds suffice: the objective only grows);
* objective: minimise ``M >= L_d`` over the chips with a variable load, with ``M >=`` the largest
  constant chip load (so CP-SAT stops as soon as the neighbourhood cannot lower the global maximum).

The partition is the hint, so CP-SAT starts from a feasible solution and never returns a worse one for
the model. The memory constraint H enters the sub-model as a sound relaxation (issue 44): per chip, the
resident weights plus the largest ``op_live_bytes`` of its ops (an op's output and inputs, live at its
step on any partition) within SRAM, so sub-solves stop moving blocks onto a chip whose weights already
fill it, and no partition that fits is excluded. Every candidate is still re-scored by the simulator
(``evaluate``), which checks H exactly; a candidate that fails H or is worse is dropped.

Search (:func:`lns`): each step picks a neighbourhood through a *chooser* (default
:class:`BottleneckChooser`: a random window of 2–8 consecutive chips around the slowest chip, spare
chips above the top used chip when the window reaches it, sometimes the nodes of the slowest chip plus
random neighbours, and now and then a warm-started full solve when the model is small), re-solves it
within ``subsolve_s`` and accepts a candidate whose max chip latency is no worse (ties accepted: a
sideways move changes which windows can help next). The incumbent never gets worse, so the result is
never worse than the seed. No Ray here; the RL chooser lives in ``algorithms/rl/mcm_lns_env.py``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ...simulators.mcm import MCMProblem, evaluate, op_live_bytes
from .mcm_exact import TICKS, chip_latencies

__all__ = ["Neighbourhood", "SubSolve", "LNSResult", "BottleneckChooser", "solve_neighbourhood",
           "window", "node_subset", "bottleneck_nodes", "full", "restrict", "lns", "lower_bound_s",
           "SUBSOLVE_S"]

FULL_SOLVE_MAX_CELLS = 2500  # free nodes x chips for which the chooser may try a full solve
# CP-SAT wall seconds per sub-solve in the wall-clock mode, the same for greedy+LNS and PPO-LNS (issue 31:
# they had 2 s and 1 s); the budgeted comparisons use ``subsolve_det`` (deterministic time) instead
SUBSOLVE_S = 2.0


@dataclass(frozen=True)
class Neighbourhood:
    """Free nodes and, per free node, the chip interval it may take (inclusive). ``kind`` is "window",
    "nodes" or "full"; ``label`` says how it was chosen (for logs)."""

    kind: str
    free: np.ndarray  # [K] node ids
    lo: np.ndarray  # [K] lowest chip per free node
    hi: np.ndarray  # [K] highest chip per free node
    label: str = ""


@dataclass
class SubSolve:
    """One CP-SAT sub-solve: the candidate (``None`` when CP-SAT found nothing), CP-SAT's status name, the
    model's objective and bound in seconds (the max over the chips with a variable load, floored at the
    constant loads), and the wall time (model build + solve)."""

    partition: np.ndarray | None
    status: str
    objective_s: float
    bound_s: float
    wall_s: float
    free_nodes: int
    det_time: float = 0.0  # CP-SAT deterministic time used (load-independent work units)


@dataclass
class LNSResult:
    """Best partition found (never worse than the seed), its throughput and max chip latency, the seed's,
    counts, the best-so-far curve over wall time and sub-solves, and why it stopped ("time", "subsolves",
    "optimal": a full solve proved the optimum of the static model, "bound": the best reached
    :func:`lower_bound_s`)."""

    partition: np.ndarray
    throughput: float
    max_latency_s: float
    seed_throughput: float
    subsolves: int
    accepted: int
    improved: int
    rejected_memory: int
    wall_s: float
    stopped: str
    bound_s: float  # a lower bound on the max latency of any partition (lower_bound_s, or a full solve's)
    trace_t_s: np.ndarray  # wall time after each sub-solve
    trace_throughput: np.ndarray  # best throughput after each sub-solve
    kinds: dict[str, int] = field(default_factory=dict)  # sub-solves per neighbourhood kind
    det_time: float = 0.0  # CP-SAT deterministic time summed over the sub-solves
    trace_max_latency_s: np.ndarray | None = None  # best max chip latency after each sub-solve

    @property
    def gap(self) -> float:
        """``1 - bound / max latency``: how far the result may be from the optimum (0: proven optimal)."""
        return max(0.0, 1.0 - self.bound_s / self.max_latency_s) if self.max_latency_s > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {"lns_subsolves": self.subsolves, "lns_accepted": self.accepted, "lns_improved": self.improved,
                "lns_rejected_memory": self.rejected_memory, "lns_wall_s": self.wall_s,
                "lns_stopped": self.stopped, "lns_seed_throughput": self.seed_throughput,
                "lns_bound_s": self.bound_s, "lns_gap": self.gap, "lns_kinds": dict(self.kinds),
                "lns_det_time": self.det_time}


def lower_bound_s(problem: MCMProblem) -> float:
    """A lower bound on the max chip latency of every partition: the slowest single op, and the total
    compute spread evenly over all chips (communication only adds)."""
    t = problem.time_s
    return float(max(t.max(initial=0.0), t.sum() / problem.num_chips))


# ================================================================== neighbourhoods
def _top(f: np.ndarray) -> int:
    return int(f.max()) if f.size else 0


def window(problem: MCMProblem, f: np.ndarray, start: int, width: int, spare: int = 0,
           label: str = "") -> Neighbourhood:
    """The nodes on chips ``[start, start + width)``, free within that window; when the window reaches
    the top used chip, ``spare`` unused chips above it join (spare-chip injection)."""
    f = np.asarray(f)
    C, top = problem.num_chips, _top(f)
    a = max(0, int(start))
    b = min(top, a + max(1, int(width)) - 1)
    if b < a:
        a = b = top
    hi_chip = min(C - 1, top + max(0, int(spare))) if b == top else b
    free = np.flatnonzero((f >= a) & (f <= b))
    return Neighbourhood("window", free, np.full(free.size, a), np.full(free.size, hi_chip),
                         label or f"window {a}-{hi_chip}")


def _eq2_interval(problem: MCMProblem, f: np.ndarray, free_mask: np.ndarray, lo: int, hi: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Per node: [max chip of fixed preds, min chip of fixed succs] clipped to [lo, hi]."""
    n = problem.num_nodes
    lo_a = np.full(n, lo, dtype=np.int64)
    hi_a = np.full(n, hi, dtype=np.int64)
    s, d = problem.src, problem.dst
    fixed_src = ~free_mask[s]
    np.maximum.at(lo_a, d[fixed_src], f[s[fixed_src]])
    fixed_dst = ~free_mask[d]
    np.minimum.at(hi_a, s[fixed_dst], f[d[fixed_dst]])
    return lo_a, hi_a


def node_subset(problem: MCMProblem, f: np.ndarray, nodes, spare: int = 0, label: str = "") -> Neighbourhood:
    """The given nodes free, each within the chips its fixed neighbours allow (Eq. 2), up to ``spare``
    chips above the top used one."""
    f = np.asarray(f)
    free = np.unique(np.asarray(nodes, dtype=np.int64))
    mask = np.zeros(problem.num_nodes, dtype=bool)
    mask[free] = True
    hi_chip = min(problem.num_chips - 1, _top(f) + max(0, int(spare)))
    lo_a, hi_a = _eq2_interval(problem, f, mask, 0, hi_chip)
    return Neighbourhood("nodes", free, lo_a[free], hi_a[free], label or f"{free.size} nodes")


def bottleneck_nodes(problem: MCMProblem, f: np.ndarray, b: int, rng: np.random.Generator,
                     spare: int = 0) -> Neighbourhood:
    """The nodes of chip ``b`` plus as many random nodes (at least 4) of the chips within 2 of it."""
    on = np.flatnonzero(f == b)
    near = np.flatnonzero((np.abs(f - b) <= 2) & (f != b))
    k = min(near.size, max(on.size, 4))
    extra = rng.choice(near, size=k, replace=False) if k else near
    return node_subset(problem, f, np.concatenate([on, extra]), spare=spare, label=f"chip {b} + {k} nodes")


def full(problem: MCMProblem, f: np.ndarray, spare: int | None = None) -> Neighbourhood:
    """Every node free over ``[0, top + spare]`` (default: all chips): a warm-started exact solve."""
    n, C = problem.num_nodes, problem.num_chips
    hi_chip = C - 1 if spare is None else min(C - 1, _top(np.asarray(f)) + max(0, int(spare)))
    return Neighbourhood("full", np.arange(n), np.zeros(n, dtype=np.int64), np.full(n, hi_chip), "full")


def restrict(nb: Neighbourhood, f: np.ndarray, radius: int | None) -> Neighbourhood:
    """``nb`` with every free node's interval narrowed to ``radius`` chips either side of its chip in
    ``f`` (a per-node domain restriction; ``None``: unchanged). A narrower domain makes a wide window's
    model small enough for CP-SAT to finish it within a fixed deterministic time (module doc)."""
    if radius is None:
        return nb
    r = int(radius)
    if r < 0:
        raise ValueError(f"radius is {radius}, must be >= 0 or None")
    own = np.asarray(f)[nb.free]
    return Neighbourhood(nb.kind, nb.free, np.maximum(nb.lo, own - r), np.minimum(nb.hi, own + r),
                         f"{nb.label} r{r}")


# ================================================================== the sub-problem
def solve_neighbourhood(problem: MCMProblem, f, nb: Neighbourhood, time_limit_s: float = 2.0, seed: int = 0,
                        num_workers: int = 1, det_time: float | None = None) -> SubSolve:
    """Re-solve the free nodes of ``nb`` exactly (module doc), the rest of ``f`` fixed, hinted with ``f``.
    ``f`` must satisfy Eqs. 2–4; the returned partition does too (or is ``None``). ``det_time``: CP-SAT's
    ``max_deterministic_time`` (load-independent work units); with it and one worker the result depends
    only on the inputs and ``seed``, and ``time_limit_s`` is only a wall-clock safety limit."""
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    f = np.asarray(f, dtype=np.int64)
    n, C = problem.num_nodes, problem.num_chips
    if f.shape != (n,):
        raise ValueError(f"partition must have shape ({n},), got {f.shape}")
    free = np.asarray(nb.free, dtype=np.int64)
    mask = np.zeros(n, dtype=bool)
    mask[free] = True
    lo_a, hi_a = _eq2_interval(problem, f, mask, 0, C - 1)
    lo = np.maximum(lo_a[free], np.asarray(nb.lo, dtype=np.int64))
    hi = np.minimum(hi_a[free], np.asarray(nb.hi, dtype=np.int64))
    # the hint must stay inside the domains: a free node's own chip is always allowed
    lo = np.minimum(lo, f[free])
    hi = np.maximum(hi, f[free])
    if free.size == 0:
        L = float(chip_latencies(problem, f).max())
        return SubSolve(f.copy(), "EMPTY", L, L, time.perf_counter() - t0, 0)
    top = int(max(_top(f), hi.max()))
    K = top + 1  # chips in play
    t = problem.time_s
    ob = problem.out_bytes
    bw = float(problem.link_bw_bytes_per_s)
    ub = float(t.sum() + ob.sum() / bw)
    tick = ub / TICKS if ub > 0 else 1.0
    ti = np.rint(t / tick).astype(np.int64)
    bi = np.rint(ob / bw / tick).astype(np.int64)

    md = cp_model.CpModel()
    idx = {int(u): i for i, u in enumerate(free.tolist())}
    xs: dict[int, dict[int, Any]] = {}
    ys: dict[int, Any] = {}
    for i, u in enumerate(free.tolist()):
        xs[u] = {d: md.new_bool_var(f"x{u}_{d}") for d in range(int(lo[i]), int(hi[i]) + 1)}
        md.add_exactly_one(xs[u].values())
        ys[u] = md.new_int_var(int(lo[i]), int(hi[i]), f"y{u}")
        md.add(ys[u] == sum(d * v for d, v in xs[u].items()))
    src, dst = problem.src.tolist(), problem.dst.tolist()
    succs: list[list[int]] = [[] for _ in range(n)]
    for a, b in zip(src, dst):
        if a != b:
            succs[a].append(b)
    for a, b in zip(src, dst):  # Eq. 2 between free nodes
        if a != b and a in idx and b in idx:
            md.add(ys[a] <= ys[b])

    def at(u: int, d: int):
        """Literal (or constant bool) for "u on chip d"."""
        if u in xs:
            return xs[u].get(d, False)
        return bool(f[u] == d)

    # Eq. 3
    fixed_cnt = np.bincount(f[~mask], minlength=K)[:K]
    free_on: list[list[Any]] = [[] for _ in range(K)]
    for row in xs.values():
        for d, v in row.items():
            free_on[d].append(v)
    used: list[Any] = []
    for d in range(K):
        if fixed_cnt[d] > 0:
            used.append(True)
        elif free_on[d]:
            ud = md.new_bool_var(f"used{d}")
            for v in free_on[d]:
                md.add_implication(v, ud)
            md.add_bool_or(free_on[d] + [ud.Not()])
            used.append(ud)
        else:
            used.append(False)
    for d in range(K - 1):
        hi_u, lo_u = used[d + 1], used[d]
        if hi_u is False or lo_u is True:
            continue
        if hi_u is True and lo_u is False:
            return SubSolve(None, "INFEASIBLE", math.inf, math.inf, time.perf_counter() - t0, free.size)
        if hi_u is True:
            md.add(lo_u == 1)
        elif lo_u is False:
            md.add(hi_u == 0)
        else:
            md.add_implication(hi_u, lo_u)

    # Eq. 4 over the whole chip graph
    e: dict[tuple[int, int], Any] = {}

    def edge_var(a: int, b: int):
        v = e.get((a, b))
        if v is None:
            v = e[a, b] = md.new_bool_var(f"e{a}_{b}")
        return v

    for u, v in zip(src, dst):
        if u == v:
            continue
        fu, fv = u not in xs, v not in xs
        if fu and fv:
            if f[u] < f[v]:
                md.add(edge_var(int(f[u]), int(f[v])) == 1)
            continue
        du = {int(f[u]): True} if fu else xs[u]
        dv = {int(f[v]): True} if fv else xs[v]
        for a, la in du.items():
            for b, lb in dv.items():
                if a < b:
                    lits = [x.Not() for x in (la, lb) if x is not True] + [edge_var(a, b)]
                    md.add_bool_or(lits)
    r: dict[tuple[int, int], Any] = {}
    for a in range(K):
        for b in range(a + 1, K):
            r[a, b] = md.new_bool_var(f"r{a}_{b}")
    for (a, b), v in e.items():
        md.add_implication(v, r[a, b])
    ein: list[list[int]] = [[] for _ in range(K)]
    for a, b in e:
        ein[b].append(a)
    for b in range(K):
        for k in ein[b]:
            for a in range(k):
                md.add_bool_or([r[a, k].Not(), e[k, b].Not(), r[a, b]])
    for (a, b), v in e.items():
        for k in range(a + 1, b):
            md.add_bool_or([v.Not(), r[a, k].Not(), r[k, b].Not()])

    # memory (issue 44): a sound relaxation of H, so no partition that fits is cut off. Every chip's
    # resident weights (rounded down) plus the activations live at the step of its op with the most
    # (op_live_bytes: its output and inputs) stay within SRAM; the simulator still checks H exactly.
    # The hint f fits, so it meets this too. Only chips where it can bind get it (weights and the largest
    # live footprint of every op that may go there over SRAM), so a problem whose memory is loose gets
    # the same model, and the same answers, as before.
    wf = np.floor(problem.weight_bytes).astype(np.int64)
    lv = op_live_bytes(problem).astype(np.int64)
    cap = int(math.floor(problem.sram_bytes))
    fixed_w = np.bincount(f[~mask], weights=wf[~mask], minlength=K)[:K].astype(np.int64)
    fixed_live = np.zeros(K, dtype=np.int64)
    np.maximum.at(fixed_live, f[~mask], lv[~mask])
    for d in range(K):
        cand = [(u, row[d]) for u, row in xs.items() if d in row]
        if not cand:
            continue
        top_live = max(int(fixed_live[d]), max(int(lv[u]) for u, _ in cand))
        if int(fixed_w[d]) + sum(int(wf[u]) for u, _ in cand) + top_live <= cap:
            continue  # cannot bind
        load = int(fixed_w[d]) + sum(int(wf[u]) * v for u, v in cand if wf[u])
        live = md.new_int_var(int(fixed_live[d]), top_live, f"live{d}")
        for u, v in cand:
            if lv[u] > fixed_live[d]:
                md.add(live >= int(lv[u])).only_enforce_if(v)
        md.add(load + live <= cap)

    # cost: constant and variable parts of every chip's load (ticks)
    const = np.zeros(K, dtype=np.int64)
    terms: list[list[tuple[int, Any]]] = [[] for _ in range(K)]
    fixed_nodes = np.flatnonzero(~mask)
    const += np.bincount(f[fixed_nodes], weights=ti[fixed_nodes], minlength=K)[:K].astype(np.int64)
    for u, row in xs.items():
        if ti[u]:
            for d, v in row.items():
                terms[d].append((int(ti[u]), v))
    for u in range(n):
        if not succs[u] or not bi[u]:
            continue
        su = succs[u]
        if u not in xs and not any(v in xs for v in su):  # untouched: its span is fixed
            m = max(int(f[u]), max(int(f[v]) for v in su))
            const[int(f[u]):m] += bi[u]
            continue
        fl, fh = (int(f[u]), int(f[u])) if u not in xs else (min(xs[u]), max(xs[u]))
        s_lo = max((int(f[v]) if v not in xs else min(xs[v])) for v in su)
        s_hi = max((int(f[v]) if v not in xs else max(xs[v])) for v in su)
        for lnk in range(fl, min(s_hi, K - 1)):
            own_sure = fh <= lnk  # y_u <= l for sure
            succ_sure = s_lo > lnk  # some successor beyond l for sure
            if own_sure and succ_sure:
                const[lnk] += bi[u]
                continue
            if own_sure:
                own = None
            else:
                own = [xs[u][d] for d in xs[u] if d <= lnk]
            if succ_sure:
                g = None
            else:
                g = md.new_bool_var(f"g{u}_{lnk}")
                for v in su:
                    if v in xs:
                        beyond = [xs[v][d] for d in xs[v] if d > lnk]
                        if beyond:
                            md.add(g >= sum(beyond))
            z = md.new_bool_var(f"z{u}_{lnk}")
            if own is None:
                md.add(z >= g)
            elif g is None:
                md.add(z >= sum(own))
            else:
                md.add(z >= sum(own) + g - 1)
            terms[lnk].append((int(bi[u]), z))
    var_chips = [d for d in range(K) if terms[d]]
    out_const = int(max((const[d] for d in range(K) if not terms[d]), default=0))
    hi_m = int(const.sum() + sum(c for row in terms for c, _ in row))
    M = md.new_int_var(out_const, max(hi_m, out_const), "M")
    for d in var_chips:
        md.add(M >= int(const[d]) + sum(c * v for c, v in terms[d]))
    md.minimize(M)
    for u, row in xs.items():
        md.add_hint(ys[u], int(f[u]))
        for d, v in row.items():
            md.add_hint(v, d == f[u])

    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(float(time_limit_s), 1e-3)
    if det_time is not None:
        if not det_time > 0:
            raise ValueError(f"det_time is {det_time}, must be > 0")
        prm.max_deterministic_time = float(det_time)
    prm.num_workers = int(num_workers)
    prm.random_seed = int(seed) % (2**31)
    st = solver.solve(md)
    wall = time.perf_counter() - t0
    name = solver.status_name(st)
    dt = float(solver.deterministic_time)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SubSolve(None, name, math.inf, math.inf, wall, free.size, dt)
    g_new = f.copy()
    for u in xs:
        g_new[u] = int(solver.value(ys[u]))
    return SubSolve(g_new, name, float(solver.objective_value) * tick,
                    float(solver.best_objective_bound) * tick, wall, free.size, dt)


# ================================================================== choosers and the loop
class Chooser(Protocol):
    def __call__(self, problem: MCMProblem, f: np.ndarray, latency_s: np.ndarray,
                 rng: np.random.Generator) -> Neighbourhood: ...


class BottleneckChooser:
    """The non-learned neighbourhood rule: windows of ``widths`` consecutive chips that contain the slowest
    chip (start uniform among those), ``spare`` extra chips drawn from 0..``max_spare`` when the window
    reaches the top used chip; with probability ``p_nodes`` the nodes of the slowest chip plus as many
    random nodes of the neighbouring chips; with probability ``p_full`` a full solve when
    ``free nodes x chips <= FULL_SOLVE_MAX_CELLS``."""

    def __init__(self, widths=(2, 3, 4, 5, 6, 8), max_spare: int = 2, p_nodes: float = 0.15,
                 p_full: float = 0.05):
        self.widths = tuple(int(w) for w in widths)
        self.max_spare = int(max_spare)
        self.p_nodes = float(p_nodes)
        self.p_full = float(p_full)

    def __call__(self, problem: MCMProblem, f: np.ndarray, latency_s: np.ndarray,
                 rng: np.random.Generator) -> Neighbourhood:
        top = _top(f)
        b = int(np.argmax(latency_s[:top + 1]))
        r = rng.random()
        if r < self.p_full and problem.num_nodes * min(problem.num_chips, top + 1 + self.max_spare) \
                <= FULL_SOLVE_MAX_CELLS:
            return full(problem, f, spare=self.max_spare)
        spare = int(rng.integers(self.max_spare + 1))
        if r < self.p_full + self.p_nodes:
            return bottleneck_nodes(problem, f, b, rng, spare=spare)
        w = int(rng.choice(self.widths))
        start = int(rng.integers(max(0, b - w + 1), b + 1))
        return window(problem, f, start, w, spare=spare)


def lns(problem: MCMProblem, seed_partition, time_limit_s: float = 30.0, *, seed: int = 0,
        chooser: Chooser | None = None, subsolve_s: float = SUBSOLVE_S, max_subsolves: int | None = None,
        num_workers: int = 1, on_step=None, subsolve_det: float | None = None) -> LNSResult:
    """Improve a valid partition by neighbourhood re-solves for ``time_limit_s`` seconds (or
    ``max_subsolves``); the result is never worse than ``seed_partition``. ``on_step(step, nb, sub,
    accepted, best_max_latency_s)`` is called after every sub-solve (the RL environment learns from it).
    Raises ValueError when the seed is not a valid partition (the reason from ``check``).

    ``subsolve_det``: the deterministic budget mode (issue 31). Every sub-solve, a full solve included,
    gets the same CP-SAT ``max_deterministic_time`` (one worker unless ``num_workers`` says otherwise,
    seeded): with ``max_subsolves`` the run is then a function of its inputs and ``seed`` alone, whatever
    the machine load; ``time_limit_s`` stays as the outer wall-clock safety limit (``stopped`` says
    "time" when it, not the budget, ended the run)."""
    from ...simulators.mcm import check

    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s is {time_limit_s}, must be > 0")
    if not subsolve_s > 0:
        raise ValueError(f"subsolve_s is {subsolve_s}, must be > 0")
    if subsolve_det is not None and not subsolve_det > 0:
        raise ValueError(f"subsolve_det is {subsolve_det}, must be > 0")
    t0 = time.perf_counter()
    f = np.asarray(seed_partition, dtype=np.int64).copy()
    ev = evaluate(problem, f)
    if not ev.valid[0]:
        raise ValueError("seed_partition is not a valid partition: " + "; ".join(check(problem, f)[:3]))
    rng = np.random.default_rng(seed)
    chooser = chooser or BottleneckChooser()
    best_L = float(ev.max_latency_s[0])
    seed_tp = float(ev.throughput[0])
    lat = ev.latency_s[0]
    bound = lower_bound_s(problem)
    steps = accepted = improved = rej_mem = 0
    kinds: dict[str, int] = {}
    tt: list[float] = []
    tp: list[float] = []
    tl: list[float] = []
    det = 0.0
    stopped = "time"
    deadline = t0 + time_limit_s
    while True:
        if max_subsolves is not None and steps >= max_subsolves:
            stopped = "subsolves"
            break
        left = deadline - time.perf_counter()
        if left <= 0.01:
            break
        if best_L <= bound * (1 + 1e-9):
            stopped = "bound"
            break
        nb = chooser(problem, f, lat, rng)
        if subsolve_det is None:
            limit = min(subsolve_s * (5 if nb.kind == "full" else 1), left)  # a full solve gets 5 slots
        else:
            limit = left  # the deterministic limit binds; the wall clock is only the outer safety
        sub = solve_neighbourhood(problem, f, nb, time_limit_s=limit, seed=int(rng.integers(2**31)),
                                  num_workers=num_workers, det_time=subsolve_det)
        det += sub.det_time
        steps += 1
        kinds[nb.kind] = kinds.get(nb.kind, 0) + 1
        ok = False
        if sub.partition is not None:
            ev2 = evaluate(problem, sub.partition)
            L2 = float(ev2.max_latency_s[0])
            if not ev2.valid[0]:
                rej_mem += int(bool(ev2.static_ok[0]))
            elif L2 <= best_L * (1 + 1e-12):
                ok = True
                accepted += 1
                improved += L2 < best_L * (1 - 1e-12)
                f, best_L, lat = sub.partition, L2, ev2.latency_s[0]
            if nb.kind == "full" and sub.status == "OPTIMAL" and ev2.valid[0]:
                bound = max(bound, min(sub.bound_s, L2))
        if on_step is not None:
            on_step(steps, nb, sub, ok, best_L)
        tt.append(time.perf_counter() - t0)
        tp.append(1.0 / best_L if best_L > 0 else math.inf)
        tl.append(best_L)
        if nb.kind == "full" and sub.status == "OPTIMAL" and ok:
            stopped = "optimal"
            bound = best_L
            break
    return LNSResult(f, 1.0 / best_L if best_L > 0 else math.inf, best_L, seed_tp, steps, accepted, improved,
                     rej_mem, time.perf_counter() - t0, stopped, bound, np.asarray(tt), np.asarray(tp), kinds,
                     det, np.asarray(tl))
