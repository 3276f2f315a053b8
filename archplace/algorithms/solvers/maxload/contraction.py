"""The contracted instance both exact methods work on: colour classes merged, strongly connected
pieces of the forward graph fused, zero-latency leaves merged into their neighbour where that keeps
the optimum, supernodes in a topological order, hyperedges carrying the communication.

Contraction is what makes the ideals few enough to enumerate, and it is shared by the DP and the
CP-SAT model so that they solve the same problem.
"""

from __future__ import annotations

import math

import numpy as np

from archplace.workloads.graph import OpGraph, kahn_order

from .inputs import _INF, _columns, _out_cost, _params


def _orphan_classes(bwd: np.ndarray, cc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Colour-class key per row (rows without a class get their own) and the rows whose class has no
    forward row (orphaned backward rows)."""
    n = len(cc)
    key = np.where(cc >= 0, cc, -(np.arange(n, dtype=np.int64) + 1))
    fwd_keys = set(key[~bwd].tolist())
    orphan = np.array([bool(bwd[r]) and int(key[r]) not in fwd_keys for r in range(n)], dtype=bool)
    return key, orphan


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
        arc_src = np.array([a for a in range(R) for _ in succ[a]], dtype=np.int64)
        arc_dst = np.array([b for a in range(R) for b in succ[a]], dtype=np.int64)
        order, stuck = kahn_order(R, arc_src, arc_dst)
        assert stuck < 0, "contracted forward graph is not acyclic"
        pos = np.empty(R, dtype=np.int64)
        pos[order] = np.arange(R)
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
