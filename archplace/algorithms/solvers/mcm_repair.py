"""Constraint repair for multi-chip-module partitioning: the SAMPLE and FIX procedures (spec ``mcm.md`` §3;
paper §4.2, Algorithms 1 and 2) on OR-Tools' classic constraint solver (``pywrapcp``).

A partition maps each node ``u`` of a DAG to a chip ``y_u`` in ``[0, C)`` of a uni-directional ring. The
static constraints are

* Eq. 2 (acyclic dataflow): ``y_src <= y_dst`` for every edge;
* Eq. 3 (no skipped chips): the used chips are exactly ``{0, ..., max(y)}``;
* Eq. 4 (chip triangle dependency): in the chip graph ``A = {(y_u, y_v) : (u, v) in E, y_u != y_v}`` no
  direct edge ``a -> b`` coexists with a path ``a -> k -> ... -> b`` of length >= 2.

Model (built once per graph by :class:`MCMRepairer`; :func:`repair` caches the last few):

* one ``IntVar`` ``y_u`` in ``[0, C-1]`` per node; Eq. 2 as ``y_src <= y_dst`` (bounds propagation in C++);
* Eq. 3 in C++: ``Distribute(y, card)`` counts the nodes per chip, ``used_d = (card_d >= 1)``,
  ``used_d >= used_{d+1}``: a chip that lies at or below a used chip keeps at least one node that can take
  it (the solver fails when none can, binds the last candidate, and drops an unusable chip and all chips
  above it from every domain). In Python, before every decision, a matching check: the empty chips up to
  the largest lower bound of any node need *distinct* unbound nodes whose domains hold them (Hall's
  condition, greedy repair of the previous matching, Kuhn's algorithm when that fails);
* Eq. 4 in Python (:class:`_State`, a ``pywrapcp.PyConstraint`` with a range demon on every variable):
  when a node is bound its chip edges to the bound neighbours join the chip graph, kept as ``C`` bitmasks
  (``C <= 64``) with reachability tables. A value ``x`` for a node is tested exactly against all its bound
  neighbours at once (the "star" test: with ``P``/``Q`` the chips of its bound predecessors/successors,
  the new edges ``P -> x -> Q`` break Eq. 4 iff an in-edge of ``x`` gets a longer path into ``x``, an
  out-edge gets a longer path out of ``x``, or an existing edge ``c -> d`` gets a path ``c ~> x ~> d``).
  Binding a node to a value that fails the test fails; its unbound neighbours lose the values that fail
  (forward checking). For every edge ``(p, q)`` with another path ``p ~> m ~> q``, ``y_m`` must equal
  ``y_p`` or ``y_q`` (a chip strictly between would give a longer chip path), which is propagated when
  two of the three are bound. Adding chip edges never repairs a violation, so all of this is sound. The
  Python state lives in lists with an undo trail whose length is a ``RevInteger``: the solver restores
  it on backtracking and each entry point pops the trail back to it.

Search: a ``pywrapcp.PyDecisionBuilder`` returns ``AssignVariableValue(y_u, c)`` decisions (the paper's
``set_domain(u, {c})``; ``Min``/``Max``/``Contains`` and the Python view of the domain are its
``get_domain``). The solver propagates after each decision; on failure it backtracks and applies the
refutation ``y_u != c``, so a refuted value leaves the domain and the builder is asked again for the node.
Values that fail the star test are skipped without a decision (the bind would fail on them at once).

* FIX (Algorithm 2): the first pass over the order keeps ``y_u`` when it is in ``u``'s domain, else
  defers ``u`` (a kept value refuted later defers it too); the second pass gives every deferred node a
  value of its domain drawn from ``probs[u]`` renormalised over the domain when ``probs`` is given (FIX
  with the policy's probabilities), uniformly otherwise.
* SAMPLE (Algorithm 1): one pass; each node draws from ``probs[u]`` renormalised over its domain (uniform
  over the domain when that mass is zero).

The default order is a random *topological* order from ``seed`` (Kahn's algorithm, a uniformly random
ready node at each step; a random permutation if the graph has a cycle): a node is decided after its
predecessors, so Eq. 2 and Eq. 4 conflicts surface at the decision that causes them instead of many
decisions later (the paper draws a random order; ours is random among the orders that follow the DAG).
All randomness comes from one ``numpy.random.Generator(PCG64(seed))``.

Restarts (our addition; the paper leaves the backtracking policy open). Chronological backtracking has no
memory of why a branch failed, and with tens of chips Eq. 4 conflicts often surface many decisions after
their cause, so the search can thrash. Stages, each a fresh search with the same order and procedure
(except stage 2):

1. ``"eq4"``: the search above, up to ``restart_failures`` failures (default ``max(32, N // 4)``);
2. ``"cpsat"`` (ours, when stage 1 gives up and ``MCMRepairer.cpsat`` is on): the stages below find a
   valid reference partition ``h`` first; then OR-Tools CP-SAT (:func:`_cpsat_repair`: ``x[u, d]``
   booleans, Eqs. 2–4 with chip-pair edge/reachability booleans as in ``mcm_exact``; one worker, a seed
   from the repair's generator, ``cpsat_dtime`` deterministic seconds, hint ``h``) returns the partition
   that keeps the most nodes at ``y`` (FIX: minimal change) or, for SAMPLE, maximises the log-probability
   under ``probs`` perturbed by Gumbel noise from the generator (so repeated SAMPLE calls differ; without
   the noise it would be the most likely valid partition). Each node's domain is every chip when ``C <=
   cpsat_full_chips`` (default 12; the optimum is then the global one over all valid partitions),
   otherwise the chips within ``cpsat_window`` (default 2) of ``h_u`` plus its proposal (``y_u``, or the
   Gumbel-max sample of ``probs[u]``), always within the pins of :meth:`MCMRepairer.restrict`. The
   output is checked against Eqs. 2–4 and used when it scores at least as well as ``h``; otherwise (or
   when CP-SAT returns nothing) ``h`` is returned with the stage that produced it. The chain stages
   below are thus the last resort;
3. ``"chain"``: the same plus the *sufficient* condition ``y_dst <= y_src + 1`` (every edge crosses at
   most one chip boundary, so all chip edges are ``d -> d+1`` and Eq. 4 cannot fail), up to
   ``chain_failures`` failures (default ``max(64, N)``). Bounds propagation decides Eq. 2 plus this
   condition without backtracking; only Eq. 3 can still fail, and it fails at once;
4. ``"chain-cap<k>"``: the chain condition with every chip ``<= k``, ``k`` halving from ``(C - 1) // 2``;
5. ``"complete"``: the plain search of stage 1 without a failure limit.

A stage that *exhausts* its tree without a partition moves on (a restricted stage to stage 5; stage 1 means
no partition exists). Stage 5 is complete, so the repair returns a valid partition whenever one exists,
reports "infeasible" when the whole tree of stage 1 or 4 is exhausted and "unknown" when
``time_limit_s`` runs out. Without pins (:meth:`MCMRepairer.restrict`) the static problem is never
infeasible: all nodes on chip 0 meets Eqs. 2–4, and stage 4 reaches ``k = 0``. With ``restart_failures <=
0`` the repair goes straight to stage 5 (no CP-SAT stage).

The result records its stage: partitions from stages 3–4 meet the chain condition and tend to use fewer
chips and to change more of ``y`` than the paper's procedure would with a perfect propagator; "cpsat"
partitions are a non-paper variant (spec §3.1 (c): an objective towards ``y``) and cost one CP-SAT solve
(about 0.1–0.5 s for FIX on 36 chips and 70–180 nodes, up to a few seconds for SAMPLE; milliseconds on
8-chip graphs of <= 50 nodes, bench/mcm_repair_stages.py). ``bench/mcm_repair_stages.py`` measures how
often each stage runs on uniform proposals.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from ortools.constraint_solver import pywrapcp

from ...workloads.graph import kahn_order

__all__ = ["MAX_CHIPS", "MCMRepairer", "RepairResult", "repair"]

MAX_CHIPS = 64  # chip sets are Python-int bitmasks; the paper's package has 36
_MODES = ("fix", "sample")


@dataclass
class RepairResult:
    """Outcome of one repair.

    ``partition`` is the chip of every node (``None`` unless ``status == "valid"``); ``changed`` counts the
    nodes whose chip differs from the input ``y`` (0 when no ``y`` was given); ``failures`` and
    ``branches`` are the classic solver's counters summed over all stages; ``wall_s`` covers the searches
    only (the model of a graph is built once per :class:`MCMRepairer`); ``stage`` is the stage that
    produced the result ("eq4", "cpsat", "chain", "chain-cap<k>" or "complete", see the module doc).
    """

    partition: np.ndarray | None
    status: str  # "valid" | "infeasible" | "unknown"
    changed: int
    failures: int
    branches: int
    wall_s: float
    stage: str = "eq4"


# ============================================================================================ state
def _bits(m: int):
    while m:
        low = m & -m
        yield low.bit_length() - 1
        m ^= low


def _span(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) >> lo << lo


class _State(pywrapcp.PyConstraint):
    """Eq. 4 (exact for every bound node, forward checking of its neighbours), the skip-edge rule and the
    Eq. 3 matching check.

    Python-side state, undone on backtracking through the trail: ``val`` (chip of each bound node),
    ``lo``/``hi`` (domain bounds, from a range demon on every variable), ``holes`` (values known to be
    removed inside the bounds), ``cnt``/``used`` (bound nodes per chip), ``K`` (largest lower bound) and
    ``A`` (chip edges between bound nodes). ``lo``/``hi``/``holes`` describe a superset of every domain.
    Failures inside demons go through ``Solver.Fail`` or variable methods with a failure wrapper
    (``SetValue``, ``RemoveValues``; ``RemoveInterval`` has none and must not be used here).
    """

    def __init__(self, solver: pywrapcp.Solver, ys: list, preds: list[list[int]], succs: list[list[int]],
                 num_chips: int, tri: list[list[tuple[int, int, int]]]):
        super().__init__(solver)
        self._s = solver
        self.ys = ys
        self.tri = tri
        self.preds = preds
        self.succs = succs
        self.C = num_chips
        self._rev_len = pywrapcp.RevInteger(0)
        self._demons = [self.Demon(_State._on_range, u) for u in range(len(ys))]
        self.reset()

    # ---------------------------------------------------------------- reversible state
    def reset(self) -> None:
        """Fresh search state (the solver is back at the root)."""
        n, C = len(self.ys), self.C
        self.val = [-1] * n
        self.lo = [0] * n
        self.hi = [C - 1] * n
        self.holes = [0] * n
        self.cnt = [0] * C
        self.used = 0  # chips with a bound node (bitmask)
        self.K = 0  # largest lower bound of any node: chips 0..K will be used
        self.A = [0] * C  # direct chip edges: bit b of A[a] <=> a -> b
        self._trail: list[tuple] = []
        self._seen = 0  # the reversible length as of the last sync / commit
        self._dirty = True
        self._star: dict[tuple[int, int], int] = {}
        self._tabs: dict[tuple[int, ...], tuple] = {}
        self._match: dict[int, int] = {}  # Eq. 3 matching of the last check (a cache, validated on use)

    def sync(self) -> None:
        """Undo what the solver backtracked over (the trail is longer than the reversible length)."""
        n = self._rev_len.Value()
        self._seen = n
        tr = self._trail
        while len(tr) > n:
            e = tr.pop()
            k = e[0]
            if k == 2:
                self.lo[e[1]] = e[2]
                self.hi[e[1]] = e[3]
            elif k == 3:
                self.holes[e[1]] = e[2]
            elif k == 0:
                self.val[e[1]] = -1
                c = e[2]
                self.cnt[c] -= 1
                if not self.cnt[c]:
                    self.used &= ~(1 << c)
            elif k == 4:
                self.K = e[1]
            else:
                self.A[e[1]] = e[2]
                self._dirty = True

    def commit(self) -> None:
        n = len(self._trail)
        if n != self._seen:
            self._rev_len.SetValue(self._s, n)
            self._seen = n

    def add_hole(self, u: int, c: int) -> None:
        if not (self.holes[u] >> c) & 1:
            self._trail.append((3, u, self.holes[u]))
            self.holes[u] |= 1 << c
            self.commit()

    def dom(self, u: int) -> int:
        """Superset of u's domain, as a bitmask."""
        return _span(self.lo[u], self.hi[u]) & ~self.holes[u]

    # ---------------------------------------------------------------- chip graph (Eq. 4)
    def _refresh(self) -> None:
        """Reachability tables of the chip graph; chip ids are a topological order (edges go up). The
        tables (and the star results) of recent chip graphs are cached: backtracking revisits them."""
        if not self._dirty:
            return
        key = tuple(self.A)
        hit = self._tabs.get(key)
        if hit is not None:
            self._tab, self._star = hit
            self._dirty = False
            return
        C, A = self.C, self.A
        R = [0] * C  # reachable from a (path length >= 1)
        Z = [0] * C  # chips with a direct edge into a or into a chip reachable from a
        Ain = [0] * C  # direct predecessors
        for a in range(C):
            for b in _bits(A[a]):
                Ain[b] |= 1 << a
        for a in range(C - 1, -1, -1):
            r = 0
            z = Ain[a]
            for k in _bits(A[a]):
                r |= (1 << k) | R[k]
                z |= Z[k]
            R[a] = r
            Z[a] = z
        S = [1 << a for a in range(C)]  # a and the chips reaching it
        for b in range(C):
            for a in _bits(Ain[b]):
                S[b] |= S[a]
        R2 = [0] * C  # reachable by a path of length >= 2
        Zo = [0] * C  # OR of Z over the direct successors
        An2 = [0] * C  # strict ancestors of the direct predecessors
        for a in range(C):
            for k in _bits(A[a]):
                R2[a] |= R[k]
                Zo[a] |= Z[k]
            for k in _bits(Ain[a]):
                An2[a] |= S[k] ^ (1 << k)
        self._tab = (R, Z, Ain, S, R2, Zo, An2)
        self._star = {}
        if len(self._tabs) >= 512:
            self._tabs.clear()
        self._tabs[key] = (self._tab, self._star)
        self._dirty = False

    def star(self, w: int, cand: int) -> int:
        """The values in ``cand`` that give w a chip keeping Eqs. 2 and 4 with the bound nodes (exact for
        the bound neighbours; see :meth:`_star_all`)."""
        if not cand:
            return 0
        val = self.val
        pm = qm = 0
        for p in self.preds[w]:
            a = val[p]
            if a >= 0:
                pm |= 1 << a
        for q in self.succs[w]:
            b = val[q]
            if b >= 0:
                qm |= 1 << b
        if not pm | qm:
            return cand
        self._refresh()
        key = (pm, qm)
        m = self._star.get(key)
        if m is None:
            m = self._star[key] = self._star_all(pm, qm)
        return cand & m

    def _star_all(self, pm: int, qm: int) -> int:
        """Chips x for a node whose bound predecessors sit on the chips of ``pm`` and bound successors on
        those of ``qm``. With P (Q) the chips of pm below x (of qm above x), the new edges P -> x -> Q break
        Eq. 4 iff (ii) an in-edge of x gets a longer path into x, (iii) an out-edge of x gets a longer path
        from x, or (i) an old edge c -> d gets a path c ~> x ~> d; Eq. 2 needs max(pm) <= x <= min(qm).
        The accumulations over P and Q run along x in one sweep."""
        R, Z, Ain, S, R2, Zo, An2 = self._tab
        A = self.A
        lo = pm.bit_length() - 1 if pm else 0
        hi = (qm & -qm).bit_length() - 1 if qm else self.C - 1
        if lo > hi:
            return 0
        Qs = list(_bits(qm))
        nq = len(Qs)
        sb = [0] * (nq + 1)
        sR = [0] * (nq + 1)
        sZ = [0] * (nq + 1)
        for j in range(nq - 1, -1, -1):
            b = Qs[j]
            sb[j] = sb[j + 1] | (1 << b)
            sR[j] = sR[j + 1] | R[b]
            sZ[j] = sZ[j + 1] | Z[b]
        pb = pS = pS2 = 0
        for a in _bits(pm & ((1 << lo) - 1)):  # the predecessors strictly below lo
            pb |= 1 << a
            pS |= S[a]
            pS2 |= S[a] ^ (1 << a)
        j = 0
        out = 0
        for x in range(lo, hi + 1):
            if x > lo and (pm >> (x - 1)) & 1:  # x - 1 joins P
                a = x - 1
                pb |= 1 << a
                pS |= S[a]
                pS2 |= S[a] ^ (1 << a)
            while j < nq and Qs[j] <= x:
                j += 1
            if (Ain[x] | pb) & (An2[x] | pS2):
                continue
            if (A[x] | sb[j]) & (R2[x] | sR[j]):
                continue
            if ((S[x] ^ (1 << x)) | pS) & (Zo[x] | sZ[j]):
                continue
            out |= 1 << x
        return out

    def allowed(self, u: int) -> int:
        return self.star(u, self.dom(u))

    # ---------------------------------------------------------------- Eq. 3 (matching)
    def eq3_ok(self) -> bool:
        """Can the empty chips that must be used (all chips up to the largest lower bound) get distinct
        unbound nodes whose domains still hold them? (Hall's condition; a necessary condition.) The last
        matching is kept: still-valid pairs stay, broken ones are re-matched greedily, and only when that
        fails does a full augmenting-path matching run."""
        gm = ((1 << (self.K + 1)) - 1) & ~self.used
        if not gm:
            return True
        val, lo, hi, holes = self.val, self.lo, self.hi, self.holes
        old = self._match
        match: dict[int, int] = {}
        taken: set[int] = set()
        todo = []
        for d in _bits(gm):
            w = old.get(d)
            if w is not None and val[w] < 0 and lo[w] <= d <= hi[w] and not (holes[w] >> d) & 1:
                match[d] = w
                taken.add(w)
            else:
                todo.append(d)
        if todo:
            n = len(val)
            for d in todo:
                for w in range(n):
                    if val[w] < 0 and lo[w] <= d <= hi[w] and w not in taken and not (holes[w] >> d) & 1:
                        match[d] = w
                        taken.add(w)
                        break
                else:
                    return self._hall(gm)
        self._match = match
        return True

    def _hall(self, gm: int) -> bool:
        """Full bipartite matching of the gap chips ``gm`` to unbound nodes (Kuhn's algorithm)."""
        val, lo, hi, holes = self.val, self.lo, self.hi, self.holes
        cand: dict[int, list[int]] = {d: [] for d in _bits(gm)}
        for w in range(len(val)):
            if val[w] < 0:
                m = _span(lo[w], hi[w]) & gm & ~holes[w]
                for d in _bits(m):
                    cand[d].append(w)
        owner: dict[int, int] = {}

        def augment(d: int, seen: set[int]) -> bool:
            for w in cand[d]:
                if w not in seen:
                    seen.add(w)
                    if w not in owner or augment(owner[w], seen):
                        owner[w] = d
                        return True
            return False

        for d in sorted(cand, key=lambda g: len(cand[g])):
            if not augment(d, set()):
                return False
        self._match = {d: w for w, d in owner.items()}
        return True

    # ---------------------------------------------------------------- solver hooks
    def Post(self) -> None:
        for v, d in zip(self.ys, self._demons):
            v.WhenRange(d)

    def InitialPropagate(self) -> None:
        self.sync()
        for u in range(len(self.ys)):
            self._update(u)
        self.commit()

    def _on_range(self, u: int) -> None:
        self.sync()
        self._update(u)
        self.commit()

    def _update(self, u: int) -> None:
        v = self.ys[u]
        lo, hi = v.Min(), v.Max()
        if lo != self.lo[u] or hi != self.hi[u]:
            self._trail.append((2, u, self.lo[u], self.hi[u]))
            self.lo[u] = lo
            self.hi[u] = hi
            if lo > self.K:
                self._trail.append((4, self.K))
                self.K = lo
        if lo == hi and self.val[u] < 0:
            self._bind(u, lo)

    def _bind(self, u: int, c: int) -> None:
        if not self.star(u, 1 << c):
            self._s.Fail()  # Eq. 4 (or Eq. 2) with the bound neighbours
        val, A = self.val, self.A
        for p in self.preds[u]:
            a = val[p]
            if 0 <= a < c and not (A[a] >> c) & 1:
                self._trail.append((1, a, A[a]))
                A[a] |= 1 << c
                self._dirty = True
        for s in self.succs[u]:
            b = val[s]
            if b > c and not (A[c] >> b) & 1:
                self._trail.append((1, c, A[c]))
                A[c] |= 1 << b
                self._dirty = True
        val[u] = c
        self.cnt[c] += 1
        self.used |= 1 << c
        self._trail.append((0, u, c))
        # skip edges: for an edge (p, q) and a node m on another path p ~> q, y_m is y_p or y_q
        ys = self.ys
        for p, m, q in self.tri[u]:
            fp, fm, fq = val[p], val[m], val[q]
            if fp >= 0 and fq >= 0:
                if fm >= 0:
                    if fp < fm < fq:
                        self._s.Fail()
                elif fq - fp >= 2:
                    cut = _span(fp + 1, fq - 1) & self.dom(m)
                    if cut:
                        self._trail.append((3, m, self.holes[m]))
                        self.holes[m] |= cut
                        self.commit()
                        ys[m].RemoveValues(list(_bits(cut)))  # (RemoveInterval has no failure wrapper)
            elif fm >= 0:
                if fp >= 0 and fm > fp:
                    self.commit()
                    ys[q].SetValue(fm)
                elif fq > fm:
                    self.commit()
                    ys[p].SetValue(fm)
        # forward checking of the unbound neighbours
        for w in self.preds[u] + self.succs[u]:
            if val[w] < 0:
                d = self.dom(w)
                ok = self.star(w, d)
                if ok != d:
                    self._trail.append((3, w, self.holes[w]))
                    self.holes[w] |= d & ~ok
                    self.commit()  # before the solver call, which may fail
                    self.ys[w].RemoveValues(list(_bits(d & ~ok)))

    def DebugString(self) -> str:
        return "MCMStaticConstraints"


# ============================================================================================ search
class _RepairBuilder(pywrapcp.PyDecisionBuilder):
    """Algorithms 1 (SAMPLE) and 2 (FIX) as a decision builder; the position in the node order is a
    ``RevInteger`` (set in ``Next``, before the decision is pushed, so both branches keep it)."""

    def __init__(self, rep: MCMRepairer, mode: str, order: list[int], y: list[int] | None,
                 probs: np.ndarray | None, rng: np.random.Generator, deadline: float, max_failures: int,
                 cap: int, chain: int):
        super().__init__()
        self._cap = cap
        self._chain = chain
        self._rep = rep
        self._fix = mode == "fix"
        self._order = order
        self._y = y
        self._probs = probs
        self._rng = rng
        self.solution: list[int] | None = None
        self.deadline = deadline
        self.max_failures = max_failures
        self.timed_out = False
        self.aborted = False

    def Next(self, solver: pywrapcp.Solver):
        if self.timed_out or self.aborted:
            return solver.FailDecision()  # unwinds the search: every open node fails at once
        if time.perf_counter() > self.deadline:
            self.timed_out = True
            return solver.FailDecision()
        if solver.Failures() > self.max_failures:
            self.aborted = True
            return solver.FailDecision()
        rep = self._rep
        for var, want in ((rep._capvar, self._cap), (rep._chainvar, self._chain)):
            if not var.Bound():  # the root: this run's mode (refuted: the run is exhausted)
                return solver.AssignVariableValue(var, want) if var.Contains(want) else solver.FailDecision()
        st = rep._st
        st.sync()
        if not st.eq3_ok():
            return solver.FailDecision()
        ys, order, pos = st.ys, self._order, rep._pos
        val, lo, hi, holes = st.val, st.lo, st.hi, st.holes
        n = len(order)
        i = pos.Value()
        if self._fix and i < n:  # first pass: keep y_u when it is in the domain
            y = self._y
            while i < n:
                u = order[i]
                if val[u] < 0:
                    c = y[u]
                    if lo[u] <= c <= hi[u] and not (holes[u] >> c) & 1 and st.star(u, 1 << c) \
                            and ys[u].Contains(c):
                        pos.SetValue(solver, i)
                        return solver.AssignVariableValue(ys[u], c)
                i += 1
        j = i - n if self._fix else i
        while j < n:
            u = order[j]
            if val[u] < 0:
                allowed = st.allowed(u)
                v = ys[u]
                while allowed:
                    c = self._pick(u, allowed)
                    if v.Contains(c):
                        pos.SetValue(solver, j + n if self._fix else j)
                        return solver.AssignVariableValue(v, c)
                    st.add_hole(u, c)  # removed by another constraint (or refuted)
                    allowed &= ~(1 << c)
                return solver.FailDecision()
            j += 1
        self.solution = list(val)
        return None

    def _pick(self, u: int, allowed: int) -> int:
        if not allowed & (allowed - 1):
            return allowed.bit_length() - 1
        vals = list(_bits(allowed))
        if self._probs is None:
            return vals[int(self._rng.integers(len(vals)))]
        w = self._probs[u, vals]
        tot = float(w.sum())
        if not tot > 0.0:
            return vals[int(self._rng.integers(len(vals)))]
        r = self._rng.random() * tot
        acc = 0.0
        for c, wc in zip(vals, w.tolist()):
            acc += wc
            if r < acc:
                return c
        return vals[-1]


# ============================================================================================ CP-SAT stage
def _cpsat_repair(C: int, pairs: list[tuple[int, int]], doms: list[list[int]], hint: list[int],
                  weights: list[dict[int, int]], seed: int, dtime: float, wall: float) -> list[int] | None:
    """The best partition with ``y_u`` in ``doms[u]`` under Eqs. 2–4, maximising ``sum_u weights[u][y_u]``
    (CP-SAT, one worker, ``random_seed=seed``, ``dtime`` deterministic seconds, at most ``wall`` seconds);
    ``hint`` is a valid partition inside the domains. ``None`` when CP-SAT returns no solution.

    Model (as ``mcm_exact``, on the chips ``0..M-1`` that some domain holds): ``x[u, d]`` for ``d`` in
    ``doms[u]``, exactly one per node, ``y_u = sum_d d x[u, d]``, Eq. 2 as ``y_src <= y_dst``; Eq. 3 with
    ``used_d`` (``x[u, d] => used_d``, ``used_d => OR_u x[u, d]``, ``used_{d+1} => used_d``); Eq. 4 with
    chip-pair booleans ``e[a, b]`` (implied by ``x[u, a] and x[v, b]`` for an edge ``(u, v)``, created only
    for pairs some edge's domains allow) and reachability ``r[a, b]`` (implied by ``e[a, b]`` and by
    ``r[a, k] and e[k, b]``), ``not (e[a, b] and r[a, k] and r[k, b])``. Only the implying direction is
    needed: the true chip graph satisfies the clauses exactly when the partition meets Eq. 4."""
    from ortools.sat.python import cp_model

    n = len(doms)
    M = max(max(d) for d in doms) + 1 if n else 1
    md = cp_model.CpModel()
    x: list[dict[int, object]] = []
    ys = []
    for u in range(n):
        xu = {d: md.new_bool_var(f"x{u}_{d}") for d in doms[u]}
        x.append(xu)
        md.add_exactly_one(list(xu.values()))
        yu = md.new_int_var_from_domain(cp_model.Domain.from_values(doms[u]), f"y{u}")
        md.add(yu == sum(d * b for d, b in xu.items() if d))
        ys.append(yu)
    for a, b in pairs:  # Eq. 2
        md.add(ys[a] <= ys[b])
    on: list[list] = [[] for _ in range(M)]
    for u in range(n):
        for d, b in x[u].items():
            on[d].append(b)
    used = [md.new_bool_var(f"used{d}") for d in range(M)]  # Eq. 3
    for d in range(M):
        for b in on[d]:
            md.add_implication(b, used[d])
        md.add_bool_or(on[d] + [~used[d]])
        if d + 1 < M:
            md.add_implication(used[d + 1], used[d])
    e: dict[tuple[int, int], object] = {}  # Eq. 4
    for u, v in pairs:
        xu, xv = x[u], x[v]
        for a, ba in xu.items():
            for b, bb in xv.items():
                if a < b:
                    eab = e.get((a, b))
                    if eab is None:
                        eab = e[a, b] = md.new_bool_var(f"e{a}_{b}")
                    md.add_bool_or([~ba, ~bb, eab])
    r = {(a, b): md.new_bool_var(f"r{a}_{b}") for a in range(M) for b in range(a + 1, M)}
    for (a, b), eab in e.items():
        md.add_implication(eab, r[a, b])
        for k in range(a + 1, b):
            md.add_bool_or([~eab, ~r[a, k], ~r[k, b]])
    for (k, b), ekb in e.items():
        for a in range(k):
            md.add_bool_or([~r[a, k], ~ekb, r[a, b]])
    md.maximize(sum(w * x[u][d] for u in range(n) for d, w in weights[u].items() if w))
    for u in range(n):
        md.add_hint(ys[u], hint[u])
        for d, b in x[u].items():
            md.add_hint(b, d == hint[u])
    slv = cp_model.CpSolver()
    prm = slv.parameters
    prm.num_workers = 1
    prm.random_seed = int(seed)
    prm.max_deterministic_time = max(float(dtime), 1e-3)
    prm.max_time_in_seconds = max(float(wall), 1e-3)
    st = slv.solve(md)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return [int(slv.value(v)) for v in ys]


def _static_ok(C: int, pairs: list[tuple[int, int]], f: list[int]) -> bool:
    """Eqs. 2–4 for a full partition (a final check of the CP-SAT stage's output)."""
    if not f:
        return True
    if min(f) < 0 or max(f) >= C or len(set(f)) != max(f) + 1:
        return False
    A = [0] * C
    for a, b in pairs:
        fa, fb = f[a], f[b]
        if fa > fb:
            return False
        if fa < fb:
            A[fa] |= 1 << fb
    R2 = [0] * C  # chips reachable by a path of length >= 2
    R = [0] * C  # reachable by length >= 1
    for a in range(C - 1, -1, -1):
        for k in _bits(A[a]):
            R2[a] |= R[k]
            R[a] |= (1 << k) | R[k]
        if A[a] & R2[a]:
            return False
    return True


def _random_topo(n: int, succs: list[list[int]], rng: np.random.Generator) -> list[int] | None:
    """A uniformly random choice among the ready nodes at every step (Kahn); ``None`` on a cycle."""
    indeg = [0] * n
    for u in range(n):
        for v in succs[u]:
            indeg[v] += 1
    ready = [u for u in range(n) if not indeg[u]]
    out: list[int] = []
    while ready:
        i = int(rng.integers(len(ready)))
        u = ready[i]
        ready[i] = ready[-1]
        ready.pop()
        out.append(u)
        for v in succs[u]:
            indeg[v] -= 1
            if not indeg[v]:
                ready.append(v)
    return out if len(out) == n else None


# ============================================================================================ API
def _as_edges(src, dst) -> tuple[np.ndarray, np.ndarray]:
    s = np.asarray(src)
    d = np.asarray(dst)
    if s.ndim != 1 or d.ndim != 1 or s.shape != d.shape:
        raise ValueError(f"src and dst must be 1-D arrays of equal length, got shapes {s.shape} and "
                         f"{d.shape}")
    if s.size and not (np.issubdtype(s.dtype, np.integer) and np.issubdtype(d.dtype, np.integer)):
        raise ValueError("src and dst must hold integer node indices")
    return s.astype(np.int64), d.astype(np.int64)


def _skip_triples(n: int, preds: list[list[int]], succs: list[list[int]]) -> list[list[tuple[int, int, int]]]:
    """For every edge (p, q) and node m on another path p ~> q: (p, m, q), listed under each of the three.
    Empty when the graph has a cycle (these are implied constraints, not needed for soundness)."""
    src = np.array([u for u in range(n) for _ in succs[u]], dtype=np.int64)
    dst = np.array([v for u in range(n) for v in succs[u]], dtype=np.int64)
    order, stuck = kahn_order(n, src, dst)  # descendant and ancestor sets do not depend on the order
    tri: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    if stuck >= 0:
        return tri
    topo = order.tolist()
    desc = [0] * n
    anc = [0] * n
    for u in reversed(topo):
        for v in succs[u]:
            desc[u] |= (1 << v) | desc[v]
    for v in topo:
        for u in preds[v]:
            anc[v] |= (1 << u) | anc[u]
    for p in range(n):
        for q in succs[p]:
            for m in _bits(desc[p] & anc[q]):
                t = (p, m, q)
                tri[p].append(t)
                tri[m].append(t)
                tri[q].append(t)
    return tri


class MCMRepairer:
    """The repair model of one graph (variables, Eq. 2–4 constraints), reusable across many repairs.

    ``restart_failures`` and ``chain_failures`` (attributes) are the failure limits of the restart stages;
    ``cpsat`` (on/off), ``cpsat_full_chips``, ``cpsat_window`` and ``cpsat_dtime`` set the CP-SAT stage
    (module doc). ``num_nodes`` defaults to ``max(src, dst) + 1``.
    """

    def __init__(self, num_chips: int, src, dst, num_nodes: int | None = None):
        num_chips = int(num_chips)
        if not 1 <= num_chips <= MAX_CHIPS:
            raise ValueError(f"num_chips is {num_chips}, must be in [1, {MAX_CHIPS}]")
        s, d = _as_edges(src, dst)
        n = int(max(s.max(initial=-1), d.max(initial=-1)) + 1) if num_nodes is None else int(num_nodes)
        if s.size and (min(s.min(), d.min()) < 0 or max(s.max(), d.max()) >= n):
            raise ValueError(f"src/dst hold node indices outside [0, {n})")
        self.num_chips = num_chips
        self.num_nodes = n
        self.src, self.dst = s, d
        preds: list[set[int]] = [set() for _ in range(n)]
        succs: list[set[int]] = [set() for _ in range(n)]
        for a, b in zip(s.tolist(), d.tolist()):
            if a != b:
                succs[a].add(b)
                preds[b].add(a)
        self._preds = [sorted(p) for p in preds]
        self._succs = [sorted(q) for q in succs]
        slv = pywrapcp.Solver("mcm-repair")
        self._solver = slv
        ys = [slv.IntVar(0, num_chips - 1, f"y{u}") for u in range(n)]
        self._ys = ys
        for a, b in {(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b}:
            slv.Add(ys[a] <= ys[b])  # Eq. 2
        if n and num_chips > 1:  # Eq. 3
            cards = [slv.IntVar(0, n, f"card{c}") for c in range(num_chips)]
            slv.Add(slv.Distribute(ys, cards))
            used = [slv.IsGreaterOrEqualCstVar(cards[c], 1) for c in range(num_chips)]
            for c in range(num_chips - 1):
                slv.Add(used[c] >= used[c + 1])
            self._keep = (cards, used)
        tri = _skip_triples(n, self._preds, self._succs)
        self._st = _State(slv, ys, self._preds, self._succs, num_chips, tri)  # Eq. 4, Eq. 3 matching
        slv.Add(self._st)
        # restarts: chain = 1 adds the sufficient condition y_dst <= y_src + 1; cap bounds every chip
        self._chainvar = slv.IntVar(0, 1, "chain")
        for a, b in {(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b}:
            slv.Add(ys[b] <= ys[a] + (num_chips + 1) - self._chainvar * num_chips)
        self._capvar = slv.IntVar(0, num_chips - 1, "cap")
        for v in ys:
            slv.Add(v <= self._capvar)
        self._pos = pywrapcp.RevInteger(0)
        self._limits: dict[int, object] = {}
        self._pairs = sorted({(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b})
        self._pins: dict[int, set[int]] = {}
        self.restart_failures = max(32, n // 4)  # stage "eq4" failure limit (<= 0: straight to "complete")
        self.chain_failures = max(64, n)  # failure limit of the chain stages
        self.cpsat = True  # run the "cpsat" stage when "eq4" gives up (module doc)
        self.cpsat_full_chips = 12  # up to this many chips every node's CP-SAT domain is every chip
        self.cpsat_window = 2  # else: the chips within this distance of the reference, and the proposal
        self.cpsat_dtime = 1.0  # CP-SAT deterministic time limit (seconds of its own clock)

    def _cpsat_stage(self, mode: str, y: list[int] | None, probs: np.ndarray | None, ref: list[int],
                     rng: np.random.Generator, deadline: float) -> list[int] | None:
        """The "cpsat" stage: CP-SAT over domains around the valid partition ``ref`` (hinted), maximising
        the nodes kept at ``y`` (FIX) or the Gumbel-perturbed log-probability (SAMPLE). Returns the
        partition when it is valid and scores at least ``ref``, else ``None``."""
        n, C = self.num_nodes, self.num_chips
        if mode == "fix":
            target = y
            weights = [{y[u]: 1} for u in range(n)]
        else:
            # Gumbel-max: argmax_d (log p + g) is a sample of p_u; the perturbed log-probability is the
            # objective, so repeated SAMPLE calls give different partitions
            lp = np.log(np.maximum(probs, 1e-9)) + rng.gumbel(size=probs.shape)
            target = lp.argmax(axis=1).tolist()
            wi = np.rint((lp - lp.max(axis=1, keepdims=True)) * 100).astype(np.int64).tolist()
        full = list(range(min(C, n))) if C <= self.cpsat_full_chips else None
        w = self.cpsat_window
        doms = []
        for u in range(n):
            dom = set(full) if full is not None else set(range(max(0, ref[u] - w), min(C, ref[u] + w + 1)))
            dom.add(target[u])
            if u in self._pins:
                dom &= self._pins[u]
            dom.add(ref[u])
            doms.append(sorted(dom))
        if mode == "sample":
            weights = [{d: wi[u][d] for d in doms[u]} for u in range(n)]
        else:
            weights = [{c: v for c, v in weights[u].items() if c in doms[u]} for u in range(n)]
        seed = int(rng.integers(1 << 30))
        out = _cpsat_repair(min(C, n), self._pairs, doms, ref, weights, seed, self.cpsat_dtime,
                            deadline - time.perf_counter())
        if out is None or not _static_ok(C, self._pairs, out):
            return None

        def score(f):
            return sum(weights[u].get(f[u], 0) for u in range(n))

        return out if score(out) >= score(ref) else None

    def restrict(self, node: int, chips) -> None:
        """Permanently limit ``node`` to ``chips`` for every later repair (pinned ops; also the only way to
        make the static problem infeasible, since all nodes on chip 0 always meets Eqs. 2–4)."""
        if not 0 <= int(node) < self.num_nodes:
            raise ValueError(f"node is {node}, must be in [0, {self.num_nodes})")
        vals = sorted({int(c) for c in np.asarray(chips).ravel().tolist()} & set(range(self.num_chips)))
        slv = self._solver
        slv.Add(slv.MemberCt(self._ys[int(node)], vals) if vals else slv.FalseConstraint())
        self._pins[int(node)] = self._pins.get(int(node), set(range(self.num_chips))) & set(vals)

    def repair(self, mode: str = "fix", y=None, probs=None, seed: int = 0, order=None,
               time_limit_s: float = 10.0) -> RepairResult:
        """One SAMPLE or FIX repair; see :func:`repair`."""
        n, C = self.num_nodes, self.num_chips
        if mode not in _MODES:
            raise ValueError(f"mode is {mode!r}, must be one of {_MODES}")
        yl = None
        if y is not None:
            ya = np.asarray(y)
            if ya.shape != (n,) or (ya.size and not np.issubdtype(ya.dtype, np.integer)):
                raise ValueError(f"y must be an integer array of shape ({n},), got {ya.dtype} {ya.shape}")
            if ya.size and (ya.min() < 0 or ya.max() >= C):
                raise ValueError(f"y holds chips outside [0, {C})")
            yl = ya.astype(np.int64).tolist()
        elif mode == "fix":
            raise ValueError("y is required in mode 'fix'")
        pr = None
        if mode == "sample" and probs is None:
            raise ValueError("probs is required in mode 'sample'")
        if probs is not None:
            pr = np.asarray(probs, dtype=np.float64)
            if pr.shape != (n, C):
                raise ValueError(f"probs must have shape ({n}, {C}), got {pr.shape}")
            if not np.isfinite(pr).all() or (pr < 0).any():
                raise ValueError("probs must be finite and non-negative")
        rng = np.random.Generator(np.random.PCG64(seed))
        if order is None:
            ordl = _random_topo(n, self._succs, rng) or rng.permutation(n).tolist()
        else:
            oa = np.asarray(order)
            if oa.shape != (n,) or (n and not np.issubdtype(oa.dtype, np.integer)) or \
                    not np.array_equal(np.sort(oa), np.arange(n)):
                raise ValueError(f"order must be a permutation of range({n})")
            ordl = oa.astype(np.int64).tolist()
        if not time_limit_s > 0:
            raise ValueError(f"time_limit_s is {time_limit_s}, must be > 0")
        slv = self._solver
        ms = max(1, int(round(time_limit_s * 1000)))
        limit = self._limits.get(ms)
        if limit is None:
            limit = self._limits[ms] = slv.TimeLimit(ms)
        st = self._st
        st.reset()
        f0, b0 = slv.Failures(), slv.Branches()
        t0 = time.perf_counter()
        deadline = t0 + time_limit_s
        stage = "eq4" if self.restart_failures > 0 else "complete"
        cap = C - 1
        while True:
            chain = int(stage.startswith("chain"))
            if stage == "complete":
                lim = 1 << 62
            else:
                lim = slv.Failures() + (self.chain_failures if chain else self.restart_failures)
            db = _RepairBuilder(self, mode, ordl, yl, pr, rng, deadline, lim, cap, chain)
            found = slv.Solve(db, [limit])
            if (found and db.solution is not None) or db.timed_out or stage == "complete":
                break
            if not db.aborted and stage == "eq4":
                break  # the search of Eqs. 2-4 was exhausted: infeasible
            if db.aborted and stage == "eq4":
                stage = "chain"
            elif db.aborted and cap > 0:
                cap //= 2
                stage = f"chain-cap{cap}"
            else:
                cap, stage = C - 1, "complete"  # a restricted stage was exhausted
            st.reset()
        sol = db.solution if found else None
        if sol is not None and stage not in ("eq4", "complete") or (stage == "complete" and sol is not None
                                                                     and self.restart_failures > 0):
            # "eq4" gave up: the minimal-change (FIX) / most likely (SAMPLE) partition near this one
            if self.cpsat and time.perf_counter() < deadline:
                best = self._cpsat_stage(mode, yl, pr, sol, rng, deadline)
                if best is not None:
                    sol, stage = best, "cpsat"
        wall = time.perf_counter() - t0
        fails, branches = slv.Failures() - f0, slv.Branches() - b0
        if sol is not None:
            part = np.asarray(sol, dtype=np.int64)
            changed = int((part != np.asarray(yl)).sum()) if yl is not None else 0
            return RepairResult(part, "valid", changed, int(fails), int(branches), wall, stage)
        status = "unknown" if db.timed_out or time.perf_counter() >= deadline else "infeasible"
        return RepairResult(None, status, 0, int(fails), int(branches), wall, stage)


_CACHE: OrderedDict[tuple, MCMRepairer] = OrderedDict()
_CACHE_SIZE = 8


def repair(num_chips: int, src, dst, mode: str = "fix", y=None, probs=None, seed: int = 0, order=None,
           time_limit_s: float = 10.0, *, num_nodes: int | None = None) -> RepairResult:
    """Repair a candidate partition into one that satisfies Eqs. 2–4 (spec §3, paper Algorithms 1/2).

    ``mode="fix"`` needs ``y`` (shape ``[N]``, chips in ``[0, num_chips)``): nodes keep their chip when it is
    still in their domain, the others get a chip of their domain in a second pass, drawn from ``probs``
    (optional here, shape ``[N, num_chips]``) renormalised over the domain, uniformly without ``probs``.
    ``mode="sample"`` needs ``probs`` (shape ``[N, num_chips]``, non-negative): each node samples from its
    row renormalised over its domain; a ``y`` given here only feeds ``changed``. ``order`` is the node
    order (a permutation of ``range(N)``; default: a random topological order from ``seed``). ``N`` is the
    length of ``y`` or ``probs`` (or ``num_nodes``). The result depends only on the arguments (the search,
    CP-SAT stage included, is deterministic given ``seed``) unless ``time_limit_s`` cuts it short;
    ``status`` is "valid", "infeasible" or "unknown" and ``stage`` tells which restart stage produced it
    (module doc). The model of a graph is cached (the last few graphs), so repeated calls on one graph pay
    only for the search (and the CP-SAT stage, when it runs, for its per-repair model).
    """
    n = num_nodes
    for name, arr, dims in (("y", y, 1), ("probs", probs, 2)):
        if arr is not None:
            a = np.asarray(arr)
            if a.ndim != dims:
                raise ValueError(f"{name} must be {dims}-D, got shape {a.shape}")
            if n is None:
                n = a.shape[0]
            elif a.shape[0] != n:
                raise ValueError(f"{name} has {a.shape[0]} nodes, expected {n}")
    if n is None:
        raise ValueError("y (mode 'fix') or probs (mode 'sample') is required")
    s, d = _as_edges(src, dst)
    key = (int(num_chips), int(n), s.tobytes(), d.tobytes())
    rep = _CACHE.get(key)
    if rep is None:
        rep = MCMRepairer(num_chips, s, d, num_nodes=n)
        _CACHE[key] = rep
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    else:
        _CACHE.move_to_end(key)
    return rep.repair(mode, y=y, probs=probs, seed=seed, order=order, time_limit_s=time_limit_s)
