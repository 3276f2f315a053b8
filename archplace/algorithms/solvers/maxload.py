"""Max-load (throughput) placement for the ``dnn-partitioning`` format (Tarnawski et al., NeurIPS 2020).

Given an :class:`~archplace.workloads.graph.OpGraph` loaded by
:func:`~archplace.workloads.dnn_partitioning.load_dnn_partitioning`, place every node on one of ``k``
accelerators or one of ``c`` CPU cores so that the largest device load (the time per sample of the
pipeline) is as small as possible. The accounting is the one of the reference program
(``msr-fiddle/dnn-partitioning``, ``throughput-dp/dp.cpp``) and of the workload README:

* an accelerator's load is the sum of its nodes' ``acc_latency`` plus communication: a node whose
  output is consumed on another device pays its edge ``cost`` once on its own device and once on every
  other device that consumes it; a CPU's load is the sum of its nodes' ``cpu_latency`` (no communication);
* nodes sharing a colour class sit on one device; nodes with ``supported_on_acc = False`` go to a CPU;
  an accelerator's nodes fit in ``meta["max_bytes_per_acc"]`` bytes;
* contiguity is judged on the forward graph, contracted by colour classes: the devices' forward pieces
  must be orderable so that every prefix of the order is a downset (an *ideal*) -- equivalently, the
  graph of the devices (an arc from a device to another when a forward edge goes between them) has no
  cycle. This is exactly the family of splits the reference dynamic program ranges over (a chain of
  ideals ``{} = I0 < I1 < ... < Im = V``, one difference per device); it implies that every piece is
  convex. Backward nodes follow their colour class; a backward colour class with no forward node gets
  a virtual forward node whose edges mirror the backward edges touching it, as in the reference.

Two exact methods:

``dp``
    The dynamic program over ideals of the contracted forward graph, like the reference, made fast:
    ideals as bitsets (generated once each, in canonical order), per-ideal hyperedge split counts so
    that the communication of a piece ``I \\ J`` is ``F(I) + F(J) - corr(J, I)`` (``F`` sums the
    hyperedges an ideal splits; the correction involves only hyperedges both split), all
    ``(cpus+1) x (k+1)`` DP states of an ideal updated at once with numpy, and pruning by a threshold
    ``T``: only pieces of cost <= T, only ideals whose accelerator work fits the devices before them and
    whose remaining work fits the devices after them, and only sub-ideals that are themselves reachable.
    If the pruned DP finds a split, its value is the optimum (every split of value <= T survives the
    pruning); otherwise the optimum exceeds ``T``, which becomes a lower bound, and ``T`` grows. The
    first ``T`` is the value of a quick split (the same DP over the prefixes of one topological order)
    when that is close to the simple lower bound. Before enumerating ideals, zero-latency supernodes
    that touch only one other supernode are merged into it -- the reference does the same
    ("trivial node optimizations"); here only when it provably keeps the optimum (no device's load
    grows, memory and CPU-only constraints stay met).
``milp``
    The chain of ideals as a CP-SAT model with integer-scaled times: ``z[v, j]`` says supernode v lies
    in the ideal made of positions ``0..j``; the positions interleave accelerator slots with blocks of
    CPU slots, so any order of the pieces fits and no constraint needs a big-M; hyperedge cuts are
    clauses per accelerator slot. It returns the optimum with the solver's proof, or the best split and
    its bound at the time limit. The bound is corrected for the rounding of the scaled times, so it is
    a valid bound on the real-valued optimum (the gap it leaves is about 1e-7 relative).

``auto`` picks ``dp`` when the ideals number at most ``max_ideals`` (all published inputs: at most
36,596) and ``milp`` otherwise. Whatever the method, the returned split is re-evaluated by
:func:`evaluate_split`, an independent implementation of the accounting and of the feasibility checks,
and that value is returned.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from archplace.workloads.graph import OpGraph

__all__ = [
    "MaxLoadResult",
    "SplitEvaluation",
    "REFERENCE_MAX_LOADS",
    "evaluate_split",
    "solve_max_load",
    "solve_dp_command",
    "reference_value",
]

#: Optimal max-loads of the reference DP (workload README), keyed by "<folder>/<file name>".
REFERENCE_MAX_LOADS: dict[str, float] = {
    "LayerGraphs/bert24_inference.json": 17.78990625,
    "LayerGraphs/bert24_training.json": 41.7458125,
    "LayerGraphs/gnmt_inference.json": 32.910658203124996,
    "LayerGraphs/gnmt_training.json": 107.0044140625,
    "LayerGraphs/resnet50_inference.json": 33.774666015625,
    "LayerGraphs/resnet50_training.json": 78.63181250000001,
}

_NODE_COLUMNS = ("cpu_latency", "acc_latency", "supported_on_acc", "color_class", "mem_bytes")
_METHODS = ("auto", "dp", "milp")
_INF = math.inf
_MILP_RANGE = 1e10  # scaled times stay below this (CP-SAT gave wrong optima at about 1e12)


# ============================================================================================ results
@dataclass
class MaxLoadResult:
    """A placement and its max-load.

    ``device_of[r]`` is the device of node row ``r``: accelerator ``0..k-1``, or ``k + j`` for CPU ``j``
    (``-1`` everywhere when infeasible). ``loads`` has one entry per device (``k`` accelerators, then the
    CPUs). ``max_load`` is the value recomputed by :func:`evaluate_split`; ``lower_bound`` is a proven
    lower bound on the optimum and ``gap = (max_load - lower_bound) / max_load``.
    """

    max_load: float
    device_of: np.ndarray
    loads: list[float]
    status: str  # "optimal" | "feasible" | "infeasible" ("unknown": out of time before any split)
    lower_bound: float
    gap: float
    method: str
    solve_time_s: float
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def num_accs(self) -> int:
        return int(self.stats.get("k", 0))

    def device_nodes(self, g: OpGraph) -> list[list[int]]:
        """Node ids per device (accelerators first, then CPUs)."""
        ids = g.nodes["id"]
        return [sorted(int(i) for i in ids[self.device_of == d]) for d in range(len(self.loads))]


@dataclass
class SplitEvaluation:
    """What :func:`evaluate_split` found: the loads per device (accelerators, then CPUs), the max-load,
    and every violated constraint (an empty list means the split is valid)."""

    max_load: float
    loads: list[float]
    violations: list[str]

    @property
    def valid(self) -> bool:
        return not self.violations


# ============================================================================================ input
def _params(g: OpGraph) -> tuple[int, int, float]:
    """(k, cpus, memory limit) from ``g.meta``; raises ``ValueError`` naming the field."""
    if not isinstance(g, OpGraph):
        raise ValueError(f"expected an OpGraph, got {type(g).__name__}")
    out = []
    for key, kind in (("max_accs", int), ("max_cpus", int), ("max_bytes_per_acc", float)):
        if key not in g.meta:
            raise ValueError(f"graph meta: field {key!r} is missing (load the graph with "
                             "load_dnn_partitioning)")
        v = g.meta[key]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"graph meta: field {key!r} is {v!r}, expected a number")
        if kind is int and float(v) != int(v):
            raise ValueError(f"graph meta: field {key!r} is {v!r}, expected an integer")
        if not math.isfinite(float(v)) or v < 0:
            raise ValueError(f"graph meta: field {key!r} is {v!r}, must be a finite non-negative number")
        out.append(kind(v))
    return out[0], out[1], out[2]


def _columns(g: OpGraph) -> dict[str, np.ndarray]:
    """The node and edge columns the objective needs, checked; raises ``ValueError`` naming the field."""
    n = g.num_nodes
    cols: dict[str, np.ndarray] = {}
    for c in _NODE_COLUMNS:
        if c not in g.extra_nodes:
            raise ValueError(f"graph: node column {c!r} is missing "
                             "(load the graph with load_dnn_partitioning)")
        a = np.asarray(g.extra_nodes[c])
        if len(a) != n:
            raise ValueError(f"graph: node column {c!r} has {len(a)} rows, expected {n}")
        cols[c] = a
    if "cost" not in g.extra_edges:
        raise ValueError("graph: edge column 'cost' is missing (load the graph with load_dnn_partitioning)")
    cols["cost"] = np.asarray(g.extra_edges["cost"], dtype=np.float64)
    ids = g.nodes["id"]
    for c in ("cpu_latency", "acc_latency", "mem_bytes"):
        a = cols[c].astype(np.float64)
        bad = ~np.isfinite(a) | (a < 0)
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(f"node {ids[r]}: field {c!r} is {a[r]}, must be a finite non-negative number")
        cols[c] = a
    cost = cols["cost"]
    bad = ~np.isfinite(cost) | (cost < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"edge {g.edges['src'][i]} -> {g.edges['dst'][i]}: field 'cost' is {cost[i]}, "
                         "must be a finite non-negative number")
    cols["supported_on_acc"] = cols["supported_on_acc"].astype(bool)
    cols["color_class"] = cols["color_class"].astype(np.int64)
    return cols


def _out_cost(g: OpGraph, cost: np.ndarray) -> np.ndarray:
    """Per node row: the cost of its out-edges (the first one; the loader checks they agree)."""
    src, _ = g.edge_pos
    out = np.zeros(g.num_nodes)
    first = np.ones(len(src), dtype=bool)
    if len(src):
        first[1:] = src[1:] != src[:-1]  # edges are sorted by source row
    out[src[first]] = cost[first]
    return out


def _device_array(g: OpGraph, device_of: Any) -> np.ndarray:
    n = g.num_nodes
    if isinstance(device_of, Mapping):
        pos = {int(i): r for r, i in enumerate(g.nodes["id"])}
        arr = np.full(n, -1, dtype=np.int64)
        for i, d in device_of.items():
            if int(i) not in pos:
                raise ValueError(f"device_of: node {i} is not in the graph")
            arr[pos[int(i)]] = int(d)
        missing = np.flatnonzero(arr < 0)
        if len(missing):
            raise ValueError(f"device_of: node {g.nodes['id'][missing[0]]} has no device")
        return arr
    arr = np.asarray(device_of)
    if arr.ndim != 1 or len(arr) != n:
        raise ValueError(f"device_of: expected {n} devices (one per node row), got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"device_of: expected integer devices, got dtype {arr.dtype}")
    return arr.astype(np.int64)


# ============================================================================================ evaluator
def _orphan_classes(bwd: np.ndarray, cc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Colour-class key per row (rows without a class get their own) and the rows whose class has no
    forward row (orphaned backward rows)."""
    n = len(cc)
    key = np.where(cc >= 0, cc, -(np.arange(n, dtype=np.int64) + 1))
    fwd_keys = set(key[~bwd].tolist())
    orphan = np.array([bool(bwd[r]) and int(key[r]) not in fwd_keys for r in range(n)], dtype=bool)
    return key, orphan


def evaluate_split(g: OpGraph, device_of: Any, *, num_accs: int | None = None,
                   num_cpus: int | None = None) -> SplitEvaluation:
    """Loads and validity of a split, written independently of the solvers.

    ``device_of`` gives the device of every node row (accelerator ``0..k-1``, CPU ``k + j``), or is a
    mapping node id -> device. ``num_accs`` / ``num_cpus`` default to ``g.meta``'s ``max_accs`` /
    ``max_cpus``. Checks: device range, CPU-only nodes, colour classes, accelerator memory, and
    contiguity (the graph of devices induced by the forward edges -- plus, for a backward colour class
    without forward nodes, the mirrored backward edges touching it -- must be acyclic). Loads follow the
    README: an accelerator pays ``acc_latency`` plus each crossing output's ``cost`` once as producer and
    once per consuming device; a CPU pays ``cpu_latency`` only.
    """
    k, cpus, mem = _params(g)
    k = k if num_accs is None else int(num_accs)
    cpus = cpus if num_cpus is None else int(num_cpus)
    cols = _columns(g)
    dev = _device_array(g, device_of)
    n = g.num_nodes
    ids = g.nodes["id"]
    nd = k + cpus
    viol: list[str] = []

    bad = np.flatnonzero((dev < 0) | (dev >= nd))
    if len(bad):
        viol.append(f"node {ids[bad[0]]}: device {dev[bad[0]]} out of range 0..{nd - 1} "
                    f"({len(bad)} nodes)")
        return SplitEvaluation(_INF, [_INF] * nd, viol)

    is_acc = dev < k
    bad = np.flatnonzero(is_acc & ~cols["supported_on_acc"])
    if len(bad):
        viol.append(f"node {ids[bad[0]]}: not supported on an accelerator but placed on accelerator "
                    f"{dev[bad[0]]}")

    # colour classes
    cc = cols["color_class"]
    where: dict[int, tuple[int, int]] = {}
    for r in range(n):
        c = int(cc[r])
        if c < 0:
            continue
        if c in where and where[c][1] != dev[r]:
            viol.append(f"colour class {c}: node {ids[where[c][0]]} on device {where[c][1]} but node "
                        f"{ids[r]} on device {dev[r]}")
            where[c] = (r, int(dev[r]))  # report each class at most a few times
        else:
            where.setdefault(c, (r, int(dev[r])))

    # memory
    for d in range(k):
        used = float(cols["mem_bytes"][dev == d].sum())
        if used > mem:
            viol.append(f"accelerator {d}: uses {used:.0f} bytes, more than max_bytes_per_acc = {mem:.0f}")

    # contiguity: the device graph of forward edges (and mirrored edges of orphaned backward classes)
    src, dst = g.edge_pos
    bwd = g.nodes["is_backward"].astype(bool)
    with_forward = {int(c) for c, b in zip(cc, bwd) if not b and c >= 0}

    def orphaned(r: int) -> bool:  # a backward node whose class has no forward node
        return bool(bwd[r]) and (cc[r] < 0 or int(cc[r]) not in with_forward)

    arcs: set[tuple[int, int]] = set()
    for s, t in zip(src.tolist(), dst.tolist()):
        if dev[s] == dev[t]:
            continue
        if not bwd[s] and not bwd[t]:
            arcs.add((int(dev[s]), int(dev[t])))
        elif bwd[s] and bwd[t] and (orphaned(s) or orphaned(t)):
            # the reference mirrors this edge between forward stand-ins of the two classes (which sit
            # where the classes sit); an edge inside one class lies on one device anyway
            arcs.add((int(dev[t]), int(dev[s])))
    indeg = [0] * nd
    succ: list[list[int]] = [[] for _ in range(nd)]
    for a, b in arcs:
        succ[a].append(b)
        indeg[b] += 1
    ready = [d for d in range(nd) if indeg[d] == 0]
    seen = 0
    while ready:
        d = ready.pop()
        seen += 1
        for e in succ[d]:
            indeg[e] -= 1
            if indeg[e] == 0:
                ready.append(e)
    if seen < nd:
        cyc = sorted(d for d in range(nd) if indeg[d] > 0)
        viol.append(f"not contiguous: the forward edges between devices {cyc} form a cycle")

    # loads
    loads = np.zeros(nd)
    np.add.at(loads, dev[is_acc], cols["acc_latency"][is_acc])
    np.add.at(loads, dev[~is_acc], cols["cpu_latency"][~is_acc])
    out_cost = _out_cost(g, cols["cost"])
    consumers: dict[int, set[int]] = {}
    for s, t in zip(src.tolist(), dst.tolist()):
        if dev[t] != dev[s]:
            consumers.setdefault(s, set()).add(int(dev[t]))
    for s, devs in consumers.items():
        c = out_cost[s]
        if dev[s] < k:
            loads[dev[s]] += c
        for d in devs:
            if d < k:
                loads[d] += c
    ml = float(loads.max()) if nd else 0.0
    return SplitEvaluation(ml, [float(x) for x in loads], viol)


# ============================================================================================ contraction
class _Problem:
    """The contracted instance: forward supernodes (colour classes merged, strongly connected pieces of
    the forward graph fused, zero-latency leaves merged into their neighbour) in a topological order,
    with their backward rows attached; hyperedges carry the communication."""

    def __init__(self, g: OpGraph):
        self.g = g
        self.k, self.cpus, self.mem = _params(g)
        cols = _columns(g)
        self.cols = cols
        self.n = g.num_nodes
        bwd = g.nodes["is_backward"].astype(bool)
        cc = cols["color_class"]
        key, orphan = _orphan_classes(bwd, cc)
        # one forward vertex per colour-class key (a virtual one for an orphaned backward class)
        keys = sorted(set(key.tolist()))
        kidx = {kk: i for i, kk in enumerate(keys)}
        C = len(keys)
        row_class = np.array([kidx[int(x)] for x in key], dtype=np.int64)
        src, dst = g.edge_pos
        arcs: set[tuple[int, int]] = set()
        for s, t in zip(src.tolist(), dst.tolist()):
            a, b = int(row_class[s]), int(row_class[t])
            if a == b:
                continue
            if not bwd[s] and not bwd[t]:
                arcs.add((a, b))
            elif bwd[s] and bwd[t] and (orphan[s] or orphan[t]):
                arcs.add((b, a))
        # strongly connected components of the class graph (iterative Tarjan)
        comp = _scc(C, arcs)
        # union-find over components for the zero-latency merges
        ncomp = int(comp.max()) + 1 if C else 0
        row_comp = comp[row_class]
        self._merge_leaves(ncomp, row_comp, arcs, comp, src, dst)

    # ------------------------------------------------------------------------------------------------
    def _merge_leaves(self, ncomp: int, row_comp: np.ndarray, arcs: set[tuple[int, int]],
                      comp: np.ndarray, src: np.ndarray, dst: np.ndarray) -> None:
        cols = self.cols
        acc = np.bincount(row_comp, cols["acc_latency"], ncomp)
        cpu = np.bincount(row_comp, cols["cpu_latency"], ncomp)
        size = np.bincount(row_comp, cols["mem_bytes"], ncomp)
        unsup = np.bincount(row_comp, (~cols["supported_on_acc"]).astype(np.float64), ncomp)
        mem_slack = float(cols["mem_bytes"].sum()) <= self.mem
        dag_nb: list[set[int]] = [set() for _ in range(ncomp)]
        dag_arcs: set[tuple[int, int]] = set()
        for a, b in arcs:
            ca, cb = int(comp[a]), int(comp[b])
            if ca != cb:
                dag_nb[ca].add(cb)
                dag_nb[cb].add(ca)
                dag_arcs.add((ca, cb))
        edge_nb: list[set[int]] = [set() for _ in range(ncomp)]
        for s, t in zip(row_comp[src].tolist(), row_comp[dst].tolist()):
            if s != t:
                edge_nb[s].add(t)
                edge_nb[t].add(s)
        parent = list(range(ncomp))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        def mergeable(v: int) -> int:
            """The supernode v can be merged into (a dominance that keeps the optimum), or -1."""
            if acc[v] != 0 or cpu[v] != 0 or (size[v] != 0 and not mem_slack):
                return -1
            if len(dag_nb[v]) != 1:
                return -1
            m = next(iter(dag_nb[v]))
            if not edge_nb[v] <= {m}:
                return -1
            if unsup[v] and not unsup[m]:
                return -1
            return m

        work = list(range(ncomp))
        merged = 0
        while work:
            v = work.pop()
            if find(v) != v:
                continue
            m = mergeable(v)
            if m < 0:
                continue
            parent[v] = m
            merged += 1
            dag_nb[m].discard(v)
            edge_nb[m].discard(v)
            acc[m] += acc[v]
            cpu[m] += cpu[v]
            size[m] += size[v]
            unsup[m] += unsup[v]
            dag_nb[v] = set()
            edge_nb[v] = set()
            work.append(m)
            # neighbours of m may have become mergeable only through m itself; nothing else changes
        roots = [v for v in range(ncomp) if find(v) == v]
        # topological order of the roots (Kahn, smallest first)
        ridx = {r: i for i, r in enumerate(roots)}
        R = len(roots)
        succ: list[set[int]] = [set() for _ in range(R)]
        for a, b in dag_arcs:
            ra, rb = ridx[find(a)], ridx[find(b)]
            if ra != rb:
                succ[ra].add(rb)
        indeg = [0] * R
        for a in range(R):
            for b in succ[a]:
                indeg[b] += 1
        ready = [v for v in range(R) if indeg[v] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            v = heapq.heappop(ready)
            order.append(v)
            for w in succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    heapq.heappush(ready, w)
        assert len(order) == R, "contracted forward graph is not acyclic"
        pos = np.empty(R, dtype=np.int64)
        pos[np.asarray(order, dtype=np.int64)] = np.arange(R)
        comp_to_sn = np.array([pos[ridx[find(c)]] for c in range(ncomp)], dtype=np.int64)
        self.F = R
        self.sn = comp_to_sn[row_comp] if len(row_comp) else np.zeros(0, np.int64)
        self.merged_leaves = merged
        self.dag_edges = sorted({(int(pos[a]), int(pos[b])) for a in range(R) for b in succ[a]})
        self.preds = [0] * R
        self.succs: list[list[int]] = [[] for _ in range(R)]
        for a, b in self.dag_edges:
            self.preds[b] |= 1 << a
            self.succs[a].append(b)
        F = R
        sn = self.sn
        self.acc = np.bincount(sn, cols["acc_latency"], F)
        self.cpu = np.bincount(sn, cols["cpu_latency"], F)
        self.size = np.bincount(sn, cols["mem_bytes"], F)
        self.unsup = np.bincount(sn, (~cols["supported_on_acc"]).astype(np.float64), F)
        # hyperedges: the producer's supernode and its consumers' supernodes; cost paid when split
        out_cost = _out_cost(self.g, cols["cost"])
        groups: dict[int, set[int]] = {}
        for s, t in zip(src.tolist(), dst.tolist()):
            if sn[s] != sn[t]:
                groups.setdefault(s, {int(sn[s])}).add(int(sn[t]))
        hyper: dict[tuple[int, ...], float] = {}
        for s, members in groups.items():
            if out_cost[s] > 0:
                t = tuple(sorted(members))
                hyper[t] = hyper.get(t, 0.0) + float(out_cost[s])
        self.h_members = [np.asarray(t, dtype=np.int64) for t in hyper]
        self.h_cost = np.asarray(list(hyper.values()), dtype=np.float64)
        self.H = len(self.h_members)

    # ------------------------------------------------------------------------------------------------
    def acc_ok(self) -> np.ndarray:
        """Supernodes that may go on an accelerator (all rows supported, and they fit in memory)."""
        if not self.k:
            return np.zeros(self.F, dtype=bool)
        return (self.unsup == 0) & (self.size <= self.mem)

    def lower_bound(self) -> float:
        """A simple bound: every supernode sits whole on a device it may use, and the work cannot be
        spread thinner than over all devices (a CPU of load <= T holds at most ``T * ratio``
        accelerator time). ``inf`` when some supernode fits nowhere."""
        if self.F == 0:
            return 0.0
        ok = self.acc_ok()
        per = np.where(ok, self.acc, _INF)
        if self.cpus:
            per = np.minimum(per, self.cpu)
        lb = float(per.max())
        if not math.isfinite(lb):
            return _INF
        if self.cpus:
            lb = max(lb, float(self.cpu[~ok].sum()) / self.cpus)
        if self.k:
            rmax = self._cpu_ratio()
            if math.isfinite(rmax):
                lb = max(lb, float(self.acc[ok].sum()) / (self.k + self.cpus * rmax))
        else:
            lb = max(lb, float(self.cpu.sum()) / self.cpus)
        return lb

    def _cpu_ratio(self) -> float:
        """max acc/cpu over supernodes: a CPU piece of CPU time <= T holds at most T * ratio acc time."""
        pos = self.acc > 0
        if not pos.any():
            return 0.0
        if (self.cpu[pos] <= 0).any():
            return _INF
        return float((self.acc[pos] / self.cpu[pos]).max())


def _scc(C: int, arcs: set[tuple[int, int]]) -> np.ndarray:
    """Strongly connected component id per vertex (iterative Tarjan)."""
    adj: list[list[int]] = [[] for _ in range(C)]
    for a, b in arcs:
        adj[a].append(b)
    index = [-1] * C
    low = [0] * C
    on = [False] * C
    stack: list[int] = []
    comp = np.full(C, -1, dtype=np.int64)
    counter = 0
    ncomp = 0
    for root in range(C):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on[root] = True
        while work:
            v, i = work[-1]
            if i < len(adj[v]):
                work[-1] = (v, i + 1)
                w = adj[v][i]
                if index[w] < 0:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on[w] = True
                    work.append((w, 0))
                elif on[w]:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    while True:
                        w = stack.pop()
                        on[w] = False
                        comp[w] = ncomp
                        if w == v:
                            break
                    ncomp += 1
    return comp


# ============================================================================================ DP
class _TooManyIdeals(Exception):
    pass


def _enumerate_ideals(p: _Problem, limit: int) -> list[int]:
    """All downsets of the contracted forward DAG as bitmasks (each generated once: a child adds an
    available supernode above the current maximum)."""
    F = p.F
    preds, succs = p.preds, p.succs
    out = [0]
    init_avail = 0
    for v in range(F):
        if preds[v] == 0:
            init_avail |= 1 << v
    stack = [(0, init_avail, -1)]
    while stack:
        ideal, avail, top = stack.pop()
        cand = avail >> (top + 1) << (top + 1)
        while cand:
            low = cand & -cand
            v = low.bit_length() - 1
            cand ^= low
            child = ideal | low
            new_avail = avail & ~low
            for w in succs[v]:
                if preds[w] & ~child == 0:
                    new_avail |= 1 << w
            out.append(child)
            if len(out) > limit:
                raise _TooManyIdeals(limit)
            stack.append((child, new_avail, v))
    return out


class _Lattice:
    """The ideals as arrays: bitset words, per-ideal sums and hyperedge split counts."""

    def __init__(self, p: _Problem, ideals: list[int]):
        F = p.F
        N = self.N = len(ideals)
        W = self.W = max(1, (F + 63) // 64)
        raw = b"".join(i.to_bytes(8 * W, "little") for i in ideals)
        self.words = np.frombuffer(raw, dtype=np.uint64).reshape(N, W)
        bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8).reshape(N, 8 * W), axis=1,
                             bitorder="little")[:, :F]
        self.bits = bits
        sums = np.empty((N, 4))
        weights = np.stack([p.acc, p.cpu, p.size, p.unsup], axis=1)
        for a in range(0, N, 8192):  # in chunks: a float copy of all the bits may be large
            sums[a:a + 8192] = bits[a:a + 8192].astype(np.float64) @ weights
        self.acc, self.cpu, self.size, self.unsup = (np.ascontiguousarray(sums[:, c]) for c in range(4))
        self.pop = bits.sum(axis=1, dtype=np.int64)
        H = p.H
        S = np.zeros((N, H), dtype=np.int16)
        for h, members in enumerate(p.h_members):
            cnt = bits[:, members].sum(axis=1, dtype=np.int16)
            S[:, h] = np.where((cnt > 0) & (cnt < len(members)), cnt, 0)
        self.split = S
        self.fcut = (S > 0).astype(np.float64) @ p.h_cost if H else np.zeros(N)
        self.full = int(np.argmax(self.pop))
        self.empty = int(np.argmin(self.pop))


class _DPRun:
    """One run of the DP at threshold ``T``: pieces of cost > T are dropped, and an ideal is kept in a
    state (c CPUs and f accelerators used) only if its forward accelerator work fits in those devices
    and the rest fits in the others. ``dp[i, c, f]`` is the best max-load covering ideal i."""

    def __init__(self, p: _Problem, lat: _Lattice, T: float):
        self.p, self.lat, self.T = p, lat, T
        k, cpus = p.k, p.cpus
        C1, K1 = cpus + 1, k + 1
        self.tol = 1e-9 * max(1.0, T if math.isfinite(T) else 1.0)
        rmax = p._cpu_ratio()
        if math.isfinite(T):
            ccap = (T * rmax if math.isfinite(rmax) else _INF) if cpus else 0.0
            total = float(lat.acc[lat.full])
            fs = np.arange(K1)[None, :]
            cs = np.arange(C1)[:, None]
            cpu_work = np.where(cs > 0, cs * ccap if math.isfinite(ccap) else _INF, 0.0)
            rest_work = np.where(cpus - cs > 0, (cpus - cs) * ccap if math.isfinite(ccap) else _INF, 0.0)
            before = fs * T + cpu_work                 # work that fits in f accs and c cpus
            after = (k - fs) * T + rest_work            # work that fits in the devices left
            a = lat.acc[:, None, None]
            self.band = (a <= before[None] + self.tol) & (total - a <= after[None] + self.tol)
            self.window = max(T, ccap)
        else:
            self.band = np.ones((lat.N, C1, K1), dtype=bool)
            self.window = _INF
        self.dp = np.full((lat.N, C1, K1), _INF)
        self.alive = np.zeros(lat.N, dtype=bool)  # finite in some state: the only useful sources
        in_any = self.band.any(axis=(1, 2))
        order_acc = np.flatnonzero(in_any)
        self.order_acc = order_acc[np.argsort(lat.acc[order_acc], kind="stable")]
        self.acc_sorted = lat.acc[self.order_acc]
        # the candidates' data in that order, so that a window is a slice (no gathers)
        self.words_sorted = np.ascontiguousarray(lat.words[self.order_acc].T)   # (W, n)
        self.pop_sorted = lat.pop[self.order_acc]
        self.alive_sorted = np.zeros(len(self.order_acc), dtype=bool)
        self.sorted_pos = np.full(lat.N, -1, dtype=np.int64)
        self.sorted_pos[self.order_acc] = np.arange(len(self.order_acc))
        process = np.flatnonzero(in_any)
        self.process = process[np.argsort(lat.pop[process], kind="stable")]
        self.pairs = 0
        self.window_total = 0

    def pieces_into(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The live proper sub-ideals j of ideal i and the cost of the piece i \\ j on an accelerator
        (inf when over T, over memory or holding a CPU-only node) and on a CPU (inf when over T)."""
        p, lat, T, tol = self.p, self.lat, self.T, self.tol
        ai = lat.acc[i]
        lo = 0
        if math.isfinite(self.window):
            lo = int(np.searchsorted(self.acc_sorted, ai - self.window - tol))
        hi = int(np.searchsorted(self.acc_sorted, ai + tol, side="right"))
        self.window_total += hi - lo
        wi = ~lat.words[i]
        ws = self.words_sorted
        outside = ws[0, lo:hi] & wi[0]
        for w in range(1, len(wi)):
            outside |= ws[w, lo:hi] & wi[w]
        keep = (outside == 0) & self.alive_sorted[lo:hi] & (self.pop_sorted[lo:hi] < lat.pop[i])
        cand = self.order_acc[lo:hi][keep]
        if not len(cand):
            return cand, np.zeros(0), np.zeros(0)
        fs = np.flatnonzero(lat.split[i])
        comm = lat.fcut[i] + lat.fcut[cand]
        if len(fs):
            sc = lat.split[np.ix_(cand, fs)]
            comm = comm - ((sc > 0) * (1 + (sc == lat.split[i, fs]))) @ p.h_cost[fs]
        fcost = (ai - lat.acc[cand]) + comm
        bad = (fcost > T + tol) | (lat.size[i] - lat.size[cand] > p.mem)
        bad |= lat.unsup[i] - lat.unsup[cand] > 0.5
        fcost = np.where(bad, _INF, fcost)
        ccost = lat.cpu[i] - lat.cpu[cand]
        ccost = np.where(ccost > T + tol, _INF, ccost)
        return cand, fcost, ccost

    def raw(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The values of ideal i per state through one last (non-empty) piece, with the pieces."""
        p, dp = self.p, self.dp
        k, cpus = p.k, p.cpus
        if i == self.lat.empty:
            return np.zeros((cpus + 1, k + 1)), np.zeros(0, np.int64), np.zeros(0), np.zeros(0)
        new = np.full((cpus + 1, k + 1), _INF)
        cand, fcost, ccost = self.pieces_into(i)
        if len(cand):
            D = dp[cand]  # (n, C1, K1)
            if k:
                new[:, 1:] = np.maximum(D[:, :, :-1], fcost[:, None, None]).min(axis=0)
            if cpus:
                np.minimum(new[1:, :], np.maximum(D[:, :-1, :], ccost[:, None, None]).min(axis=0),
                           out=new[1:, :])
        return new, cand, fcost, ccost

    def run(self, deadline: float) -> float:
        lat, dp = self.lat, self.dp
        for it, i in enumerate(self.process):
            if it % 256 == 0 and time.monotonic() > deadline:
                raise TimeoutError
            new, cand, _, _ = self.raw(i)
            self.pairs += len(cand)
            # a device may stay empty: the value with fewer devices carries over
            new = np.minimum.accumulate(np.minimum.accumulate(new, axis=0), axis=1)
            new[~self.band[i]] = _INF
            dp[i] = new
            if np.isfinite(new).any():
                self.alive[i] = True
                self.alive_sorted[self.sorted_pos[i]] = True
        return float(dp[lat.full, self.p.cpus, self.p.k])

    def stats(self) -> dict[str, Any]:
        return {"T": self.T, "processed_ideals": int(len(self.process)),
                "alive_ideals": int(self.alive.sum()), "window": int(self.window_total),
                "pairs": int(self.pairs)}

    def backtrack(self) -> np.ndarray:
        """The split achieving ``dp[full, cpus, k]``: recompute the transitions along the way back."""
        p, lat, dp = self.p, self.lat, self.dp
        c, f, i = p.cpus, p.k, lat.full
        v = dp[i, c, f]
        pieces: list[tuple[str, int, int]] = []
        while i != lat.empty:
            raw, cand, fcost, ccost = self.raw(i)
            # the state (c', f') <= (c, f) whose last piece gave v (the devices in between stay empty)
            c, f = (int(x[0]) for x in np.nonzero(raw[:c + 1, :f + 1] == v))
            j = -1
            if f:
                hit = np.flatnonzero(np.maximum(dp[cand, c, f - 1], fcost) == v)
                if len(hit):
                    j = int(cand[hit[0]])
                    pieces.append(("acc", j, i))
                    f -= 1
            if j < 0 and c:
                hit = np.flatnonzero(np.maximum(dp[cand, c - 1, f], ccost) == v)
                if len(hit):
                    j = int(cand[hit[0]])
                    pieces.append(("cpu", j, i))
                    c -= 1
            if j < 0:  # pragma: no cover - a finite DP value is always reached by some transition
                raise AssertionError("DP backtracking found no transition")
            i = j
            v = dp[i, c, f]
        pieces.reverse()
        sn_dev = np.full(p.F, -1, dtype=np.int64)
        na = nc = 0
        for kind, j, i in pieces:
            mask = lat.bits[i].astype(bool) & ~lat.bits[j].astype(bool)
            if kind == "acc":
                sn_dev[mask] = na
                na += 1
            else:
                sn_dev[mask] = p.k + nc
                nc += 1
        assert (sn_dev >= 0).all()
        return sn_dev[p.sn]


_DELTAS = (0.005, 0.01, 0.02, 0.03, 0.045, 0.065, 0.09, 0.125, 0.175, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5,
           2.5, 4.0)
_SMALL_LATTICE = 6000  # up to this many ideals, the DP runs unpruned at once
_STRAIGHT_TO_UB = 1.5  # prune at the known split's value at once when it is within this factor of the bound


def _chain_split(p: _Problem, deadline: float) -> tuple[np.ndarray | None, float]:
    """A quick feasible split: the DP over the prefixes of the topological order (a sub-lattice)."""
    lat = _Lattice(p, [(1 << i) - 1 for i in range(p.F + 1)])
    run = _DPRun(p, lat, _INF)
    try:
        val = run.run(deadline)
    except TimeoutError:
        return None, _INF
    if not math.isfinite(val):
        return None, _INF
    dev = run.backtrack()
    return dev, evaluate_split(p.g, dev).max_load


def _solve_dp(p: _Problem, lat: _Lattice, deadline: float, stats: dict, lb: float,
              ub: float) -> tuple[np.ndarray | None, float, str]:
    """The exact DP, pruned by a threshold that grows from ``lb`` to ``ub`` (a known split's value).
    Returns (device_of or None, proven lower bound, "optimal" | "infeasible" | "timeout")."""
    if lat.N <= _SMALL_LATTICE or lb <= 0:
        thresholds = [_INF]
    elif math.isfinite(ub) and ub <= lb * _STRAIGHT_TO_UB:
        # an attempt at a known split's value always succeeds; below it, attempts near the optimum
        # cost about as much as one at it, so go straight there when the split is already close
        thresholds = [ub * (1 + 1e-9)]
    else:
        cap = ub / _STRAIGHT_TO_UB
        thresholds = [lb * (1 + d) for d in _DELTAS if lb * (1 + d) < cap]
        thresholds.append(ub * (1 + 1e-9) if math.isfinite(ub) else _INF)
    attempts: list[dict] = []
    stats["dp_attempts"] = attempts
    for T in thresholds:
        t0 = time.monotonic()
        run = _DPRun(p, lat, T)
        try:
            val = run.run(deadline)
        except TimeoutError:
            attempts.append(run.stats() | {"timeout": True})
            return None, lb, "timeout"
        st = run.stats()
        st["found"] = math.isfinite(val)
        st["time_s"] = round(time.monotonic() - t0, 3)
        attempts.append(st)
        if math.isfinite(val):
            return run.backtrack(), val, "optimal"
        if math.isfinite(T):
            lb = max(lb, T)  # no split of max-load <= T exists
        else:
            return None, _INF, "infeasible"
    return None, lb, "timeout"  # pragma: no cover - the last threshold is >= a known split's value


# ============================================================================================ MILP
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


# ============================================================================================ API
def solve_max_load(g: OpGraph, method: str = "auto", time_limit_s: float = 600.0, *,
                   max_ideals: int = 250_000, threads: int = 2) -> MaxLoadResult:
    """Minimise the max-load of ``g`` (see the module docstring).

    ``method``:

    * ``"dp"`` -- the exact DP over ideals (a ``ValueError`` if there are more than ``max_ideals``).
      On more than a few thousand ideals it is pruned at a threshold: a quick split's value (the DP
      over the prefixes of one topological order) when that is close to the simple lower bound, else
      a threshold growing from the lower bound;
    * ``"milp"`` -- CP-SAT on the chain-of-ideals model (``threads`` workers): optimal up to the
      rounding bound of the scaled times (reported in ``gap``), or the best split and its bound at
      ``time_limit_s``;
    * ``"auto"`` -- the DP when the ideals number at most ``max_ideals``, else CP-SAT.

    The returned split is always re-evaluated by :func:`evaluate_split`. ``status`` is "optimal",
    "feasible" (time limit hit; ``lower_bound``/``gap`` say how far it may be) or "infeasible" (no split
    satisfies the constraints, e.g. nothing fits in memory; ``max_load`` is then ``inf``). In the rare
    case that the time limit passes before any split is found and none is proven impossible, the
    status is "unknown" (``max_load`` inf, ``device_of`` all -1).
    """
    if method not in _METHODS:
        raise ValueError(f"method: {method!r} is not one of {list(_METHODS)}")
    if isinstance(time_limit_s, bool) or not isinstance(time_limit_s, (int, float)) or not time_limit_s > 0:
        raise ValueError(f"time_limit_s: {time_limit_s!r}, expected a positive number of seconds")
    if isinstance(max_ideals, bool) or not isinstance(max_ideals, int) or max_ideals < 1:
        raise ValueError(f"max_ideals: {max_ideals!r}, expected a positive integer")
    t0 = time.monotonic()
    deadline = t0 + float(time_limit_s)
    p = _Problem(g)
    k, cpus = p.k, p.cpus
    nd = k + cpus
    stats: dict[str, Any] = {"k": k, "cpus": cpus, "nodes": p.n, "supernodes": p.F,
                             "merged_leaves": p.merged_leaves, "hyperedges": p.H}

    def done(dev: np.ndarray | None, lb: float, status: str, used: str) -> MaxLoadResult:
        elapsed = time.monotonic() - t0
        if dev is None:  # infeasible, or (status "unknown") out of time before any split was found
            infeasible = status == "infeasible"
            return MaxLoadResult(_INF, np.full(p.n, -1, dtype=np.int64), [_INF] * nd, status,
                                 _INF if infeasible else lb, 0.0 if infeasible else _INF, used, elapsed,
                                 stats)
        ev = evaluate_split(g, dev)
        if not ev.valid:  # pragma: no cover - the solvers only produce valid splits
            raise AssertionError(f"solver produced an invalid split: {ev.violations[:3]}")
        ml = ev.max_load
        if status == "optimal" and used == "dp":
            if abs(lb - ml) > 1e-9 * max(1.0, ml):  # pragma: no cover - DP and evaluator must agree
                raise AssertionError(f"DP value {lb} != evaluated {ml}")
            lb = ml
        lb = min(lb, ml)
        gap = 0.0 if ml <= 0 else max(0.0, (ml - lb) / ml)
        return MaxLoadResult(ml, dev, ev.loads, status, lb, gap, used, elapsed, stats)

    if p.n == 0:
        return done(np.zeros(0, dtype=np.int64), 0.0, "optimal", "trivial")
    lb = p.lower_bound()
    if not math.isfinite(lb) or nd == 0:
        stats["reason"] = "a node fits on no device"
        return done(None, _INF, "infeasible", method)

    lat = None
    if method in ("dp", "auto"):
        try:
            t1 = time.monotonic()
            lat = _Lattice(p, _enumerate_ideals(p, max_ideals))
            stats.update(ideals=lat.N, lattice_s=round(time.monotonic() - t1, 3))
        except _TooManyIdeals:
            if method == "dp":
                raise ValueError(f"method 'dp': the contracted graph has more than max_ideals = {max_ideals} "
                                 "ideals; use method='milp' or 'auto'") from None
            stats["ideals"] = f">{max_ideals}"

    if lat is None:  # MILP alone
        dev, mlb, optimal = _solve_milp(p, deadline, stats, threads)
        if dev is None:
            if optimal:
                return done(None, _INF, "infeasible", "milp")
            dev, _ = _chain_split(p, deadline + 60.0)  # time ran out before any split: a quick one
            if dev is None:
                return done(None, max(lb, mlb), "unknown", "milp")
        return done(dev, max(lb, mlb), "optimal" if optimal else "feasible", "milp")

    # the DP, pruned at first by a quick split's value (the DP over the topological order's prefixes)
    best, ub = None, _INF
    used = "dp"
    if lat.N > _SMALL_LATTICE:
        best, ub = _chain_split(p, deadline)
        stats["seed_max_load"] = ub
    dev, dlb, how = _solve_dp(p, lat, deadline, stats, lb, ub)
    if how == "optimal":
        return done(dev, dlb, "optimal", used)
    if how == "infeasible":
        return done(None, _INF, "infeasible", used)
    # out of time: the best split known, with the bound proven so far
    if best is None:
        best, _ = _chain_split(p, deadline + 60.0)
        if best is None:
            return done(None, max(lb, dlb), "unknown", used)
    return done(best, max(lb, dlb), "feasible", used)


def _reference_key(path: Path) -> str | None:
    key = f"{path.parent.name}/{path.name}"
    return key if key in REFERENCE_MAX_LOADS else None


def solve_dp_command(path: str, method: str = "auto", time_limit_s: float = 600.0) -> dict[str, Any]:
    """``archplace solve-dp FILE.json``: load, solve, and return a JSON-able summary."""
    from archplace.workloads.dnn_partitioning import load_dnn_partitioning

    fpath = Path(path)
    g = load_dnn_partitioning(fpath)
    res = solve_max_load(g, method=method, time_limit_s=time_limit_s)
    k = res.stats.get("k", 0)
    ids = g.nodes["id"]
    devices = []
    for d, load in enumerate(res.loads):
        rows = np.flatnonzero(res.device_of == d)
        devices.append({"device": d, "kind": "accelerator" if d < k else "cpu",
                        "index": d if d < k else d - k, "load": _num(load),
                        "nodes": sorted(int(i) for i in ids[rows])})
    out: dict[str, Any] = {
        "file": str(fpath),
        "nodes": int(g.num_nodes),
        "k": int(k),
        "cpus": int(res.stats.get("cpus", 0)),
        "max_load": _num(res.max_load),
        "status": res.status,
        "lower_bound": _num(res.lower_bound),
        "gap": _num(res.gap),
        "method": res.method,
        "solve_time_s": round(res.solve_time_s, 3),
        "devices": devices,
        "stats": _jsonable(res.stats),
    }
    ref_key = _reference_key(fpath)
    if ref_key is not None:
        ref = REFERENCE_MAX_LOADS[ref_key]
        out["reference"] = ref
        out["rel_diff"] = _num((res.max_load - ref) / ref) if math.isfinite(res.max_load) else None
    else:
        out["reference"] = None
        out["rel_diff"] = None
    return out


def _jsonable(x: Any) -> Any:
    """Strict JSON: numpy scalars to Python, non-finite floats to None, anything else to a string."""
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, np.ndarray)):
        return [_jsonable(v) for v in x]
    x = _num(x)
    return x if x is None or isinstance(x, (bool, int, float, str)) else str(x)


def _num(x: Any) -> Any:
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else None
    return x


def reference_value(path: str | Path) -> float | None:
    """The README's optimal max-load for ``path`` (matched on "<folder>/<file name>"), or None."""
    key = _reference_key(Path(path))
    return REFERENCE_MAX_LOADS[key] if key else None

