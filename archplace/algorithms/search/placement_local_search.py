"""Local-search baselines for GDP operator placement (issue 31, deliverable 3): simulated annealing and a
large-neighbourhood search over placements, both scored by the event-driven simulator
(``simulators/gpu_placement.py``) and both started from the best fast placer.

Why these exist: a learned placer should be compared with what a user would try first, namely "take the
best heuristic placement and improve it with the simulator", at the same number of simulated placements.

Budget. ``budget`` counts simulated placements (:func:`simulate_batch` rows): the start candidates'
evaluations (one each, all in one batch) and every candidate the search simulates, including candidates a
batch evaluated but the search then discarded. The search stops exactly at the budget; it ends earlier only
when no move exists (one device, or no ops). Nothing depends on wall time, threads or machine load: the
answer is a function of the problem, the starts, the budget and the seed.

Units. Both searches move *placement units* (a co-location group, or an op outside groups;
``gdp_baselines.units._units``), so no move ever splits a group. A unit is picked with probability half
uniform, half proportional to its compute time (so heavy units are tried often and light ones still are).

Cost. The searches compare ``step_time_s * (1 + OOM_PENALTY * excess)``, where ``excess`` is the memory
over ``memory_bytes`` summed over devices, in units of ``memory_bytes`` (a co-location split, which only a
start can bring, multiplies by ``1 + SPLIT_PENALTY``). The answer is the fastest *valid* placement seen
(the lowest-cost one when none was valid, so the caller can say why it is invalid).

* :func:`simulated_annealing`: moves (a unit to another device, half the time the device of one of its
  graph neighbours; or a swap of two units on different devices), Metropolis acceptance
  ``exp(-(c' - c) / T)``, geometric temperature from ``T0`` (a move 0.1% slower than the start is accepted
  with probability 1/2: cold, since the start is already good) down to ``T0 / 100`` at the last call.
  Proposals are simulated in speculative batches from the current state (batch size about 1 / the recent
  acceptance rate, 1..32); they are processed in order and the first accepted one wins, so the walk is
  exactly sequential SA; the proposals after it are discarded (and counted).
* :func:`neighbourhood_search`: picks a neighbourhood of ``k`` units in rotation (the units on the busiest
  device; ``k`` units at random; a unit and its nearest neighbours in the unit graph), enumerates every
  reassignment of those units to devices (``d**k - 1`` of them, ``k`` the largest with ``d**k <= 16``, at
  least 2), or samples 15 of them when there are more, simulates them in one :func:`simulate_batch` call
  (one sub-solve) and moves to the best if it is cheaper.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ...simulators.gpu_placement import BatchResult, PlacementProblem, check_placements, simulate_batch
from .gdp_baselines.units import _check, _units

OOM_PENALTY = 4.0          # cost factor per memory_bytes of overflow (summed over devices)
SPLIT_PENALTY = 10.0       # cost factor of a split co-location group (only a start can have one)
# T0: a move this much slower than the start is accepted with probability 1/2. Chosen from 2%, 0.5% and 0.1%
# on txl-2, rnnlm-2 and inception-v3 (p100-pcie, 2,000 calls, seed 0): a hotter walk drifts away from a
# good start and does not come back within a few thousand calls (2%: no gain on any of the three).
SA_ACCEPT_SLOWER = 0.001
SA_COOLING = 0.01          # T at the last call / T0 (geometric in between)
SA_MAX_BATCH = 32          # most speculative proposals simulated together
# most placements a sub-solve simulates (d**k for the enumerated neighbourhood). Chosen from 16, 32 and 64 on
# the three graphs SA_ACCEPT_SLOWER was chosen on: more, smaller sub-solves did better (16: 1.003-1.039x
# over the start; 64: 1.002-1.016x)
LNS_BATCH = 16
LNS_KINDS = ("busiest", "random", "connected")


@dataclass
class LocalSearchResult:
    """The best placement a search found and how it got there (``*_s``: simulated seconds)."""

    placement: np.ndarray           # [n] int64 device per op
    step_time_s: float
    valid: bool
    start_algo: str                 # the start candidate it began from (the fastest valid one)
    start_step_time_s: float
    start_valid: bool
    start_step_times_s: dict[str, float]  # every start candidate's simulated step time
    start_valid_by_algo: dict[str, bool]
    simulator_calls: int            # placements simulated, the starts included (<= budget)
    budget: int
    accepted_moves: int             # SA: accepted proposals; LNS: sub-solves that moved
    improvements: int               # times the best valid placement got faster
    steps: int                      # SA: proposals processed; LNS: sub-solves
    best_trace: list[tuple[int, float]] = field(default_factory=list)  # (calls so far, best step time)

    @property
    def speedup_over_start(self) -> float | None:
        return self.start_step_time_s / self.step_time_s if self.step_time_s > 0 else None


class _Search:
    """What both searches share: units, their neighbours, the cost, the budget and the best seen."""

    def __init__(self, problem: PlacementProblem, starts: dict[str, np.ndarray], budget: int, seed: int):
        _check(problem)
        if not starts:
            raise ValueError("starts is empty: give at least one start placement")
        if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < len(starts):
            raise ValueError(f"budget is {budget!r}; must be an integer >= {len(starts)} (one simulator call "
                             f"per start candidate)")
        self.p, self.budget, self.calls = problem, int(budget), 0
        self.rng = np.random.default_rng(seed)
        self.d = problem.num_devices
        self.unit, members = _units(problem)
        self.U = len(members)
        w = np.bincount(self.unit, weights=problem.compute_s, minlength=self.U)
        uni = np.full(self.U, 1.0 / max(self.U, 1))
        self.pick_p = 0.5 * uni + 0.5 * (w / w.sum() if w.sum() > 0 else uni)
        self.first_op = np.array([m[0] for m in members], np.int64)
        # unit graph (undirected, no self loops), as CSR
        us, ud = self.unit[problem.src], self.unit[problem.dst]
        keep = us != ud
        a = np.concatenate([us[keep], ud[keep]])
        b = np.concatenate([ud[keep], us[keep]])
        pairs = np.unique(np.stack([a, b], 1), axis=0) if a.size else np.zeros((0, 2), np.int64)
        self.nb_ptr = np.searchsorted(pairs[:, 0], np.arange(self.U + 1)) if self.U else np.zeros(1, np.int64)
        self.nb = pairs[:, 1].copy()
        self.improvements, self.trace = 0, []
        self.best_P: np.ndarray | None = None
        self.best_key = (True, math.inf)   # (invalid, cost or step time): lexicographic, lower is better
        self.best_step, self.best_valid = math.inf, False
        # the start: every candidate simulated once (one batch), the fastest valid one wins (ties: first)
        names = list(starts)
        P = check_placements(problem, np.stack([np.asarray(starts[k], np.int64) for k in names]))
        r = self.simulate(P)
        c = self.cost(r)
        self.start_steps = {k: float(r.step_time_s[i]) for i, k in enumerate(names)}
        self.start_valid = {k: bool(r.valid[i]) for i, k in enumerate(names)}
        i0 = min(range(len(names)), key=lambda i: (not r.valid[i], r.step_time_s[i] if r.valid[i] else c[i]))
        self.start_algo = names[i0]
        self.cur_units = P[i0][self.first_op].copy() if self.U else np.zeros(0, np.int64)
        self.cur_cost = float(c[i0])
        self.cur_busy = r.compute_busy_s[i0].copy()
        self.start_step, self.start_ok = float(r.step_time_s[i0]), bool(r.valid[i0])

    @property
    def left(self) -> int:
        return self.budget - self.calls

    @property
    def can_move(self) -> bool:
        return self.d > 1 and self.U > 0

    def spread(self, unit_dev: np.ndarray) -> np.ndarray:
        """``[K, U]`` unit devices -> ``[K, n]`` op devices."""
        return np.ascontiguousarray(unit_dev[:, self.unit])

    def cost(self, r: BatchResult) -> np.ndarray:
        m = self.p.memory_bytes
        excess = np.maximum(r.peak_memory_bytes - m, 0.0).sum(axis=1) / m
        return r.step_time_s * (1.0 + OOM_PENALTY * excess) * (1.0 + SPLIT_PENALTY * r.coloc_violated)

    def simulate(self, P: np.ndarray) -> BatchResult:
        """Simulate ``P`` (counted against the budget) and keep the best placement seen."""
        if len(P) > self.left:
            raise AssertionError(f"{len(P)} placements with {self.left} simulator calls left")
        r = simulate_batch(self.p, P)
        self.calls += len(P)
        c = self.cost(r)
        key = np.where(r.valid, r.step_time_s, c)
        order = np.lexsort((key, ~r.valid))
        i = int(order[0])
        k = (not bool(r.valid[i]), float(key[i]))
        if k < self.best_key:
            if r.valid[i] and self.best_valid:
                self.improvements += 1
            self.best_key, self.best_P = k, P[i].copy()
            self.best_step, self.best_valid = float(r.step_time_s[i]), bool(r.valid[i])
            self.trace.append((self.calls, self.best_step))
        return r

    def pick_units(self, k: int, pool: np.ndarray | None = None) -> np.ndarray:
        """``k`` distinct units (from ``pool`` when given), half uniform, half by compute."""
        pool = np.arange(self.U) if pool is None else pool
        p = self.pick_p[pool] / self.pick_p[pool].sum()
        return self.rng.choice(pool, size=min(k, len(pool)), replace=False, p=p)

    def neighbours(self, u: int) -> np.ndarray:
        return self.nb[self.nb_ptr[u]:self.nb_ptr[u + 1]]

    def result(self, accepted: int, steps: int) -> LocalSearchResult:
        return LocalSearchResult(
            self.best_P, self.best_step, self.best_valid, self.start_algo, self.start_step, self.start_ok,
            self.start_steps, self.start_valid, self.calls, self.budget, accepted, self.improvements, steps,
            self.trace)


# ---------------------------------------------------------------------------------------- annealing
def _propose(s: _Search, cur: np.ndarray) -> np.ndarray:
    """One SA neighbour of unit devices ``cur``: a unit to another device (half the time a neighbour's
    device, when one sits elsewhere) or, half the time, a swap with a unit on another device."""
    new = cur.copy()
    u = int(s.pick_units(1)[0])
    if s.rng.random() < 0.5:
        others = np.flatnonzero(cur != cur[u])
        if others.size:
            v = int(s.pick_units(1, others)[0])
            new[u], new[v] = cur[v], cur[u]
            return new
    if s.rng.random() < 0.5:
        devs = cur[s.neighbours(u)]
        devs = devs[devs != cur[u]]
        if devs.size:
            new[u] = devs[s.rng.integers(devs.size)]
            return new
    new[u] = (cur[u] + 1 + s.rng.integers(s.d - 1)) % s.d
    return new


def simulated_annealing(problem: PlacementProblem, starts: dict[str, np.ndarray], budget: int, *,
                        seed: int = 0) -> LocalSearchResult:
    """Simulated annealing from the best of ``starts`` (name -> placement) within ``budget`` simulator
    calls (module doc: moves, temperature, speculative batches)."""
    s = _Search(problem, starts, budget, seed)
    if not s.can_move:
        return s.result(0, 0)
    search_calls = s.left
    t0 = max(SA_ACCEPT_SLOWER * s.cur_cost / math.log(2.0), 1e-300)  # > 0 even for a zero-time graph
    cur, cur_cost = s.cur_units, s.cur_cost
    accept_rate, accepted, steps = 1.0, 0, 0
    while s.left > 0:
        B = int(min(SA_MAX_BATCH, s.left, max(1, round(1.0 / max(accept_rate, 1e-3)))))
        cand = np.stack([_propose(s, cur) for _ in range(B)])
        base = search_calls - s.left          # calls spent by the search before this batch
        c = s.cost(s.simulate(s.spread(cand)))
        for j in range(B):
            steps += 1
            T = t0 * SA_COOLING ** ((base + j) / max(search_calls - 1, 1))
            delta = float(c[j]) - cur_cost
            ok = delta <= 0 or s.rng.random() < math.exp(-delta / T)
            accept_rate = 0.9 * accept_rate + 0.1 * ok
            if ok:
                cur, cur_cost = cand[j], float(c[j])
                accepted += 1
                break
    return s.result(accepted, steps)


# --------------------------------------------------------------------------------- neighbourhoods
def _lns_k(d: int) -> int:
    k = 1
    while d ** (k + 1) <= LNS_BATCH:
        k += 1
    return max(k, 2)


def _neighbourhood(s: _Search, kind: str, k: int, cur: np.ndarray) -> np.ndarray:
    """``k`` units (fewer when the graph has fewer): module doc's three kinds."""
    if kind == "busiest":
        pool = np.flatnonzero(cur == int(np.argmax(s.cur_busy)))
        return s.pick_units(k, pool if pool.size else None)
    if kind == "random":
        return s.pick_units(k)
    seed_u = int(s.pick_units(1)[0])           # connected: breadth-first from a unit, random tie order
    chosen, frontier, seen = [seed_u], [seed_u], {seed_u}
    while frontier and len(chosen) < k:
        nxt = []
        for u in frontier:
            nb = s.neighbours(u)
            for v in nb[s.rng.permutation(nb.size)]:
                if int(v) not in seen and len(chosen) < k:
                    seen.add(int(v))
                    chosen.append(int(v))
                    nxt.append(int(v))
        frontier = nxt
    if len(chosen) < k:                         # a small component: fill up at random
        rest = np.setdiff1d(np.arange(s.U), chosen)
        if rest.size:
            chosen += s.pick_units(k - len(chosen), rest).tolist()
    return np.asarray(chosen, np.int64)


def neighbourhood_search(problem: PlacementProblem, starts: dict[str, np.ndarray], budget: int, *,
                         seed: int = 0) -> LocalSearchResult:
    """Large-neighbourhood search from the best of ``starts`` within ``budget`` simulator calls: each
    sub-solve re-places a neighbourhood of units by enumerating (or sampling) its reassignments in one
    :func:`simulate_batch` call and keeps the best if it is cheaper (module doc)."""
    s = _Search(problem, starts, budget, seed)
    if not s.can_move:
        return s.result(0, 0)
    k0 = min(_lns_k(s.d), s.U)
    cur, cur_cost = s.cur_units, s.cur_cost
    moved = subsolves = 0
    while s.left > 0:
        kind = LNS_KINDS[subsolves % len(LNS_KINDS)]
        hood = _neighbourhood(s, kind, k0, cur)
        k = len(hood)
        total = s.d ** k
        here = int(sum(int(cur[u]) * s.d ** i for i, u in enumerate(hood)))
        others = np.delete(np.arange(total), here) if total <= 4 * LNS_BATCH else None
        m = min(LNS_BATCH - 1 if total - 1 > LNS_BATCH - 1 else total - 1, s.left)
        if others is not None:
            codes = others if m == len(others) else s.rng.choice(others, size=m, replace=False)
        else:                                   # many reassignments: sample m distinct ones, not ``here``
            codes = np.unique(s.rng.integers(0, total, size=4 * m))
            codes = s.rng.permutation(codes[codes != here])[:m]
        digits = (codes[:, None] // (s.d ** np.arange(k))[None, :]) % s.d
        cand = np.repeat(cur[None, :], len(codes), axis=0)
        cand[:, hood] = digits
        r = s.simulate(s.spread(cand))
        subsolves += 1
        c = s.cost(r)
        j = int(np.argmin(c))
        if c[j] < cur_cost:
            cur, cur_cost = cand[j].copy(), float(c[j])
            s.cur_busy = r.compute_busy_s[j].copy()
            moved += 1
    return s.result(moved, subsolves)


SEARCHES = {"sa": simulated_annealing, "lns": neighbourhood_search}
