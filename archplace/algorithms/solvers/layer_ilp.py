"""Phaze's per-layer schedule ILP (spec ``phaze.md`` §4; paper Section 4, Figure 3, Appendix A).

One layer (or TMP layer slice), forward or backward, is a DAG of operators. Each operator runs
either *intra-op parallel* (``y_i = 1``: on all cores of its type, latency ℓ̂_i, and nothing else
runs at the same time) or on one core (latency ℓ_i): a tensor core (TC-operator), a vector core
(VC-operator) or a paired tensor+vector core with the same index ``c < min(num_tc, num_vc)`` (fused
operator). The ILP minimises the makespan ``T``.

Formulation (Figure 3; all sixteen families are emitted by both backends):

- (1) ``T ≥ t_i + p_i``; (2) ``p_i = y_i ℓ̂_i + (1 − y_i) ℓ_i`` (an explicit variable ``p_i``);
- (3) ``x_ij + x_ji ≤ 1``; (4) ``x_ik ≥ x_ij + x_jk − 1``; (5) ``x_ij = 1`` and (6) ``x_ji = 0`` for
  ``i ≺ j``; (7) ``t_i + p_i ≤ t_j`` for ``i ≺ j``; (8) ``t_i + p_i − H(1 − x_ij) ≤ t_j`` and
  (9) ``x_ij + x_ji ≥ y_i`` for incomparable ``i, j``;
- (10)/(11) ``y_i + Σ_c z_ic = 1`` per core type the op needs; (12)/(13) ``z = 0`` for the type an
  op does not use; (14) ``z^tc_ic = z^vc_ic`` for fused ops; (15)/(16) same-core incomparable ops
  are ordered.

``x`` exists for every ordered pair ``i ≠ j`` (``n(n−1)`` binaries) and (5)/(6) fix the comparable
ones. Instances that are tautologies once (5), (6), (12), (13) have fixed their constants are not
emitted: (3) for comparable pairs, (4) for triples where ``x_ik`` is fixed to 1 or ``x_ij`` / ``x_jk``
to 0, (15)/(16) for pairs where one op cannot use that core type. Big-M ``H = min(Σ ℓ̂, Σ ℓ)``
(spec §11.3); it is a valid bound because both "all sequential" schedules are feasible, so the
optimum is ``≤ H`` and CP-SAT's time domains are ``[0, H]``.

Core indices (0-based here; 1-based in the paper) are only needed up to ``K_tc = min(num_tc, n_tc)``
where ``n_tc`` counts the ops that can use a tensor core (TC and fused), likewise ``K_vc``: any
valid assignment can be relabelled into those ranges (permute the pairs used by fused ops jointly
to the front, the other used cores of each side after them). ``z_ic = 0`` for fused ops on
unpaired cores ``c >= min(num_tc, num_vc)`` is the "implied constraint" the paper mentions, added
whenever z-variables of a type exist (it matters when only one type has them).

Lazy resource constraints (Appendix A, spec §4.5): round 0 omits every z-variable and (10)–(16).
The solution is rebuilt into a float schedule (below) and the peak number of cores of each type in
use is counted (intra-op TC op: all ``num_tc``; intra VC: all ``num_vc``; intra fused: ``min`` of
each; otherwise 1, fused 1 TC + 1 VC). An over-subscribed type gets its z-variables and
constraints back and the ILP is re-solved; ``lazy_rounds`` counts these additions. Counting alone
is not sufficient when fused ops exist (a fused op needs *the same* index on both sides, a
pre-colouring problem): so when the counts fit, cores are assigned by an exact bounded colouring
search, and if that fails the types without z-variables are added back too. The returned core
assignment therefore always satisfies the paper's constraints; it comes from ``z`` for types that
have z-variables, from the colouring otherwise.

Rebuilding a solution: the solver's ``x`` (a strict partial order containing ``≺``), plus the
interval order of the solver's start times (``t``-order, ties broken by topological rank), defines a
DAG; every op starts as soon as its predecessors in that DAG finish, with the *float* latency of its
chosen mode. Everything the solver separated stays separated, so the schedule is valid; its
makespan is what is reported (``makespan_s``), computed from the float ℓ/ℓ̂.

CP-SAT integer scaling: CP-SAT needs integer times. Latencies are rounded to multiples of
``res = H · 2**-30`` (``TIME_RESOLUTION_REL``; ``H_int ≈ 1.07e9`` fits easily in CP-SAT's int64
domains). Each rounded latency is within ``res/2`` of the float one, so along any chain of at most
``n`` ops a makespan moves by at most ``n·res/2``. Hence the reported makespan of a schedule that is
optimal for the rounded problem exceeds the true optimum by at most ``n·res = n·H·2**-30`` (about
``1.2e-7·H`` for 130 ops); in relative terms at most ``n·2**-30·H/T*``. The HiGHS backend keeps
float latencies (times in units of ``H/1000`` for numerics); its error is its feasibility
tolerance (``1e-6`` of a unit, i.e. ``1e-9·H``) before the float rebuild removes it.

Time limits never crash: a solve that ends without a solution returns a greedy list schedule
(critical-path priority, per-op greedy intra-op choice, explicit cores; or the sequential schedule
when that is shorter) with status ``"fallback"`` and its gap against the solver's bound (NaN when
there is none).

What makes CP-SAT fast on real layers (none of it changes the optimum; details in each function):

- series decomposition (``_solve_layer``): when every op of a prefix of the DAG precedes every
  other op, the segments are solved separately and concatenated (exact);
- implied global constraints and one dominance rule (``_cpsat_redundant``): a chain bound
  ``T ≥ Σ y_i ℓ̂_i + Σ_{i∈C} (1−y_i) ℓ_i`` for every chain C, exclusivity and per-type capacity as
  cumulatives over optional fixed-size intervals, a no-overlap per core when z exists, an energy
  bound, and ``y_i = 0`` when ``ℓ̂_i ≥ ℓ_i``; core-relabelling symmetry breaking
  (``_cpsat_symmetry``); the bound of an earlier lazy round as a lower bound on ``T``;
- hints: the greedy/sequential schedule; on 8+ ops, if a 1 s first attempt does not prove
  optimality, a schedule from a compact interval model (``_warm_start``), then the lazy rounds go on.
  Finding good incumbents, not the bound, is what takes CP-SAT long on these instances.

The HiGHS backend gets the formulation only (no redundant constraints), which keeps it an
independent cross-check; HiGHS's MIP symmetry detection is switched off (it returned a suboptimal
point as optimal on one random 7-op instance). OR-Tools and highspy ship clashing copies of
``libhighs.so.1``, so HiGHS runs in a worker subprocess (see ``_call_isolated``).

This module must not import ray.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

KIND_TC, KIND_VC, KIND_FUSED = 0, 1, 2
KIND_NAMES = ("tc", "vc", "fused")
# graph ``core`` column -> ILP kind; "comm" (TMP AllReduce) runs on the vector core (Phaze Table 3);
# "none" (shape-only, zero latency) ops are dropped with precedence kept through them.
CORE_TO_KIND = {"tensor": KIND_TC, "vector": KIND_VC, "fused": KIND_FUSED, "comm": KIND_VC}
TIME_RESOLUTION_REL = 2.0 ** -30  # CP-SAT time unit as a fraction of H
MILP_TIME_UNITS = 1000.0  # HiGHS: H is this many time units
BACKENDS = ("cpsat", "milp")
STATUSES = ("optimal", "feasible", "fallback", "trivial")
_COLOUR_NODE_LIMIT = 200_000


# ====================================================================== problem
@dataclass(frozen=True, eq=False)
class LayerProblem:
    """One layer's (or slice's) scheduling instance. Arrays are indexed by op (0..n-1).

    ``kind``: 0 TC-operator, 1 VC-operator, 2 fused operator. ``latency_s`` is ℓ (one core, or one
    fused pair), ``intra_latency_s`` is ℓ̂ (all cores of the op's type). ``edge_src``/``edge_dst``
    are data dependences (deduplicated and sorted on construction).
    """

    kind: np.ndarray
    latency_s: np.ndarray
    intra_latency_s: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    num_tc: int
    num_vc: int
    names: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        kind = np.asarray(self.kind)
        n = kind.shape[0] if kind.ndim == 1 else -1
        if kind.ndim != 1:
            raise ValueError(f"kind must be a 1-d array, got shape {kind.shape}")
        if n and not np.issubdtype(kind.dtype, np.integer):
            raise ValueError(f"kind must hold integers 0 (TC), 1 (VC), 2 (fused); got dtype {kind.dtype}")
        kind = kind.astype(np.int8)
        bad = (kind < 0) | (kind > 2)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"op {self._label(i)}: kind {kind[i]} is not 0 (TC), 1 (VC) or 2 (fused)")
        lat = {}
        for f in ("latency_s", "intra_latency_s"):
            a = np.asarray(getattr(self, f), dtype=np.float64)
            if a.shape != (n,):
                raise ValueError(f"{f} has shape {a.shape}, expected ({n},)")
            badl = ~np.isfinite(a) | (a < 0)
            if badl.any():
                i = int(np.flatnonzero(badl)[0])
                raise ValueError(f"op {self._label(i)}: {f} is {a[i]}, must be a finite number >= 0")
            lat[f] = a
        for f in ("num_tc", "num_vc"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{f} must be an integer >= 1, got {v!r}")
        src = np.asarray(self.edge_src).astype(np.int64).ravel()
        dst = np.asarray(self.edge_dst).astype(np.int64).ravel()
        if src.shape != dst.shape:
            raise ValueError(f"edge_src has {src.size} entries but edge_dst has {dst.size}")
        if src.size:
            out = (src < 0) | (src >= n) | (dst < 0) | (dst >= n)
            if out.any():
                e = int(np.flatnonzero(out)[0])
                raise ValueError(f"edge {e} ({src[e]} -> {dst[e]}) names an op outside 0..{n - 1}")
            if (src == dst).any():
                e = int(np.flatnonzero(src == dst)[0])
                raise ValueError(f"op {self._label(int(src[e]))}: an edge to itself makes a cycle")
            pairs = np.unique(src * max(n, 1) + dst)
            src, dst = pairs // n, pairs % n
        if self.names is not None:
            names = tuple(str(s) for s in self.names)
            if len(names) != n:
                raise ValueError(f"names has {len(names)} entries, expected {n}")
            object.__setattr__(self, "names", names)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "latency_s", lat["latency_s"])
        object.__setattr__(self, "intra_latency_s", lat["intra_latency_s"])
        object.__setattr__(self, "edge_src", src)
        object.__setattr__(self, "edge_dst", dst)
        object.__setattr__(self, "num_tc", int(self.num_tc))
        object.__setattr__(self, "num_vc", int(self.num_vc))
        self._topo()  # raises on a cycle
        for a in (kind, lat["latency_s"], lat["intra_latency_s"], src, dst):
            a.setflags(write=False)

    def _label(self, i: int) -> str:
        if self.names is not None and i < len(self.names):
            return f"{i} ({self.names[i]})"
        return str(i)

    # ------------------------------------------------------------------ structure
    @property
    def num_ops(self) -> int:
        return int(self.kind.shape[0])

    @property
    def num_pairs(self) -> int:
        """Fused cores: tensor core c paired with vector core c for c < min(num_tc, num_vc)."""
        return min(self.num_tc, self.num_vc)

    def _topo(self) -> np.ndarray:
        cached = self.__dict__.get("_topo_cache")
        if cached is not None:
            return cached
        n = self.num_ops
        indeg = np.bincount(self.edge_dst, minlength=n)
        succ = [[] for _ in range(n)]
        for s, d in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            succ[s].append(d)
        ready = [i for i in range(n) if indeg[i] == 0]
        ready.reverse()
        order = []
        indeg = indeg.copy()
        while ready:
            u = ready.pop()
            order.append(u)
            for v in succ[u]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    ready.append(v)
        if len(order) != n:
            stuck = int(np.flatnonzero(indeg > 0)[0])
            raise ValueError(f"op {self._label(stuck)} lies on a cycle; a layer graph must be acyclic")
        out = np.asarray(order, dtype=np.int64)
        self.__dict__["_topo_cache"] = out
        return out

    def topo_order(self) -> np.ndarray:
        return self._topo()

    def reach(self) -> np.ndarray:
        """``reach[i, j]``: ``i ≺ j`` (a path i -> j in the DAG, i ≠ j)."""
        cached = self.__dict__.get("_reach_cache")
        if cached is not None:
            return cached
        n = self.num_ops
        r = np.zeros((n, n), dtype=bool)
        succ: list[list[int]] = [[] for _ in range(n)]
        for s, d in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            succ[s].append(d)
        for u in self._topo()[::-1].tolist():
            for v in succ[u]:
                r[u, v] = True
                r[u] |= r[v]
        r.setflags(write=False)
        self.__dict__["_reach_cache"] = r
        return r

    def predecessors(self) -> list[list[int]]:
        pred: list[list[int]] = [[] for _ in range(self.num_ops)]
        for s, d in zip(self.edge_src.tolist(), self.edge_dst.tolist()):
            pred[d].append(s)
        return pred

    def horizon_s(self) -> float:
        """Big-M ``H = min(Σ ℓ̂, Σ ℓ)`` (spec §11.3)."""
        return float(min(self.intra_latency_s.sum(), self.latency_s.sum()))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_graph(cls, sub: Any, single_s: Any, all_s: Any, num_tc: int, num_vc: int) -> LayerProblem:
        """From one layer's forward or backward subgraph (an ``OpGraph``) and its per-row ℓ
        (``single_s``) and ℓ̂ (``all_s``). Ops with core ``none`` are dropped; each dropped op's
        predecessors are connected to its successors (transitively through chains of dropped ops)."""
        n = sub.num_nodes
        single_s = np.asarray(single_s, dtype=np.float64)
        all_s = np.asarray(all_s, dtype=np.float64)
        for f, a in (("single_s", single_s), ("all_s", all_s)):
            if a.shape != (n,):
                raise ValueError(f"{f} has shape {a.shape}, expected ({n},): one latency per graph row")
        src, dst = sub.edge_pos
        return _problem_from_rows(sub.nodes["core"], sub.nodes["name"], src, dst, single_s, all_s,
                                  num_tc, num_vc, sub.topo_order())


def _problem_from_rows(core: np.ndarray, names: np.ndarray, src: np.ndarray, dst: np.ndarray,
                       single_s: np.ndarray, all_s: np.ndarray, num_tc: int, num_vc: int,
                       topo: np.ndarray) -> LayerProblem:
    """Rows 0..len(core)-1 with local edge positions ``src -> dst`` and a topological order."""
    n = len(core)
    kind = np.full(n, -1, dtype=np.int64)
    for i, c in enumerate(core):
        if c == "none":
            continue
        if c not in CORE_TO_KIND:
            raise ValueError(f"row {i} ({names[i]}): core {c!r} unknown; allowed: "
                             f"{sorted(CORE_TO_KIND) + ['none']}")
        kind[i] = CORE_TO_KIND[c]
    keep = kind >= 0
    new = np.cumsum(keep) - 1
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(np.asarray(src).tolist(), np.asarray(dst).tolist()):
        preds[d].append(s)
    front: list[frozenset] = [frozenset()] * n  # nearest kept ancestors (itself when kept)
    es: list[int] = []
    ed: list[int] = []
    for u in np.asarray(topo).tolist():
        inc = frozenset().union(*(front[p] for p in preds[u])) if preds[u] else frozenset()
        if keep[u]:
            nu = int(new[u])
            es.extend(inc)
            ed.extend([nu] * len(inc))
            front[u] = frozenset((nu,))
        else:
            front[u] = inc
    return LayerProblem(kind[keep], single_s[keep], all_s[keep], np.asarray(es, dtype=np.int64),
                        np.asarray(ed, dtype=np.int64), num_tc, num_vc,
                        tuple(str(s) for s in np.asarray(names)[keep]))


# ====================================================================== schedule
@dataclass
class LayerSchedule:
    """A schedule: per op its start, whether it runs intra-op parallel and its cores.

    ``tc_core``/``vc_core`` are -1 for intra-op ops and for ops not of that type (0-based; fused ops
    have equal indices). ``gap`` is the proven relative gap ``1 − bound/makespan`` (0 when optimal,
    NaN when no bound is known). ``lazy_rounds`` counts how many times z-constraints were added back.
    """

    makespan_s: float
    start_s: np.ndarray
    intra: np.ndarray
    tc_core: np.ndarray
    vc_core: np.ndarray
    status: str
    gap: float
    solver: str
    solve_time_s: float
    lazy_rounds: int = 0
    bound_s: float = float("nan")
    from_cache: bool = False

    def durations(self, problem: LayerProblem) -> np.ndarray:
        return np.where(self.intra, problem.intra_latency_s, problem.latency_s)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, np.ndarray):
                d[k] = v.tolist()
        d.pop("from_cache")
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerSchedule:
        d = dict(d)
        d["start_s"] = np.asarray(d["start_s"], dtype=np.float64)
        d["intra"] = np.asarray(d["intra"], dtype=bool)
        d["tc_core"] = np.asarray(d["tc_core"], dtype=np.int64)
        d["vc_core"] = np.asarray(d["vc_core"], dtype=np.int64)
        d["gap"] = float("nan") if d.get("gap") is None else float(d["gap"])
        d["bound_s"] = float("nan") if d.get("bound_s") is None else float(d["bound_s"])
        return cls(**d)

    def copy(self, **changes: Any) -> LayerSchedule:
        out = dataclasses.replace(self, **changes)
        for f in ("start_s", "intra", "tc_core", "vc_core"):
            setattr(out, f, getattr(out, f).copy())
        return out


def _conflicts(start: np.ndarray, end: np.ndarray, tol: float = 0.0) -> np.ndarray:
    """``C[i, j]``: i and j run at the same time (open-interval overlap; a zero-length op at t
    conflicts with ops running strictly across t). Diagonal False."""
    c = (start[:, None] < end[None, :] - tol) & (start[None, :] < end[:, None] - tol)
    np.fill_diagonal(c, False)
    return c


def check_schedule(problem: LayerProblem, schedule: LayerSchedule, rel_tol: float = 1e-9) -> None:
    """Raise ``ValueError`` on any violated constraint: precedence, exclusivity of intra-op ops,
    one op per core at a time, core index ranges, fused pairing, and the reported makespan."""
    n = problem.num_ops
    s = np.asarray(schedule.start_s, dtype=np.float64)
    intra = np.asarray(schedule.intra, dtype=bool)
    tc = np.asarray(schedule.tc_core, dtype=np.int64)
    vc = np.asarray(schedule.vc_core, dtype=np.int64)
    for f, a in (("start_s", s), ("intra", intra), ("tc_core", tc), ("vc_core", vc)):
        if a.shape != (n,):
            raise ValueError(f"schedule.{f} has shape {a.shape}, expected ({n},)")
    if n == 0:
        if abs(schedule.makespan_s) > 0:
            raise ValueError(f"empty problem but makespan {schedule.makespan_s}")
        return
    if not np.isfinite(s).all() or (s < 0).any():
        raise ValueError("start times must be finite and >= 0")
    d = schedule.durations(problem)
    e = s + d
    span = float(e.max())
    tol = rel_tol * max(span, problem.horizon_s(), 1e-300)
    lab = problem._label
    if abs(schedule.makespan_s - span) > tol:
        raise ValueError(f"makespan_s {schedule.makespan_s} != latest finish {span}")
    for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        if e[a] > s[b] + tol:
            raise ValueError(f"precedence {lab(a)} -> {lab(b)} violated: {lab(a)} ends at {e[a]}, "
                             f"{lab(b)} starts at {s[b]}")
    k = problem.kind
    uses_tc = (k == KIND_TC) | (k == KIND_FUSED)
    uses_vc = (k == KIND_VC) | (k == KIND_FUSED)
    for i in range(n):
        if intra[i]:
            if tc[i] != -1 or vc[i] != -1:
                raise ValueError(f"op {lab(i)} is intra-op parallel but has cores ({tc[i]}, {vc[i]})")
            continue
        if uses_tc[i] and not 0 <= tc[i] < problem.num_tc:
            raise ValueError(f"op {lab(i)}: tensor core {tc[i]} outside 0..{problem.num_tc - 1}")
        if uses_vc[i] and not 0 <= vc[i] < problem.num_vc:
            raise ValueError(f"op {lab(i)}: vector core {vc[i]} outside 0..{problem.num_vc - 1}")
        if not uses_tc[i] and tc[i] != -1:
            raise ValueError(f"op {lab(i)} is a {KIND_NAMES[k[i]]} op but has tensor core {tc[i]}")
        if not uses_vc[i] and vc[i] != -1:
            raise ValueError(f"op {lab(i)} is a {KIND_NAMES[k[i]]} op but has vector core {vc[i]}")
        if k[i] == KIND_FUSED and (tc[i] != vc[i] or tc[i] >= problem.num_pairs):
            raise ValueError(f"fused op {lab(i)} runs on tensor core {tc[i]} and vector core {vc[i]}; "
                             f"it needs a pair c = c < {problem.num_pairs}")
    c = _conflicts(s, e, tol)
    ii, jj = np.nonzero(np.triu(c))
    for i, j in zip(ii.tolist(), jj.tolist()):
        if intra[i] or intra[j]:
            w = i if intra[i] else j
            raise ValueError(f"op {lab(w)} is intra-op parallel but overlaps op {lab(j if w == i else i)}")
        if tc[i] >= 0 and tc[i] == tc[j]:
            raise ValueError(f"ops {lab(i)} and {lab(j)} overlap on tensor core {tc[i]}")
        if vc[i] >= 0 and vc[i] == vc[j]:
            raise ValueError(f"ops {lab(i)} and {lab(j)} overlap on vector core {vc[i]}")


# ====================================================================== helpers
def _min_dur(problem: LayerProblem) -> np.ndarray:
    return np.minimum(problem.latency_s, problem.intra_latency_s)


def _tails(problem: LayerProblem, dur: np.ndarray) -> np.ndarray:
    """Longest path from each op to a sink, own duration included."""
    n = problem.num_ops
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        succ[s].append(d)
    tail = np.zeros(n)
    for u in problem.topo_order()[::-1].tolist():
        tail[u] = dur[u] + max((tail[v] for v in succ[u]), default=0.0)
    return tail


def _rank(problem: LayerProblem) -> np.ndarray:
    r = np.empty(problem.num_ops, dtype=np.int64)
    r[problem.topo_order()] = np.arange(problem.num_ops)
    return r


def _asap(order_rel: np.ndarray, dur: np.ndarray) -> np.ndarray | None:
    """Earliest starts along the DAG ``order_rel`` (bool n×n, i before j); None when cyclic."""
    n = len(dur)
    indeg = order_rel.sum(axis=0).astype(np.int64)
    start = np.zeros(n)
    ready = list(np.flatnonzero(indeg == 0))
    seen = 0
    while ready:
        u = ready.pop()
        seen += 1
        succ = np.flatnonzero(order_rel[u])
        if succ.size:
            np.maximum.at(start, succ, start[u] + dur[u])
            indeg[succ] -= 1
            ready.extend(succ[indeg[succ] == 0].tolist())
    return start if seen == n else None


def _core_usage(problem: LayerProblem, start: np.ndarray, dur: np.ndarray,
                intra: np.ndarray) -> tuple[int, int]:
    """Peak tensor and vector cores in use (spec §4.5 counting)."""
    n = problem.num_ops
    if n == 0:
        return 0, 0
    k = problem.kind
    m = problem.num_pairs
    w_tc = np.where(intra, np.where(k == KIND_TC, problem.num_tc, np.where(k == KIND_FUSED, m, 0)),
                    np.where(k == KIND_VC, 0, 1))
    w_vc = np.where(intra, np.where(k == KIND_VC, problem.num_vc, np.where(k == KIND_FUSED, m, 0)),
                    np.where(k == KIND_TC, 0, 1))
    end = start + dur
    pos = dur > 0
    # positive-length ops active at the start point of op i: s_j <= s_i < e_j ...
    at_start = (start[None, :] <= start[:, None]) & (start[:, None] < end[None, :]) & pos[None, :]
    # ... and, for a zero-length op i, those strictly across its instant, plus i itself
    across = (start[None, :] < start[:, None]) & (start[:, None] < end[None, :]) & pos[None, :]
    act = np.where(pos[:, None], at_start, across)
    act[np.arange(n), np.arange(n)] = True
    return int((act * w_tc[None, :]).sum(axis=1).max()), int((act * w_vc[None, :]).sum(axis=1).max())


def _assign_cores(problem: LayerProblem, start: np.ndarray, dur: np.ndarray, intra: np.ndarray,
                  fixed_tc: np.ndarray | None = None, fixed_vc: np.ndarray | None = None,
                  node_limit: int = _COLOUR_NODE_LIMIT) -> tuple[np.ndarray, np.ndarray] | None:
    """Exact (bounded) colouring of a fixed-time schedule with explicit cores: ops in start order,
    each tries every compatible core, interchangeable empty cores tried once. Assignments in
    ``fixed_*`` (>= 0) are kept. Returns (tc_core, vc_core) or None when none is found within
    ``node_limit`` search nodes."""
    n = problem.num_ops
    k = problem.kind
    ntc, nvc, m = problem.num_tc, problem.num_vc, problem.num_pairs
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    need_tc = ~intra & (k != KIND_VC)
    need_vc = ~intra & (k != KIND_TC)
    if fixed_tc is not None:
        tc[need_tc] = np.where(fixed_tc[need_tc] >= 0, fixed_tc[need_tc], -1)
    if fixed_vc is not None:
        vc[need_vc] = np.where(fixed_vc[need_vc] >= 0, fixed_vc[need_vc], -1)
    conf = _conflicts(start, start + dur)
    conf_list = [np.flatnonzero(conf[i]).tolist() for i in range(n)]
    todo = [i for i in np.lexsort((_rank(problem), start)).tolist()
            if (need_tc[i] and tc[i] < 0) or (need_vc[i] and vc[i] < 0)]
    tc_cnt = np.bincount(tc[tc >= 0], minlength=ntc).tolist()
    vc_cnt = np.bincount(vc[vc >= 0], minlength=nvc).tolist()
    tcl, vcl = tc.tolist(), vc.tolist()
    nodes = [0]

    def free_tc(i: int, c: int) -> bool:
        return all(tcl[j] != c for j in conf_list[i])

    def free_vc(i: int, c: int) -> bool:
        return all(vcl[j] != c for j in conf_list[i])

    def options(i: int) -> list[tuple[int, int]]:
        out = []
        seen_empty: set[str] = set()
        want_tc = need_tc[i] and tcl[i] < 0
        want_vc = need_vc[i] and vcl[i] < 0
        if k[i] == KIND_FUSED:
            cands = range(m)
            if not want_tc:
                cands = [tcl[i]] if tcl[i] < m else []
            elif not want_vc:
                cands = [vcl[i]] if vcl[i] < m else []
            for c in cands:
                if want_tc and want_vc and tc_cnt[c] == 0 and vc_cnt[c] == 0:
                    if "pair" in seen_empty:
                        continue
                    seen_empty.add("pair")
                if (not want_tc or free_tc(i, c)) and (not want_vc or free_vc(i, c)):
                    out.append((c if want_tc else -1, c if want_vc else -1))
            return out
        if want_tc:
            for c in range(ntc):
                empty = tc_cnt[c] == 0 and (c >= m or vc_cnt[c] == 0)
                cls = "pair" if c < m else "extra"
                if empty:
                    if cls in seen_empty:
                        continue
                    seen_empty.add(cls)
                if free_tc(i, c):
                    out.append((c, -1))
        else:
            for c in range(nvc):
                empty = vc_cnt[c] == 0 and (c >= m or tc_cnt[c] == 0)
                cls = "pair" if c < m else "extra"
                if empty:
                    if cls in seen_empty:
                        continue
                    seen_empty.add(cls)
                if free_vc(i, c):
                    out.append((-1, c))
        return out

    def dfs(pos: int) -> bool:
        if pos == len(todo):
            return True
        nodes[0] += 1
        if nodes[0] > node_limit:
            return False
        i = todo[pos]
        for a, b in options(i):
            if a >= 0:
                tcl[i] = a
                tc_cnt[a] += 1
            if b >= 0:
                vcl[i] = b
                vc_cnt[b] += 1
            if dfs(pos + 1):
                return True
            if a >= 0:
                tcl[i] = -1
                tc_cnt[a] -= 1
            if b >= 0:
                vcl[i] = -1
                vc_cnt[b] -= 1
        return False

    import sys
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * n + 100))
    try:
        ok = dfs(0)
    finally:
        sys.setrecursionlimit(old)
    if not ok:
        return None
    return np.asarray(tcl, dtype=np.int64), np.asarray(vcl, dtype=np.int64)


class _Timelines:
    """Busy intervals per core (TC c -> c, VC c -> num_tc + c) for serial schedule generation."""

    def __init__(self, num_tc: int, num_vc: int) -> None:
        self.num_tc = num_tc
        self.busy: list[list[tuple[float, float]]] = [[] for _ in range(num_tc + num_vc)]

    def earliest(self, res: list[int], release: float, d: float) -> float:
        cands = sorted({release, *(e for r in res for _, e in self.busy[r] if e > release)})
        for t in cands:
            if all(not (a < t + d and t < b) for r in res for a, b in self.busy[r]):
                return t
        raise AssertionError("unreachable: the latest end is always feasible")

    def add(self, res: list[int], s: float, e: float) -> None:
        for r in res:
            self.busy[r].append((s, e))


def _mode_resources(problem: LayerProblem, i: int, intra: bool, c: int) -> list[int]:
    if intra:
        return list(range(problem.num_tc + problem.num_vc))
    k = problem.kind[i]
    if k == KIND_TC:
        return [c]
    if k == KIND_VC:
        return [problem.num_tc + c]
    return [c, problem.num_tc + c]


def _finish(problem: LayerProblem, start: np.ndarray, intra: np.ndarray, tc: np.ndarray,
            vc: np.ndarray, status: str, solver: str, t0: float, gap: float = 0.0,
            bound_s: float = float("nan"), lazy_rounds: int = 0) -> LayerSchedule:
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    span = float((start + dur).max()) if problem.num_ops else 0.0
    return LayerSchedule(span, np.asarray(start, dtype=np.float64), np.asarray(intra, dtype=bool),
                         np.asarray(tc, dtype=np.int64), np.asarray(vc, dtype=np.int64), status, gap,
                         solver, time.perf_counter() - t0, lazy_rounds, bound_s)


def sequential_schedule(problem: LayerProblem) -> LayerSchedule:
    """Phaze's "sequential scheduling" baseline (Appendix D): every operator intra-op parallel, one
    after another in topological order; makespan = Σ ℓ̂."""
    t0 = time.perf_counter()
    n = problem.num_ops
    start = np.zeros(n)
    order = problem.topo_order()
    d = problem.intra_latency_s[order]
    start[order] = np.concatenate(([0.0], np.cumsum(d)[:-1])) if n else d
    neg = np.full(n, -1, dtype=np.int64)
    return _finish(problem, start, np.ones(n, bool), neg, neg.copy(), "feasible", "sequential", t0,
                   gap=float("nan"))


def greedy_schedule(problem: LayerProblem) -> LayerSchedule:
    """Critical-path list scheduling: the ready op with the longest tail (min(ℓ, ℓ̂) durations)
    goes next, in the mode (intra-op, or a specific core / fused pair) that finishes it earliest,
    inserted into the earliest feasible gap. Ties prefer non-intra and low core indices."""
    tail = _tails(problem, _min_dur(problem))
    rank = _rank(problem)
    return _list_schedule(problem, lambda j: (-tail[j], rank[j]), None, "greedy")


def _list_schedule(problem: LayerProblem, priority: Any, modes: np.ndarray | None, name: str
                   ) -> LayerSchedule:
    """Serial schedule generation with explicit cores: the ready op with the smallest
    ``priority(op)`` goes next, at the earliest feasible time, in its given mode (``modes[i]``:
    intra-op or not) or, when ``modes`` is None, the mode and core that finish it earliest."""
    t0 = time.perf_counter()
    n = problem.num_ops
    pred = problem.predecessors()
    npred = np.array([len(p) for p in pred])
    succ: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        succ[s].append(d)
    tl = _Timelines(problem.num_tc, problem.num_vc)
    start = np.zeros(n)
    end = np.zeros(n)
    intra = np.zeros(n, bool)
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    ready = [i for i in range(n) if npred[i] == 0]
    left = npred.copy()
    k = problem.kind
    while ready:
        i = min(ready, key=priority)
        ready.remove(i)
        rel = max((end[p] for p in pred[i]), default=0.0)
        ncores = problem.num_tc if k[i] == KIND_TC else problem.num_vc if k[i] == KIND_VC \
            else problem.num_pairs
        best = None
        if modes is None or not modes[i]:
            for c in range(ncores):
                res = _mode_resources(problem, i, False, c)
                s = tl.earliest(res, rel, problem.latency_s[i])
                key = (s + problem.latency_s[i], 0, c)
                if best is None or key < best[0]:
                    best = (key, s, False, c, res)
        if modes is None or modes[i]:
            res = _mode_resources(problem, i, True, -1)
            s = tl.earliest(res, rel, problem.intra_latency_s[i])
            key = (s + problem.intra_latency_s[i], 1, 0)
            if best is None or key < best[0]:
                best = (key, s, True, -1, res)
        _, s, yi, c, res = best
        d = problem.intra_latency_s[i] if yi else problem.latency_s[i]
        start[i], end[i], intra[i] = s, s + d, yi
        if not yi:
            if k[i] != KIND_VC:
                tc[i] = c
            if k[i] != KIND_TC:
                vc[i] = c
        tl.add(res, s, s + d)
        for v in succ[i]:
            left[v] -= 1
            if left[v] == 0:
                ready.append(v)
    return _finish(problem, start, intra, tc, vc, "feasible", name, t0, gap=float("nan"))


def _repair(problem: LayerProblem, start: np.ndarray, intra: np.ndarray) -> LayerSchedule:
    """A valid schedule close to an over-subscribed one (a lazy round's solution): list scheduling
    in its start order, once with its modes kept and once choosing modes greedily; the better."""
    rank = _rank(problem)
    prio = {i: (float(start[i]), int(rank[i])) for i in range(problem.num_ops)}
    a = _list_schedule(problem, prio.__getitem__, intra, "repaired lazy-round schedule")
    b = _list_schedule(problem, prio.__getitem__, None, "repaired lazy-round schedule")
    return a if a.makespan_s <= b.makespan_s else b


def _heuristic(problem: LayerProblem) -> LayerSchedule:
    g = greedy_schedule(problem)
    s = sequential_schedule(problem)
    return g if g.makespan_s <= s.makespan_s else s


# ====================================================================== exhaustive reference
def exhaustive_schedule(problem: LayerProblem, max_ops: int = 7) -> LayerSchedule:
    """Exact optimum by enumeration, without an LP/CP solver (reference for tiny instances).

    Modes: per op, intra-op (using every core, so nothing overlaps it) or one explicit core (TC
    core c / VC core c / fused pair c < min(num_tc, num_vc)). For a fixed mode vector the problem is
    an RCPSP with unary resources. The serial schedule-generation scheme (SSGS: take the ops in
    list order, start each at the earliest time that respects its predecessors and is free on its
    cores over its whole duration, gaps included) is exact over all lists: given any optimal
    schedule S, SSGS on the list sorted by S's start times (ties by topological rank) starts every
    op no later than in S (induction: an earlier-placed op i that shared a core with j ended before
    s_j in S and now ends no later, so s_j is still free for j), hence is optimal too. Iterating this
    strictly decreases Σ starts until a fixed point, an optimal schedule that SSGS reproduces from
    its own (start, rank)-sorted list. So the depth-first search below enumerates lists whose SSGS
    starts are non-decreasing in (start, rank), with every mode per op, and is exact. Two further
    reductions keep exactness: intra-op is tried only when ℓ̂ < ℓ (otherwise running it on a free
    core over a sub-interval is no worse), and among cores that nothing uses yet, interchangeable
    ones (empty pairs; empty unpaired cores of one type) are tried once (relabelling). Branches
    whose critical-path lower bound cannot beat the incumbent are cut.
    """
    t0 = time.perf_counter()
    n = problem.num_ops
    if n > max_ops:
        raise ValueError(f"exhaustive_schedule is for tiny instances: {n} ops > max_ops={max_ops}")
    if n == 0:
        return _finish(problem, np.zeros(0), np.zeros(0, bool), np.zeros(0, np.int64),
                       np.zeros(0, np.int64), "optimal", "exhaustive", t0)
    ntc, nvc, m = problem.num_tc, problem.num_vc, problem.num_pairs
    lat, lath, kind = problem.latency_s.tolist(), problem.intra_latency_s.tolist(), problem.kind.tolist()
    pred = problem.predecessors()
    topo = problem.topo_order().tolist()
    rank = _rank(problem).tolist()
    mind = [min(a, b) for a, b in zip(lat, lath)]
    tail = _tails(problem, np.asarray(mind)).tolist()
    busy: list[list[tuple[float, float]]] = [[] for _ in range(ntc + nvc)]
    start = [0.0] * n
    end = [0.0] * n
    mode: list[tuple[bool, int]] = [(False, -1)] * n
    done = [False] * n
    best = [math.inf, None]

    def earliest(res: list[int], rel: float, d: float) -> float:
        cands = sorted({rel, *(e for r in res for _, e in busy[r] if e > rel)})
        for t in cands:
            ok = True
            for r in res:
                for a, b in busy[r]:
                    if a < t + d and t < b:
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                return t
        raise AssertionError("unreachable")

    def modes(i: int) -> list[tuple[bool, int, list[int]]]:
        out = []
        if lath[i] < lat[i]:
            out.append((True, -1, list(range(ntc + nvc))))
        seen: set[str] = set()

        def empty_pair(c: int) -> bool:
            return not busy[c] and not busy[ntc + c]

        if kind[i] == KIND_FUSED:
            for c in range(m):
                if empty_pair(c):
                    if "p" in seen:
                        continue
                    seen.add("p")
                out.append((False, c, [c, ntc + c]))
        elif kind[i] == KIND_TC:
            for c in range(ntc):
                if c < m and empty_pair(c) or c >= m and not busy[c]:
                    cls = "p" if c < m else "x"
                    if cls in seen:
                        continue
                    seen.add(cls)
                out.append((False, c, [c]))
        else:
            for c in range(nvc):
                if c < m and empty_pair(c) or c >= m and not busy[ntc + c]:
                    cls = "p" if c < m else "x"
                    if cls in seen:
                        continue
                    seen.add(cls)
                out.append((False, c, [ntc + c]))
        return out

    def lower_bound(cur: float, floor: float) -> float:
        head = [0.0] * n
        lb = cur
        for u in topo:
            if done[u]:
                continue
            h = floor  # the remaining ops start no earlier than the last start (list restriction)
            for p in pred[u]:
                h = max(h, end[p] if done[p] else head[p] + mind[p])
            head[u] = h
            lb = max(lb, h + tail[u])
        return lb

    def dfs(count: int, last: tuple[float, int], cur: float) -> None:
        if count == n:
            if cur < best[0]:
                best[0] = cur
                best[1] = (list(start), list(mode))
            return
        if lower_bound(cur, max(last[0], 0.0)) >= best[0]:
            return
        for i in range(n):
            if done[i] or not all(done[p] for p in pred[i]):
                continue
            rel = max((end[p] for p in pred[i]), default=0.0)
            for yi, c, res in modes(i):
                d = lath[i] if yi else lat[i]
                t = earliest(res, rel, d)
                if (t, rank[i]) <= last:
                    continue
                start[i], end[i], mode[i], done[i] = t, t + d, (yi, c), True
                for r in res:
                    busy[r].append((t, t + d))
                dfs(count + 1, (t, rank[i]), max(cur, t + d))
                for r in res:
                    busy[r].pop()
                done[i] = False

    dfs(0, (-1.0, -1), 0.0)
    s, md = best[1]
    intra = np.array([y for y, _ in md], dtype=bool)
    tc = np.array([c if not y and kind[i] != KIND_VC else -1 for i, (y, c) in enumerate(md)], np.int64)
    vc = np.array([c if not y and kind[i] != KIND_TC else -1 for i, (y, c) in enumerate(md)], np.int64)
    return _finish(problem, np.asarray(s), intra, tc, vc, "optimal", "exhaustive", t0)


# ====================================================================== model structure
@dataclass
class _Spec:
    """Index arrays of every constraint family for one round (``tc``/``vc``: z present)."""

    n: int
    reach: np.ndarray
    inc_i: np.ndarray  # ordered incomparable pairs (i, j), i != j
    inc_j: np.ndarray
    prec_i: np.ndarray  # i ≺ j
    prec_j: np.ndarray
    tri: np.ndarray  # (m, 3) transitivity triples (i, j, k) to emit
    k_tc: int
    k_vc: int
    tc: bool
    vc: bool


def _build_spec(problem: LayerProblem, tc: bool, vc: bool) -> _Spec:
    n = problem.num_ops
    r = problem.reach()
    eye = np.eye(n, dtype=bool)
    inc = ~r & ~r.T & ~eye
    inc_i, inc_j = np.nonzero(inc)
    prec_i, prec_j = np.nonzero(r)
    # F: 1 fixed (i ≺ j), 0 fixed (j ≺ i), -1 variable (incomparable)
    f = np.where(r, 1, np.where(r.T, 0, -1)).astype(np.int8)
    f[eye] = 0
    # keep triples (i, j, k) distinct where the constraint is not a tautology given (5)/(6)
    fij = f[:, :, None]
    fjk = f[None, :, :]
    fik = f[:, None, :]
    keep = (fik != 1) & (fij != 0) & (fjk != 0) & ~((fij == 1) & (fjk == 1))
    keep &= ~eye[:, :, None] & ~eye[None, :, :] & ~eye[:, None, :]
    tri = np.argwhere(keep)
    k = problem.kind
    n_tc = int(((k == KIND_TC) | (k == KIND_FUSED)).sum())
    n_vc = int(((k == KIND_VC) | (k == KIND_FUSED)).sum())
    return _Spec(n, r, inc_i, inc_j, prec_i, prec_j, tri, min(problem.num_tc, n_tc),
                 min(problem.num_vc, n_vc), tc, vc)


@dataclass
class _Raw:
    """What a backend returns for one round."""

    has_solution: bool
    optimal: bool
    obj_s: float
    bound_s: float
    start_s: np.ndarray | None = None
    end_s: np.ndarray | None = None  # solver's own finish times (its latency model)
    y: np.ndarray | None = None
    x: np.ndarray | None = None  # bool n×n
    z_tc: np.ndarray | None = None  # core per op or -1
    z_vc: np.ndarray | None = None
    name: str = ""


def _z_ops(problem: LayerProblem, spec: _Spec) -> tuple[np.ndarray, np.ndarray]:
    k = problem.kind
    return (k != KIND_VC), (k != KIND_TC)  # may use TC / may use VC


# ---------------------------------------------------------------------- CP-SAT
def _solve_cpsat(problem: LayerProblem, spec: _Spec, time_limit_s: float, rel_gap: float,
                 hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    from ortools.sat.python import cp_model

    n = spec.n
    hz = problem.horizon_s()
    res = hz * TIME_RESOLUTION_REL
    li = np.rint(problem.latency_s / res).astype(np.int64)
    lh = np.rint(problem.intra_latency_s / res).astype(np.int64)
    H = int(min(lh.sum(), li.sum()))
    md = cp_model.CpModel()
    T = md.new_int_var(0, H, "T")
    t = [md.new_int_var(0, H, f"t{i}") for i in range(n)]
    p = [md.new_int_var(int(min(li[i], lh[i])), int(max(li[i], lh[i])), f"p{i}") for i in range(n)]
    y = [md.new_bool_var(f"y{i}") for i in range(n)]
    x = np.empty((n, n), dtype=object)
    for i in range(n):
        for j in range(n):
            if i != j:
                x[i, j] = md.new_bool_var(f"x{i}_{j}")
    for i in range(n):
        md.add(T >= t[i] + p[i])  # (1)
        md.add(p[i] == int(li[i]) + int(lh[i] - li[i]) * y[i])  # (2)
        if _CPSAT_REDUNDANT and problem.intra_latency_s[i] >= problem.latency_s[i]:
            md.add(y[i] == 0)  # dominance (see _cpsat_redundant)
    for i, j in zip(*np.nonzero(np.triu(~spec.reach & ~spec.reach.T, 1))):  # (3)
        md.add(x[i, j] + x[j, i] <= 1)
    for i, j, k in spec.tri.tolist():  # (4)
        md.add_bool_or([x[i, k], ~x[i, j], ~x[j, k]])
    for i, j in zip(spec.prec_i.tolist(), spec.prec_j.tolist()):
        md.add(x[i, j] == 1)  # (5)
        md.add(x[j, i] == 0)  # (6)
        md.add(t[i] + p[i] <= t[j])  # (7)
    for i, j in zip(spec.inc_i.tolist(), spec.inc_j.tolist()):
        md.add(t[i] + p[i] - H + H * x[i, j] <= t[j])  # (8)
        md.add(x[i, j] + x[j, i] >= y[i])  # (9)
    use_tc, use_vc = _z_ops(problem, spec)
    z: dict[str, np.ndarray] = {}
    for name, on, kk, use in (("tc", spec.tc, spec.k_tc, use_tc), ("vc", spec.vc, spec.k_vc, use_vc)):
        if not on:
            continue
        zz = np.empty((n, kk), dtype=object)
        for i in range(n):
            for c in range(kk):
                zz[i, c] = md.new_bool_var(f"z{name}{i}_{c}")
        z[name] = zz
        for i in range(n):
            if use[i]:
                md.add(y[i] + sum(zz[i].tolist()) == 1)  # (10)/(11)
                if problem.kind[i] == KIND_FUSED:
                    for c in range(problem.num_pairs, kk):  # implied: fused ops use pairs only
                        md.add(zz[i, c] == 0)
            else:
                for c in range(kk):
                    md.add(zz[i, c] == 0)  # (12)/(13)
        for i, j in zip(*np.nonzero(np.triu(~spec.reach & ~spec.reach.T, 1))):  # (15)/(16)
            if use[i] and use[j]:
                for c in range(kk):
                    md.add_bool_or([x[i, j], x[j, i], ~zz[i, c], ~zz[j, c]])
    if spec.tc and spec.vc:
        for i in np.flatnonzero(problem.kind == KIND_FUSED).tolist():  # (14)
            for c in range(min(spec.k_tc, spec.k_vc)):
                md.add(z["tc"][i, c] == z["vc"][i, c])
    if z and _CPSAT_SYMMETRY:
        _cpsat_symmetry(md, problem, spec, z)
    if _CPSAT_REDUNDANT:
        _cpsat_redundant(md, problem, spec, li, lh, T, t, p, y, z)
    if math.isfinite(lower_bound_s):
        # an earlier lazy round's bound (same integer data, a relaxation of this model) stays valid
        md.add(T >= int(math.floor(lower_bound_s / res + 1e-6)))
    md.minimize(T)
    if hint is not None:
        _cpsat_hint(md, problem, spec, hint, li, lh, T, t, p, y, x, z)
    solver = cp_model.CpSolver()
    prm = solver.parameters
    prm.max_time_in_seconds = max(float(time_limit_s), 1e-6)
    prm.relative_gap_limit = float(rel_gap)
    prm.num_workers = int(num_workers)
    prm.log_search_progress = False
    st = solver.solve(md)
    name = f"cp-sat {_ortools_version()}"
    bound = solver.best_objective_bound
    bound_s = float(bound) * res if math.isfinite(bound) else float("nan")
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _Raw(False, False, float("nan"), bound_s, name=name)
    sol = np.asarray(solver.response_proto.solution, dtype=np.int64)

    def val(a: np.ndarray) -> np.ndarray:
        idx = np.vectorize(lambda v: v.index, otypes=[np.int64])(a)
        return sol[idx]

    ts = val(np.asarray(t, dtype=object)).astype(np.float64)
    ps = val(np.asarray(p, dtype=object)).astype(np.float64)
    ys = val(np.asarray(y, dtype=object)).astype(bool)
    xs = np.zeros((n, n), dtype=bool)
    off = ~np.eye(n, dtype=bool)
    xs[off] = val(x[off]).astype(bool)
    zt = _z_argmax(val(z["tc"]) if "tc" in z and spec.k_tc else None, n)
    zv = _z_argmax(val(z["vc"]) if "vc" in z and spec.k_vc else None, n)
    obj = float(solver.objective_value)
    optimal = st == cp_model.OPTIMAL and obj <= bound
    return _Raw(True, bool(optimal), obj * res, bound_s, ts * res, (ts + ps) * res, ys, xs, zt, zv,
                name)


_CPSAT_REDUNDANT = True
_CPSAT_SYMMETRY = True


def _cpsat_symmetry(md: Any, problem: LayerProblem, spec: _Spec, z: dict) -> None:
    """Core-relabelling symmetry breaking (keeps at least one optimal solution of every class).

    Relabelling the pairs ``c < m`` jointly on both sides, or the unpaired cores of one type among
    themselves, maps solutions to solutions (and, for a type without z-variables, a completion of
    the colouring to a completion). So cores can be numbered by the smallest op index using them:
    op i may use pair c >= 1 only if some op j < i uses pair c - 1; likewise for unpaired cores
    after the first one of each type. ``w_ic`` is the op's z on its own type (a fused op has the
    same c on both sides, so either side describes it; its TC side is used when present).
    """
    n = spec.n
    m = problem.num_pairs
    k = problem.kind

    def w(i: int, c: int, side: str | None = None) -> Any:
        if side is not None:
            zz = z.get(side)
            return zz[i, c] if zz is not None and c < zz.shape[1] else None
        if k[i] == KIND_TC or (k[i] == KIND_FUSED and "tc" in z):
            return w(i, c, "tc")
        if k[i] == KIND_VC or k[i] == KIND_FUSED:
            return w(i, c, "vc")
        return None

    # joint pair ordering: only when each op's pair use is described by one variable per c
    kp = min([zz.shape[1] for zz in z.values()] + [m])
    for i in range(n):
        for c in range(1, kp):
            wi = w(i, c)
            if wi is None:
                continue
            prev = [w(j, c - 1) for j in range(i)]
            prev = [v for v in prev if v is not None]
            md.add(wi <= sum(prev)) if prev else md.add(wi == 0)
    for side in z:
        zz = z[side]
        for i in range(n):
            for c in range(m + 1, zz.shape[1]):
                prev = [zz[j, c - 1] for j in range(i)]
                md.add(zz[i, c] <= sum(prev)) if prev else md.add(zz[i, c] == 0)


def _cpsat_redundant(md: Any, problem: LayerProblem, spec: _Spec, li: np.ndarray, lh: np.ndarray,
                     t_obj: Any, t: list, p: list, y: list, z: dict) -> None:
    """Implied global constraints that only strengthen CP-SAT's propagation and LP relaxation (the
    feasible set of the formulation is unchanged). Each op gets two optional fixed-size intervals
    at ``t_i``: ``ℓ̂_i`` present iff ``y_i`` and ``ℓ_i`` present iff ``¬y_i`` (fixed sizes and demands
    make the energy ``y·ℓ̂·D + (1−y)·ℓ·d`` linear). Zero-size intervals are left out (their overlap
    semantics need not match the ILP's).

    - Exclusivity as a cumulative, capacity n: demand n for the intra-op interval, 1 otherwise.
      Implied by (7)–(9): an intra-op op is ordered against every other op, so it overlaps none.
    - Dominance (not implied, but keeps an optimal solution): ``y_i = 0`` when ``ℓ̂_i >= ℓ_i``. An
      intra-op op runs alone, so in its window every core is free and running it on one core
      instead ends no later; nothing else changes.
    - For a core type with z-variables (K cores indexed): a cumulative of capacity K, where an
      intra-op op of any type demands K (it runs alone) and a non-intra op of that type 1 (implied
      by (10)–(16): ops sharing a core are ordered); and one no-overlap per core over intervals of
      size ℓ_i present iff ``z_ic`` (implied by (15)/(16) with (8); ``z_ic`` forces ``y_i = 0``).
    """
    n = spec.n
    # chain bound: intra-op intervals are disjoint from each other and from everything else, and
    # the non-intra ops of one chain are disjoint, so T >= Σ_i y_i ℓ̂_i + Σ_{i in C} (1 - y_i) ℓ_i
    # for every chain C; u_i is the longest such chain sum ending at i (over DAG edges).
    hz = int(max(li.sum(), lh.sum()))
    u = [md.new_int_var(0, hz, f"u{i}") for i in range(n)]
    pred = problem.predecessors()
    excl = sum(int(lh[i]) * y[i] for i in range(n))
    W = md.new_int_var(0, hz, "W")  # time not covered by intra-op ops
    for i in range(n):
        own = int(li[i]) - int(li[i]) * y[i]
        md.add(u[i] >= own)
        for j in pred[i]:
            md.add(u[i] >= u[j] + own)
        md.add(W >= u[i])
    md.add(t_obj >= excl + W)
    # energy: with z-variables for a type, at most K ops of that type run at once outside
    # intra-op time, so K·W >= Σ (1 - y_i) ℓ_i over the ops of that type
    for name, zz in z.items():
        kk = zz.shape[1]
        uses = problem.kind != (KIND_VC if name == "tc" else KIND_TC)
        if kk:
            md.add(kk * W >= sum(int(li[i]) - int(li[i]) * y[i] for i in np.flatnonzero(uses).tolist()))
    iv1: dict[int, Any] = {}
    iv0: dict[int, Any] = {}
    for i in range(n):
        if lh[i] > 0:
            iv1[i] = md.new_optional_fixed_size_interval_var(t[i], int(lh[i]), y[i], f"Ih{i}")
        if li[i] > 0:
            iv0[i] = md.new_optional_fixed_size_interval_var(t[i], int(li[i]), ~y[i], f"Il{i}")
    if len(iv1) + len(iv0) < 2:
        return
    md.add_cumulative(list(iv1.values()) + list(iv0.values()), [n] * len(iv1) + [1] * len(iv0), n)
    for name, zz in z.items():
        kk = zz.shape[1]
        if kk == 0:
            continue
        uses = problem.kind != (KIND_VC if name == "tc" else KIND_TC)
        ops0 = [i for i in iv0 if uses[i]]
        md.add_cumulative(list(iv1.values()) + [iv0[i] for i in ops0], [kk] * len(iv1) + [1] * len(ops0),
                          kk)
        if len(ops0) < 2:
            continue
        for c in range(kk):
            md.add_no_overlap([md.new_optional_fixed_size_interval_var(t[i], int(li[i]), zz[i, c],
                                                                       f"I{name}{i}_{c}") for i in ops0])


def _solve_with_stall_stop(solver: Any, model: Any, stall_s: float) -> Any:
    """``solver.solve(model)``, stopped once no better solution has come for ``stall_s`` seconds
    (after the first one)."""
    import threading

    from ortools.sat.python import cp_model

    last = [math.inf]
    done = threading.Event()

    class _Cb(cp_model.CpSolverSolutionCallback):
        def on_solution_callback(self) -> None:
            last[0] = time.monotonic()

    def watch() -> None:
        while not done.wait(0.05):
            if time.monotonic() - last[0] > stall_s:
                solver.stop_search()
                return

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    try:
        return solver.solve(model, _Cb())
    finally:
        done.set()
        th.join()


def _warm_start(problem: LayerProblem, time_limit_s: float, num_workers: int, capacity: bool = True
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """Primal heuristic for the hint (not the reported model): a compact CP-SAT interval model of
    the same problem with core *counts* instead of core indices: per op two optional fixed-size
    intervals (ℓ̂ if intra-op, ℓ otherwise), precedence, an exclusivity cumulative and one capacity
    cumulative per core type. CP-SAT's scheduling search finds good schedules here much faster than
    in the x/z formulation. Returns (start_s, intra) of its best schedule (re-timed ASAP with the
    float latencies along its interval order), or None."""
    from ortools.sat.python import cp_model

    n = problem.num_ops
    res = problem.horizon_s() * TIME_RESOLUTION_REL
    li = np.rint(problem.latency_s / res).astype(np.int64)
    lh = np.rint(problem.intra_latency_s / res).astype(np.int64)
    H = int(min(li.sum(), lh.sum()))
    md = cp_model.CpModel()
    T = md.new_int_var(0, H, "T")
    t = [md.new_int_var(0, H, f"t{i}") for i in range(n)]
    e = [md.new_int_var(0, H, f"e{i}") for i in range(n)]
    y = [md.new_bool_var(f"y{i}") for i in range(n)]
    i1 = [md.new_optional_fixed_size_interval_var(t[i], int(lh[i]), y[i], f"a{i}") for i in range(n)]
    i0 = [md.new_optional_fixed_size_interval_var(t[i], int(li[i]), ~y[i], f"b{i}") for i in range(n)]
    for i in range(n):
        md.add(e[i] == t[i] + int(li[i]) + int(lh[i] - li[i]) * y[i])
        md.add(T >= e[i])
        if problem.intra_latency_s[i] >= problem.latency_s[i]:
            md.add(y[i] == 0)
    for a, b in zip(problem.edge_src.tolist(), problem.edge_dst.tolist()):
        md.add(t[b] >= e[a])
    md.add_cumulative(i1 + i0, [n] * n + [1] * n, n)
    for cap, uses in ((problem.num_tc, problem.kind != KIND_VC), (problem.num_vc, problem.kind != KIND_TC)):
        if not capacity:
            break
        sel = np.flatnonzero(uses).tolist()
        md.add_cumulative(i1 + [i0[i] for i in sel], [cap] * n + [1] * len(sel), cap)
    md.minimize(T)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(float(time_limit_s), 1e-3)
    solver.parameters.num_workers = int(num_workers)
    st = _solve_with_stall_stop(solver, md, WARM_START_STALL_S)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    ts = np.array([solver.value(v) for v in t], dtype=np.float64)
    es = np.array([solver.value(v) for v in e], dtype=np.float64)
    ys = np.array([solver.boolean_value(v) for v in y], dtype=bool)
    rank = _rank(problem)
    key_less = (ts[:, None] < ts[None, :]) | ((ts[:, None] == ts[None, :]) & (rank[:, None] < rank[None, :]))
    order = (es[:, None] <= ts[None, :]) & key_less & ~np.eye(n, dtype=bool)
    start = _asap(order | problem.reach(), np.where(ys, problem.intra_latency_s, problem.latency_s))
    return None if start is None else (start, ys)


def _z_argmax(zv: np.ndarray | None, n: int) -> np.ndarray | None:
    if zv is None:
        return None
    zv = np.asarray(zv).reshape(n, -1) > 0.5
    return np.where(zv.any(axis=1), zv.argmax(axis=1), -1).astype(np.int64)


def _cpsat_hint(md: Any, problem: LayerProblem, spec: _Spec, h: LayerSchedule, li: np.ndarray,
                lh: np.ndarray, T: Any, t: list, p: list, y: list, x: np.ndarray, z: dict) -> None:
    """A consistent integer hint: the heuristic schedule's order, re-timed ASAP with the rounded
    latencies."""
    n = spec.n
    d = h.durations(problem)
    e = h.start_s + d
    order = (e[:, None] <= h.start_s[None, :]) & ~np.eye(n, dtype=bool)
    rank = _rank(problem)
    key_less = (h.start_s[:, None] < h.start_s[None, :]) | (
        (h.start_s[:, None] == h.start_s[None, :]) & (rank[:, None] < rank[None, :]))
    order &= key_less
    order |= spec.reach
    pint = np.where(h.intra, lh, li).astype(np.float64)
    s_int = _asap(order, pint)
    if s_int is None:
        return
    for i in range(n):
        md.add_hint(t[i], int(s_int[i]))
        md.add_hint(p[i], int(pint[i]))
        md.add_hint(y[i], bool(h.intra[i]))
        for j in range(n):
            if i != j:
                md.add_hint(x[i, j], bool(order[i, j]))
    md.add_hint(T, int((s_int + pint).max()))
    for name, core in (("tc", h.tc_core), ("vc", h.vc_core)):
        if name in z:
            zz = z[name]
            if (core >= zz.shape[1]).any():
                continue
            for i in range(n):
                for c in range(zz.shape[1]):
                    md.add_hint(zz[i, c], bool(core[i] == c))


def _ortools_version() -> str:
    try:
        import ortools

        return ortools.__version__
    except Exception:  # pragma: no cover
        return "?"


# ---------------------------------------------------------------------- MILP (PuLP + HiGHS)
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
    return lp, {"T": T, "t": t, "p": p, "y": y, "x": x, "z": z, "unit": unit}


def _solve_milp(problem: LayerProblem, spec: _Spec, time_limit_s: float, rel_gap: float,
                hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    import pulp

    n = spec.n
    lp, v_ = _milp_model(problem, spec)
    T, t, p, y, x, z, unit = (v_[k] for k in ("T", "t", "p", "y", "x", "z", "unit"))
    # HiGHS 1.15.1's symmetry handling (full orbitopes over the z columns) returned a suboptimal
    # point as "Optimal" on a 7-op instance of the random cross-check (seed 39 of tests); off.
    solver = pulp.HiGHS(msg=False, timeLimit=max(float(time_limit_s), 1e-3), gapRel=float(rel_gap),
                        mip_detect_symmetry=False)
    lp.solve(solver)
    name = "highs (pulp)"
    hs = lp.solverModel
    info = hs.getInfo()
    bound = getattr(info, "mip_dual_bound", float("nan"))
    bound_s = float(bound) * unit if bound is not None and math.isfinite(bound) else float("nan")
    import highspy

    mstat = hs.getModelStatus()
    has = int(getattr(info, "primal_solution_status", 0)) == 2 and mstat not in (
        highspy.HighsModelStatus.kInfeasible, highspy.HighsModelStatus.kNotset)
    if not has or T.varValue is None:
        return _Raw(False, False, float("nan"), bound_s, name=name)

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
    gap = info.mip_gap if math.isfinite(getattr(info, "mip_gap", math.inf)) else math.inf
    optimal = mstat == highspy.HighsModelStatus.kOptimal and gap <= 1e-9
    return _Raw(True, bool(optimal), obj, bound_s, ts, ts + ps, ys, xs, zt, zv, name)


# ====================================================================== solve
# ---------------------------------------------------------------------- process isolation
# OR-Tools and highspy each ship a different build of ``libhighs.so.1`` under the same soname; the
# dynamic loader shares the first one loaded, so whichever of the two is imported second fails
# (undefined symbols). HiGHS therefore always runs in a persistent worker subprocess that never
# imports OR-Tools; CP-SAT runs in-process unless highspy was already loaded here, in which case it
# gets its own worker too. Workers are plain ``python -c`` subprocesses speaking length-prefixed
# pickles over pipes (no multiprocessing, so callers need no ``__main__`` guard).
_WORKERS: dict[str, Any] = {}
_CPSAT_IN_PROCESS: list[bool] = []


def _cpsat_in_process() -> bool:
    if not _CPSAT_IN_PROCESS:
        try:
            from ortools.sat.python import cp_model  # noqa: F401

            _CPSAT_IN_PROCESS.append(True)
        except ImportError:
            _CPSAT_IN_PROCESS.append(False)
    return _CPSAT_IN_PROCESS[0]


def _worker_main() -> None:  # pragma: no cover - runs in the worker subprocess
    import pickle
    import struct
    import sys

    proto_in = os.fdopen(os.dup(0), "rb")
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # solver chatter on fd 1 must not corrupt the protocol
    while True:
        head = proto_in.read(8)
        if len(head) < 8:
            return
        (size,) = struct.unpack("<Q", head)
        fn_name, args = pickle.loads(proto_in.read(size))
        try:
            out = ("ok", globals()[fn_name](*args))
        except Exception as exc:  # report, keep serving
            out = ("err", f"{type(exc).__name__}: {exc}")
        data = pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL)
        proto_out.write(struct.pack("<Q", len(data)) + data)
        proto_out.flush()
        sys.stderr.flush()


def _drop_worker(name: str) -> None:
    proc = _WORKERS.pop(name, None)
    if proc is not None and proc.poll() is None:
        proc.kill()  # our own child, by its handle
        proc.wait()


def _call_isolated(name: str, fn_name: str, *args: Any, timeout_s: float) -> Any:
    """``fn_name(*args)`` in the persistent worker ``name``; None when it fails or overruns."""
    import pickle
    import select
    import struct
    import subprocess
    import sys

    proc = _WORKERS.get(name)
    if proc is None or proc.poll() is not None:
        root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from {__name__} import _worker_main; _worker_main()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        _WORKERS[name] = proc
    deadline = time.monotonic() + timeout_s
    try:
        data = pickle.dumps((fn_name, args), protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.write(struct.pack("<Q", len(data)) + data)
        proc.stdin.flush()
        fd = proc.stdout.fileno()
        buf = b""
        need = 8
        size = None
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
            chunk = os.read(fd, need - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
            if size is None and len(buf) == 8:
                (size,) = struct.unpack("<Q", buf)
                buf, need = b"", size
        status, result = pickle.loads(buf)
    except (TimeoutError, EOFError, OSError, pickle.UnpicklingError):
        _drop_worker(name)
        return None
    if status != "ok":
        warnings.warn(f"layer ILP worker {name!r} failed: {result}", stacklevel=3)
        return None
    return result


def _run_backend(backend: str, problem: LayerProblem, spec: _Spec, time_limit_s: float, rel_gap: float,
                 hint: LayerSchedule | None, num_workers: int, lower_bound_s: float = float("nan")) -> _Raw:
    args = (problem, spec, time_limit_s, rel_gap, hint, num_workers, lower_bound_s)
    if backend == "cpsat" and _cpsat_in_process():
        return _solve_cpsat(*args)
    fn = "_solve_cpsat" if backend == "cpsat" else "_solve_milp"
    raw = _call_isolated(backend, fn, *args, timeout_s=time_limit_s + 120.0)
    if raw is None:
        return _Raw(False, False, float("nan"), float("nan"), name=f"{backend} (worker failed)")
    return raw


WARM_START_MIN_OPS = 8
WARM_START_SHARE = 0.2
WARM_START_MAX_S = 5.0
WARM_START_STALL_S = 1.0


def _run_warm_start(problem: LayerProblem, time_limit_s: float, num_workers: int) -> LayerSchedule | None:
    """The compact model's schedule with cores assigned, when it is valid; else None."""
    t0 = time.perf_counter()
    if _cpsat_in_process():
        got = _warm_start(problem, time_limit_s, num_workers)
    else:
        got = _call_isolated("cpsat", "_warm_start", problem, time_limit_s, num_workers,
                             timeout_s=time_limit_s + 120.0)
    if got is None:
        return None
    start, intra = got
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    cores = _assign_cores(problem, start, dur, intra)
    if cores is None:
        return None
    out = _finish(problem, start, intra, cores[0], cores[1], "feasible", "cp-sat interval warm start", t0,
                  gap=float("nan"))
    try:
        check_schedule(problem, out, rel_tol=1e-7)
    except ValueError:
        return None
    return out


def _rebuild(problem: LayerProblem, raw: _Raw, rank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Float schedule from a solver solution: ASAP along x ∪ ≺ ∪ (solver t-order)."""
    n = problem.num_ops
    intra = raw.y.copy()
    dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
    base = raw.x | problem.reach()
    eps = 1e-9 * max(problem.horizon_s(), 1e-300)
    s, e = raw.start_s, raw.end_s
    key_less = (s[:, None] < s[None, :]) | ((s[:, None] == s[None, :]) & (rank[:, None] < rank[None, :]))
    torder = (e[:, None] <= s[None, :] + eps) & key_less & ~np.eye(n, dtype=bool)
    start = _asap(base | torder, dur)
    if start is None:
        start = _asap(base, dur)
    if start is None:  # x not acyclic (numerical trouble)
        raise RuntimeError("solver x-order is cyclic")
    return start, intra


def solve_layer(problem: LayerProblem, backend: str = "cpsat", time_limit_s: float = 30.0,
                rel_gap: float = 0.0, lazy: bool = True, *, decompose: bool = True,
                num_workers: int | None = None, cache: bool = True,
                cache_dir: str | Path | None = None) -> LayerSchedule:
    """Optimal (or time-limited best) schedule of one layer by Phaze's ILP.

    ``backend``: "cpsat" (OR-Tools CP-SAT, integer-scaled times) or "milp" (PuLP + HiGHS).
    ``time_limit_s`` bounds the whole call (all lazy rounds); ``rel_gap`` is the solver's relative
    gap target (0 = prove optimality). ``lazy`` applies Appendix A (z-variables only when needed).
    ``decompose`` solves the series segments of the DAG separately (exact; see ``_solve_layer``).
    ``num_workers``: CP-SAT search workers (default 8, CP-SAT's own default portfolio size).
    Results are cached in memory (and under ``cache_dir`` when given) by ``schedule_cache_key``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} unknown; allowed: {list(BACKENDS)}")
    if not (time_limit_s > 0):
        raise ValueError(f"time_limit_s must be > 0, got {time_limit_s}")
    if not (rel_gap >= 0):
        raise ValueError(f"rel_gap must be >= 0, got {rel_gap}")
    key = schedule_cache_key(problem, backend=backend, time_limit_s=time_limit_s, rel_gap=rel_gap,
                             lazy=lazy, decompose=decompose) if cache else None
    if key is not None:
        hit = _cache_get(key, cache_dir)
        if hit is not None:
            return hit
    out = _solve_layer(problem, backend, float(time_limit_s), float(rel_gap), lazy,
                       num_workers or _default_workers(), decompose)
    if key is not None:
        _cache_put(key, out, cache_dir)
    return out


def _default_workers() -> int:
    return 8


def _trivial(problem: LayerProblem, t0: float) -> LayerSchedule | None:
    """Closed form when the DAG is a total order (or empty, or all latencies are zero)."""
    n = problem.num_ops
    if n == 0:
        z = np.zeros(0, np.int64)
        return _finish(problem, np.zeros(0), np.zeros(0, bool), z, z.copy(), "trivial", "closed-form", t0)
    r = problem.reach()
    total_order = bool((r | r.T | np.eye(n, dtype=bool)).all())
    if not total_order and problem.horizon_s() > 0:
        return None
    if total_order:
        intra = problem.intra_latency_s < problem.latency_s
        dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
        order = problem.topo_order()
        start = np.zeros(n)
        start[order] = np.concatenate(([0.0], np.cumsum(dur[order])[:-1]))
    else:  # H = 0: all ℓ or all ℓ̂ are zero; every op at time 0 in its zero-length mode
        intra = problem.intra_latency_s < problem.latency_s
        start = np.zeros(n)
    k = problem.kind
    tc = np.where(~intra & (k != KIND_VC), 0, -1)
    vc = np.where(~intra & (k != KIND_TC), 0, -1)
    out = _finish(problem, start, intra, tc, vc, "trivial", "closed-form", t0)
    out.bound_s = out.makespan_s
    return out


def _series_segments(problem: LayerProblem) -> list[np.ndarray]:
    """Split the ops into series segments: prefixes A of the topological order with every op of A
    preceding every op after it (``a ≺ b``). Such an A is a prefix of every topological order, so
    checking the prefixes of one order finds all of them."""
    n = problem.num_ops
    order = problem.topo_order()
    if n < 2:
        return [order]
    m = problem.reach()[np.ix_(order, order)]
    row_suffix_all = np.flip(np.logical_and.accumulate(np.flip(m, axis=1), axis=1), axis=1)
    col_prefix_all = np.logical_and.accumulate(row_suffix_all, axis=0)
    cuts = [k for k in range(1, n) if col_prefix_all[k - 1, k]]
    bounds = [0, *cuts, n]
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def _subproblem(problem: LayerProblem, idx: np.ndarray) -> LayerProblem:
    local = np.full(problem.num_ops, -1, dtype=np.int64)
    local[idx] = np.arange(len(idx))
    inside = (local[problem.edge_src] >= 0) & (local[problem.edge_dst] >= 0)
    names = tuple(problem.names[i] for i in idx) if problem.names is not None else None
    return LayerProblem(problem.kind[idx], problem.latency_s[idx], problem.intra_latency_s[idx],
                        local[problem.edge_src[inside]], local[problem.edge_dst[inside]], problem.num_tc,
                        problem.num_vc, names)


def _solve_layer(problem: LayerProblem, backend: str, time_limit_s: float, rel_gap: float, lazy: bool,
                 num_workers: int, decompose: bool = True) -> LayerSchedule:
    """Series decomposition (exact): when every op of a prefix A precedes every other op, nothing
    of A can overlap anything after it (they are ordered by (5)/(7)), so the optimum is the sum of
    the optima of the segments, each solved by the full formulation, and the schedule is their
    concatenation. A segment's bound adds up the same way."""
    t0 = time.perf_counter()
    triv = _trivial(problem, t0)
    if triv is not None:
        return triv
    segs = _series_segments(problem) if decompose else [problem.topo_order()]
    if len(segs) == 1:
        return _solve_connected(problem, backend, time_limit_s, rel_gap, lazy, num_workers)
    deadline = t0 + time_limit_s
    weight = [float(len(sg)) ** 2 if len(sg) > 1 else 0.0 for sg in segs]
    n = problem.num_ops
    start = np.zeros(n)
    intra = np.zeros(n, bool)
    tc = np.full(n, -1, dtype=np.int64)
    vc = np.full(n, -1, dtype=np.int64)
    offset = 0.0
    bound = 0.0
    rounds = 0
    statuses = []
    names = []
    for k, sg in enumerate(segs):
        sub = _subproblem(problem, sg)
        left = deadline - time.perf_counter()
        share = weight[k] / max(sum(weight[k:]), 1e-300) if weight[k] else 1.0
        if left <= 0:
            r = _fallback(sub, _heuristic(sub), float("nan"), time.perf_counter(), 0, "time limit")
        else:
            r = _solve_connected(sub, backend, left * share, rel_gap, lazy, num_workers)
        start[sg] = r.start_s + offset
        intra[sg] = r.intra
        tc[sg] = r.tc_core
        vc[sg] = r.vc_core
        offset += r.makespan_s
        bound += r.bound_s
        rounds += r.lazy_rounds
        statuses.append(r.status)
        if r.status != "trivial" and r.solver not in names:
            names.append(r.solver)
    status = ("trivial" if all(st == "trivial" for st in statuses) else "fallback" if "fallback" in statuses
              else "feasible" if "feasible" in statuses else "optimal")
    solver = f"{'+'.join(names) or 'closed-form'} [{len(segs)} series segments]"
    out = _finish(problem, start, intra, tc, vc, status, solver, t0, lazy_rounds=rounds, bound_s=bound)
    out.gap = 0.0 if status in ("optimal", "trivial") else _gap(out.makespan_s, bound)
    try:
        check_schedule(problem, out, rel_tol=1e-7)
    except ValueError as exc:  # should never happen; never return an invalid schedule
        warnings.warn(f"layer ILP produced an invalid schedule ({exc}); using the heuristic", stacklevel=3)
        return _fallback(problem, _heuristic(problem), bound, t0, rounds, solver)
    return out


QUICK_ATTEMPT_S = 1.0


def _solve_connected(problem: LayerProblem, backend: str, time_limit_s: float, rel_gap: float, lazy: bool,
                     num_workers: int) -> LayerSchedule:
    """The ILP on one (series-indecomposable) DAG, with the lazy z-rounds of Appendix A.

    With CP-SAT on 8+ ops the time goes in two phases: a quick attempt (``QUICK_ATTEMPT_S``) hinted
    by the greedy/sequential schedule; if that does not prove optimality, the interval warm start
    (``_warm_start``) provides a better hint and the lazy rounds continue (z-types already added
    and the best bound so far are kept) for the rest of the time limit."""
    t0 = time.perf_counter()
    triv = _trivial(problem, t0)
    if triv is not None:
        return triv
    deadline = t0 + time_limit_s
    rank = _rank(problem)
    heur = _heuristic(problem)
    st: dict[str, Any] = {"active": {"tc": not lazy, "vc": not lazy}, "rounds": 0, "bound": float("nan"),
                          "name": backend, "hint": heur}
    phases = [deadline]
    if backend == "cpsat" and problem.num_ops >= WARM_START_MIN_OPS:
        phases = [min(deadline, t0 + QUICK_ATTEMPT_S), deadline]
    best: LayerSchedule | None = None
    for ph, end in enumerate(phases):
        if ph:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            ws = _run_warm_start(problem, min(WARM_START_SHARE * left, WARM_START_MAX_S), num_workers)
            if ws is not None and ws.makespan_s < st["hint"].makespan_s:
                st["hint"] = ws
        got = _lazy_solve(problem, backend, end, rel_gap, num_workers, rank, st)
        if got is not None and (best is None or got.status == "optimal" or got.makespan_s < best.makespan_s):
            best = got
        if best is not None and best.status == "optimal":
            break
    bound = st["bound"]
    heur = st["hint"]  # the best valid schedule the heuristics found
    if best is None:
        return _fallback(problem, heur, bound, t0, st["rounds"], st["name"])
    best.lazy_rounds = st["rounds"]
    if best.status != "optimal" and heur.makespan_s < best.makespan_s:
        best = heur.copy(solver=f"{st['name']}+{heur.solver}", lazy_rounds=st["rounds"], status="feasible")
    if best.status == "optimal":
        best.gap = 0.0
        best.bound_s = min(bound, best.makespan_s) if math.isfinite(bound) else best.makespan_s
    else:
        best.gap = _gap(best.makespan_s, bound)
        best.bound_s = bound
    try:
        check_schedule(problem, best, rel_tol=1e-7)
    except ValueError as exc:  # should never happen; never return an invalid schedule
        warnings.warn(f"layer ILP produced an invalid schedule ({exc}); using the heuristic", stacklevel=3)
        return _fallback(problem, heur, bound, t0, st["rounds"], st["name"])
    best.solve_time_s = time.perf_counter() - t0
    return best


def _lazy_solve(problem: LayerProblem, backend: str, end: float, rel_gap: float, num_workers: int,
                rank: np.ndarray, st: dict[str, Any]) -> LayerSchedule | None:
    """Lazy rounds until a solution fits the cores (returned, status "optimal" when its round was
    solved to optimality) or the time runs out / a round has no solution (None). ``st`` carries the
    active z-types, the number of rounds, the best bound and the best valid schedule (the hint)
    across calls; an over-subscribed solution is repaired into a valid one for the next hint."""
    t0 = time.perf_counter()
    active = st["active"]
    while True:
        left = end - time.perf_counter()
        if left <= 0:
            return None
        spec = _build_spec(problem, active["tc"], active["vc"])
        raw = _run_backend(backend, problem, spec, left, rel_gap, st["hint"], num_workers, st["bound"])
        st["name"] = raw.name
        # every round's model is a relaxation of (or equal to) the full one: its bound is valid
        if math.isfinite(raw.bound_s):
            st["bound"] = raw.bound_s if not math.isfinite(st["bound"]) else max(st["bound"], raw.bound_s)
        if not raw.has_solution:
            return None
        try:
            start, intra = _rebuild(problem, raw, rank)
        except RuntimeError:
            return None
        dur = np.where(intra, problem.intra_latency_s, problem.latency_s)
        use_tc, use_vc = _core_usage(problem, start, dur, intra)
        need = set()
        if not active["tc"] and use_tc > problem.num_tc:
            need.add("tc")
        if not active["vc"] and use_vc > problem.num_vc:
            need.add("vc")
        cores = None
        if not need:
            cores = _assign_cores(problem, start, dur, intra,
                                  raw.z_tc if active["tc"] else None, raw.z_vc if active["vc"] else None)
            if cores is None:
                need = {t for t in ("tc", "vc") if not active[t]}
                if not need:  # cannot happen with a full model
                    return None
        if need:
            for t in need:
                active[t] = True
            st["rounds"] += 1
            fixed = _repair(problem, start, intra)
            if fixed.makespan_s < st["hint"].makespan_s:
                st["hint"] = fixed  # the next round starts from the repaired solution
            continue
        return _finish(problem, start, intra, cores[0], cores[1], "optimal" if raw.optimal else "feasible",
                       raw.name, t0, bound_s=st["bound"])


def _gap(makespan: float, bound: float) -> float:
    if not math.isfinite(bound) or makespan <= 0:
        return float("nan") if not math.isfinite(bound) else 0.0
    return max(0.0, 1.0 - bound / makespan)


def _fallback(problem: LayerProblem, heur: LayerSchedule, bound_s: float, t0: float, rounds: int,
              name: str) -> LayerSchedule:
    return heur.copy(status="fallback", gap=_gap(heur.makespan_s, bound_s), bound_s=bound_s,
                     solver=f"{heur.solver} (fallback after {name})", lazy_rounds=rounds,
                     solve_time_s=time.perf_counter() - t0)


# ====================================================================== caching
_CACHE: collections.OrderedDict[str, LayerSchedule] = collections.OrderedDict()
CACHE_MAX_ENTRIES = 4096


def schedule_cache_key(problem: LayerProblem, backend: str = "cpsat", time_limit_s: float = 30.0,
                       rel_gap: float = 0.0, lazy: bool = True, decompose: bool = True) -> str:
    """Content hash of the op kinds, ℓ and ℓ̂ bytes, edges, core counts and solver settings (op
    names are ignored)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"phaze-layer-ilp-v1")
    for a in (problem.kind.astype(np.int8), problem.latency_s.astype("<f8"),
              problem.intra_latency_s.astype("<f8"), problem.edge_src.astype("<i8"),
              problem.edge_dst.astype("<i8")):
        h.update(np.int64(a.size).tobytes())
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(json.dumps([problem.num_tc, problem.num_vc, backend, float(time_limit_s), float(rel_gap),
                         bool(lazy), bool(decompose)]).encode())
    return h.hexdigest()


def clear_schedule_cache() -> None:
    _CACHE.clear()


def _cache_get(key: str, cache_dir: str | Path | None) -> LayerSchedule | None:
    hit = _CACHE.get(key)
    if hit is None and cache_dir is not None:
        f = Path(cache_dir) / f"{key}.json"
        if f.is_file():
            try:
                hit = LayerSchedule.from_dict(json.loads(f.read_text()))
            except (ValueError, KeyError, TypeError):
                hit = None
            if hit is not None:
                _CACHE[key] = hit
    if hit is None:
        return None
    _CACHE.move_to_end(key)
    return hit.copy(from_cache=True)


def _cache_put(key: str, sched: LayerSchedule, cache_dir: str | Path | None) -> None:
    _CACHE[key] = sched.copy()
    _CACHE.move_to_end(key)
    while len(_CACHE) > CACHE_MAX_ENTRIES:
        _CACHE.popitem(last=False)
    if cache_dir is not None:
        d = Path(cache_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(sched.to_dict(), allow_nan=True))
        tmp.replace(d / f"{key}.json")


# ====================================================================== whole graph
def layer_problems(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int
                   ) -> dict[str, list[LayerProblem]]:
    """Every layer's forward and backward ``LayerProblem`` (lists indexed by layer)."""
    out = {"forward": [], "backward": []}
    for _, _, bw, prob in _iter_layer_problems(g, est_single_s, est_all_s, num_tc, num_vc, {}):
        out["backward" if bw else "forward"].append(prob)
    return out


def _iter_layer_problems(g: Any, single: Any, all_: Any, num_tc: int, num_vc: int, memo: dict):
    from ...workloads.layers import structural_hashes

    single = np.asarray(single, dtype=np.float64)
    all_ = np.asarray(all_, dtype=np.float64)
    if single.shape != (g.num_nodes,) or all_.shape != (g.num_nodes,):
        raise ValueError(f"latency arrays must have one entry per graph row ({g.num_nodes}); got "
                         f"{single.shape} and {all_.shape}")
    names = tuple(g.meta.get("layers", ()))
    if not names:
        raise ValueError(f"graph {g.meta.get('model')!r} has no layers (meta['layers'] is empty)")
    hashes = structural_hashes(g)
    layer = g.nodes["layer"]
    bwd = g.nodes["is_backward"]
    src, dst = g.edge_pos
    topo = g.topo_order()
    topo_pos = np.empty(g.num_nodes, dtype=np.int64)
    topo_pos[topo] = np.arange(g.num_nodes)
    for bw in (False, True):
        for li in range(len(names)):
            rows = np.flatnonzero((layer == li) & (bwd == bw))
            mkey = (hashes[li], bw, single[rows].tobytes(), all_[rows].tobytes())
            if mkey in memo:
                yield li, mkey, bw, memo[mkey]
                continue
            local = np.full(g.num_nodes, -1, dtype=np.int64)
            local[rows] = np.arange(len(rows))
            inside = (local[src] >= 0) & (local[dst] >= 0)
            ltopo = local[rows[np.argsort(topo_pos[rows])]]
            prob = _problem_from_rows(g.nodes["core"][rows], g.nodes["name"][rows], local[src[inside]],
                                      local[dst[inside]], single[rows], all_[rows], num_tc, num_vc, ltopo)
            memo[mkey] = prob
            yield li, mkey, bw, prob


@dataclass
class LayerPlan:
    """Every layer's forward and backward ILP instance of one graph, deduplicated by cache key.

    ``keys[pass][layer]`` names the instance in ``problems`` (unique, insertion order); the split
    lets a caller solve the unique instances anywhere (in-process, or on a pool of solver actors
    with a shared cache) and then ``assemble`` the per-layer makespans.
    """

    layers: tuple[str, ...]
    keys: dict[str, list[str]]
    problems: dict[str, LayerProblem]
    sequential_s: dict[str, np.ndarray]
    num_ops: dict[str, np.ndarray]

    @property
    def lookups(self) -> int:
        return len(self.keys["forward"]) + len(self.keys["backward"])

    def assemble(self, makespan_s: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        """Per-layer forward and backward makespans from the makespan of each unique key."""
        missing = [k for k in self.problems if k not in makespan_s]
        if missing:
            raise KeyError(f"{len(missing)} layer schedule(s) missing, e.g. {missing[0]}")
        return tuple(np.array([makespan_s[k] for k in self.keys[p]], dtype=np.float64)
                     for p in ("forward", "backward"))


def plan_layer_schedules(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int,
                         **settings: Any) -> LayerPlan:
    """The unique layer-slice ILP instances of a graph and which layer uses which. ``settings`` are
    the ``solve_layer`` options that enter the cache key (backend, time_limit_s, rel_gap, lazy,
    decompose); others are ignored."""
    names = tuple(g.meta.get("layers", ()))
    L = len(names)
    settings = {k: settings[k] for k in ("backend", "time_limit_s", "rel_gap", "lazy", "decompose")
                if k in settings}
    keys = {"forward": [""] * L, "backward": [""] * L}
    seq = {"forward": np.zeros(L), "backward": np.zeros(L)}
    num_ops = {"forward": np.zeros(L, np.int64), "backward": np.zeros(L, np.int64)}
    problems: dict[str, LayerProblem] = {}
    memo: dict = {}
    by_mkey: dict = {}
    for li, mkey, bw, prob in _iter_layer_problems(g, est_single_s, est_all_s, num_tc, num_vc, memo):
        pas = "backward" if bw else "forward"
        key = by_mkey.get(mkey)
        if key is None:
            key = by_mkey[mkey] = schedule_cache_key(prob, **settings)
            problems.setdefault(key, prob)
        keys[pas][li] = key
        seq[pas][li] = float(prob.intra_latency_s.sum())
        num_ops[pas][li] = prob.num_ops
    return LayerPlan(names, keys, problems, seq, num_ops)


def schedule_layers(g: Any, est_single_s: Any, est_all_s: Any, num_tc: int, num_vc: int,
                    **solve_kw: Any) -> dict[str, Any]:
    """Solve every layer's forward and backward subgraph; each distinct (structural hash, pass,
    latencies) is solved once, so repeated transformer blocks share one solve.

    Returns a dict with ``forward_s``/``backward_s`` (ILP makespans, arrays indexed by layer),
    ``sequential_forward_s``/``sequential_backward_s`` (Σ ℓ̂ baselines), ``keys`` (per pass, the
    cache key of each layer), ``schedules`` and ``problems`` (by key, the unique ones), ``num_ops``
    (per pass, ops after dropping ``none``), and counts: ``unique`` (distinct problems, both
    passes), ``unique_forward``, ``unique_backward``, ``solved`` (actually solved now),
    ``cache_hits`` (layer lookups answered without a solve, including repeats within this call)
    and ``solve_time_s`` (sum over the solves done now).
    """
    plan = plan_layer_schedules(g, est_single_s, est_all_s, num_tc, num_vc, **solve_kw)
    schedules: dict[str, LayerSchedule] = {}
    solved, solve_time = 0, 0.0
    for key, prob in plan.problems.items():
        s = solve_layer(prob, **solve_kw)
        if not s.from_cache:
            solved += 1
            solve_time += s.solve_time_s
        schedules[key] = s
    fw, bw = plan.assemble({k: s.makespan_s for k, s in schedules.items()})
    return {
        "layers": plan.layers, "forward_s": fw, "backward_s": bw,
        "sequential_forward_s": plan.sequential_s["forward"],
        "sequential_backward_s": plan.sequential_s["backward"],
        "keys": plan.keys, "num_ops": plan.num_ops, "schedules": schedules, "problems": plan.problems,
        "solved": solved, "cache_hits": plan.lookups - solved, "solve_time_s": solve_time,
        "unique": len(schedules), "unique_forward": len(set(plan.keys["forward"])),
        "unique_backward": len(set(plan.keys["backward"])),
    }


__all__ = [
    "BACKENDS", "CORE_TO_KIND", "KIND_FUSED", "KIND_TC", "KIND_VC", "LayerPlan", "LayerProblem",
    "LayerSchedule", "TIME_RESOLUTION_REL", "check_schedule", "clear_schedule_cache", "exhaustive_schedule",
    "greedy_schedule", "layer_problems", "plan_layer_schedules", "schedule_cache_key", "schedule_layers",
    "sequential_schedule", "solve_layer",
]
