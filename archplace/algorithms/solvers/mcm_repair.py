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
  uniformly random value of its domain.
* SAMPLE (Algorithm 1): one pass; each node draws from ``probs[u]`` renormalised over its domain (uniform
  over the domain when that mass is zero).

The default order is a random permutation from ``seed``; all randomness comes from one
``numpy.random.Generator(PCG64(seed))``.

Restarts (our addition; the paper leaves the backtracking policy open). Chronological backtracking has no
memory of why a branch failed, and with tens of chips Eq. 4 conflicts often surface many decisions after
their cause, so the search can thrash. Stages, each a fresh search with the same order and procedure:

1. ``"eq4"``: the search above, up to ``restart_failures`` failures (default ``max(32, N // 4)``);
2. ``"chain"``: the same plus the *sufficient* condition ``y_dst <= y_src + 1`` (every edge crosses at
   most one chip boundary, so all chip edges are ``d -> d+1`` and Eq. 4 cannot fail), up to
   ``chain_failures`` failures (default ``max(64, N)``). Bounds propagation decides Eq. 2 plus this
   condition without backtracking; only Eq. 3 can still fail, and it fails at once;
3. ``"chain-cap<k>"``: the chain condition with every chip ``<= k``, ``k`` halving from ``(C - 1) // 2``;
4. ``"complete"``: the plain search of stage 1 without a failure limit.

A stage that *exhausts* its tree without a partition moves on (a restricted stage to stage 4; stage 1 means
no partition exists). Stage 4 is complete, so the repair returns a valid partition whenever one exists,
reports "infeasible" when the whole tree of stage 1 or 4 is exhausted and "unknown" when
``time_limit_s`` runs out. Without pins (:meth:`MCMRepairer.restrict`) the static problem is never
infeasible: all nodes on chip 0 meets Eqs. 2–4, and stage 3 reaches ``k = 0``.

The result records its stage: partitions from stages 2–3 meet the chain condition and tend to use fewer
chips and to change more of ``y`` than the paper's procedure would with a perfect propagator.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from ortools.constraint_solver import pywrapcp

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
    produced the result ("eq4", "chain", "chain-cap<k>" or "complete", see the module doc).
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
        if self._fix:
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
    indeg = [len(p) for p in preds]
    topo = [u for u in range(n) if not indeg[u]]
    for u in topo:
        for v in succs[u]:
            indeg[v] -= 1
            if not indeg[v]:
                topo.append(v)
    tri: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
    if len(topo) < n:
        return tri
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

    ``restart_failures`` and ``chain_failures`` (attributes) are the failure limits of the restart stages
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
        self.restart_failures = max(32, n // 4)  # stage "eq4" failure limit (<= 0: straight to "complete")
        self.chain_failures = max(64, n)  # failure limit of the chain stages

    def restrict(self, node: int, chips) -> None:
        """Permanently limit ``node`` to ``chips`` for every later repair (pinned ops; also the only way to
        make the static problem infeasible, since all nodes on chip 0 always meets Eqs. 2–4)."""
        if not 0 <= int(node) < self.num_nodes:
            raise ValueError(f"node is {node}, must be in [0, {self.num_nodes})")
        vals = sorted({int(c) for c in np.asarray(chips).ravel().tolist()} & set(range(self.num_chips)))
        slv = self._solver
        slv.Add(slv.MemberCt(self._ys[int(node)], vals) if vals else slv.FalseConstraint())

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
        if mode == "sample":
            if probs is None:
                raise ValueError("probs is required in mode 'sample'")
            pr = np.asarray(probs, dtype=np.float64)
            if pr.shape != (n, C):
                raise ValueError(f"probs must have shape ({n}, {C}), got {pr.shape}")
            if not np.isfinite(pr).all() or (pr < 0).any():
                raise ValueError("probs must be finite and non-negative")
        rng = np.random.Generator(np.random.PCG64(seed))
        if order is None:
            ordl = rng.permutation(n).tolist()
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
        wall = time.perf_counter() - t0
        fails, branches = slv.Failures() - f0, slv.Branches() - b0
        if found and db.solution is not None:
            part = np.asarray(db.solution, dtype=np.int64)
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
    still in their domain, the others get a uniformly random chip of their domain in a second pass.
    ``mode="sample"`` needs ``probs`` (shape ``[N, num_chips]``, non-negative): each node samples from its
    row renormalised over its domain; a ``y`` given here only feeds ``changed``. ``order`` is the node
    order (a permutation of ``range(N)``; default: a random one from ``seed``). ``N`` is the length of ``y``
    or ``probs`` (or ``num_nodes``). The result depends only on the arguments (the search is deterministic
    given ``seed``) unless ``time_limit_s`` cuts it short; ``status`` is "valid", "infeasible" or "unknown"
    and ``stage`` tells which restart stage produced it (module doc). The model of a graph is cached (the
    last few graphs), so repeated calls on one graph pay only for the search.
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
