"""What the repair derives from the DAG alone, before any search.

``_random_topo`` is the default node order: a random topological order (Kahn's algorithm, a uniformly
random ready node at each step), so that a node is decided after its predecessors (package doc).
``_skip_triples`` lists the triples ``(p, m, q)`` of the skip-edge rule (for an edge ``(p, q)`` and a node
``m`` on another path ``p ~> q``, ``y_m`` must equal ``y_p`` or ``y_q``), which ``propagation._State``
propagates.
"""

from __future__ import annotations

import numpy as np

from ....workloads.graph import kahn_order
from .common import _bits


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
