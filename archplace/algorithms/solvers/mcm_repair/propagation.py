"""Eq. 4, the skip-edge rule and the Eq. 3 matching check as a Python constraint (``_State``).

Eq. 2 and the counting part of Eq. 3 are plain ``pywrapcp`` constraints (built by
``repairer.MCMRepairer``); what needs Python lives here: the chip graph of the bound nodes as bitmasks
with reachability tables, the exact "star" test of a value against a node's bound neighbours, forward
checking, the skip-edge rule and Hall's condition for the empty chips that must be used, all undone on
backtracking through a trail (package doc, "Model").
"""

from __future__ import annotations

from ortools.constraint_solver import pywrapcp

from .common import _bits, _span


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
