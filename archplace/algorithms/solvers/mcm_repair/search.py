"""The search of one repair stage: Algorithms 1 (SAMPLE) and 2 (FIX) as a ``pywrapcp.PyDecisionBuilder``.

``_RepairBuilder`` returns ``AssignVariableValue`` decisions along the node order, skips the values that
fail the star test of ``propagation._State``, and fails the search past its deadline or failure limit;
the restart stages that run it one after another are in ``repairer`` (package doc, "Search").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
from ortools.constraint_solver import pywrapcp

from .common import _bits

if TYPE_CHECKING:  # annotations only; repairer imports this module
    from .repairer import MCMRepairer


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
