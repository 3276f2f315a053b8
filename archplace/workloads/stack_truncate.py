"""A forward graph cut back to the blocks its capture held: the inverse of ``stack_expand`` for timing.

Why: ``archplace plan`` times one micro-batch of every layer for each (tensor-parallel width, micro-batch,
tokens per rank, attention) it considers, and deriving the backward pass of a 96-block GPT-3 graph costs
about 0.1 s each time, almost all of it on blocks that are copies (``stack_expand`` made block p >= n a
copy of captured block j). Cut to the captured blocks, the graph is a few blocks long; each full-depth
block then takes the times of the captured block it copies (:func:`truncate_to_captured`'s map), which
are the same ops with the same edges. tests/test_plan_search.py checks that the per-layer times of the
cut graph, mapped back, equal those of the full graph.

The edges that ``stack_expand`` moved to leave from the stack's last block (to the layers after the
stack: the final norm, the head) leave again from the last captured block, row for row (blocks of one kind
hold the same ops in the same order).
"""

from __future__ import annotations

import numpy as np

from .graph import OpGraph


def truncate_to_captured(g: OpGraph) -> tuple[OpGraph, dict[str, str]]:
    """(the forward graph ``g`` without its copied blocks, {every layer of ``g``: the layer of the cut graph
    whose ops it repeats}). A graph whose stacks were captured whole comes back unchanged."""
    if g.nodes["is_backward"].any():
        raise ValueError("truncate_to_captured works on forward graphs (before derive_backward)")
    names = list(g.meta.get("layers") or [])
    rep = {n: n for n in names}
    captured = dict(g.meta.get("captured_blocks") or {})
    kinds = dict(g.meta.get("block_kinds") or {})
    layer, ids = g.nodes["layer"], g.nodes["id"]
    drop: list[int] = []
    remap_from: list[np.ndarray] = []
    remap_to: list[np.ndarray] = []
    for st, n in captured.items():
        ks = list(kinds.get(st) or [])
        depth = len(ks)
        if n >= depth:
            continue
        template_of_pair = {(ks[j - 1], ks[j]): j for j in range(2, n)}   # the last one wins, as expanded
        for p in range(n, depth):
            j = template_of_pair.get((ks[p - 1], ks[p]))
            if j is None or f"{st}.{p}" not in names:
                raise ValueError(f"stack {st!r}: block {p} has no captured template; capture every block")
            rep[f"{st}.{p}"] = f"{st}.{j}"
            drop.append(names.index(f"{st}.{p}"))
        last_full = np.flatnonzero(layer == names.index(f"{st}.{depth - 1}"))
        last_cap = np.flatnonzero(layer == names.index(f"{st}.{n - 1}"))
        if len(last_full) != len(last_cap):
            raise ValueError(f"stack {st!r}: its last block and its last captured block differ in their ops")
        remap_from.append(ids[last_full])
        remap_to.append(ids[last_cap])
    if not drop:
        return g, rep
    dropped = np.zeros(len(names), bool)
    dropped[drop] = True
    keep = ~dropped[layer]
    src, dst = g.edge_pos
    e_src = g.edges["src"].copy()
    moved = np.zeros(len(e_src), bool)
    if remap_from:
        frm, to = np.concatenate(remap_from), np.concatenate(remap_to)
        order = np.argsort(frm)
        hit = np.isin(e_src, frm) & keep[dst]
        e_src[hit] = to[order][np.searchsorted(frm[order], e_src[hit])]
        moved = hit
    emask = keep[dst] & (keep[src] | moved)
    new_index = np.cumsum(~dropped) - 1
    nodes = {k: v[keep] for k, v in g.nodes.items()}
    nodes["layer"] = new_index[nodes["layer"]].astype(g.nodes["layer"].dtype)
    edges = {k: (e_src if k == "src" else v)[emask] for k, v in g.edges.items()}
    meta = dict(g.meta, layers=[nm for i, nm in enumerate(names) if not dropped[i]])
    out = OpGraph(nodes, edges, meta, {k: v[keep] for k, v in g.extra_nodes.items()},
                  {k: v[emask] for k, v in g.extra_edges.items()})
    return out, rep
