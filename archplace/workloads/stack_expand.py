"""Grow a captured block stack to its full depth, block kind by block kind.

The capture holds the first n blocks of a stack (``block_kinds.capture_depths`` chose n); the full
stack has one kind per block (``block_kinds.model_census``). Block p >= n becomes a copy of the last
captured block j >= 2 whose pair (kind of j-1, kind of j) equals (kind of p-1, kind of p). The copy's
edges from block j-1 come from the matching ops of block p-1 (same kind, so the same ops in the same
order); its edges from anywhere else (the embeddings, masks, block 0's position bias, an encoder's
output) are the template's own. Edges from the last captured block to what follows the stack leave
from block L-1 instead. Rows and ids come out in the order a capture of every block would give.

A homogeneous stack is the old case: every copy is a copy of the last captured block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from .graph import OpGraph

_FINGERPRINT_COLS = ("kind", "core", "gemm_b", "gemm_m", "gemm_n", "gemm_k", "output_bytes")


def _fingerprint(g: OpGraph, rows: np.ndarray, internal_edges: int) -> tuple:
    nd = g.nodes
    return tuple(tuple(nd[c][rows].tolist()) for c in _FINGERPRINT_COLS) + (internal_edges,)


def expand_stack(g: OpGraph, stack: str, kinds: Sequence[int]) -> OpGraph:
    """``g`` (a forward graph holding blocks ``stack.0`` .. ``stack.{n-1}``) with the stack grown to
    ``len(kinds)`` blocks. Errors name the stack when the captured blocks cannot be the templates:
    they are not consecutive layers, two blocks of one kind differ in their ops, or a block reads a
    block other than its predecessor and block 0."""
    depth = len(kinds)
    names = list(g.meta["layers"])
    captured = 0
    while f"{stack}.{captured}" in names:
        captured += 1
    if captured == 0:
        raise ValueError(f"stack {stack!r}: no captured block in the graph (layers {names[:4]} ...)")
    if captured >= depth:
        return g
    hint = f"capture every block (capture_blocks={depth})"
    if g.nodes["is_backward"].any():
        raise ValueError("expand_stack works on forward graphs (before derive_backward)")
    bl = [names.index(f"{stack}.{j}") for j in range(captured)]  # each captured block's layer
    if bl != list(range(bl[0], bl[0] + captured)):
        raise ValueError(f"stack {stack!r}: other layers run between its blocks "
                         f"({names[bl[0]:bl[-1] + 1][:8]}); {hint}")
    last = bl[-1]  # copies go after the last captured block
    n0 = g.num_nodes
    layer = g.nodes["layer"]
    ids = g.nodes["id"]
    rows = [np.flatnonzero(layer == li) for li in bl]
    block_of = np.full(n0, -1, dtype=np.int64)
    rel = np.full(n0, -1, dtype=np.int64)
    for j, r in enumerate(rows):
        block_of[r] = j
        rel[r] = np.arange(len(r))
    src, dst = g.edge_pos
    internal = np.bincount(block_of[src][block_of[src] == block_of[dst]] + 1, minlength=captured + 1)[1:]
    # blocks of one kind (block 0 aside: what follows it can read more of it) hold the same ops
    ref: dict[int, int] = {}
    for j in range(1, captured):
        k = kinds[j]
        if k not in ref:
            ref[k] = j
        elif _fingerprint(g, rows[j], internal[j]) != _fingerprint(g, rows[ref[k]], internal[ref[k]]):
            raise ValueError(f"stack {stack!r}: blocks {ref[k]} and {j} are of one kind but their captured "
                             f"ops differ ({len(rows[ref[k]])} vs {len(rows[j])} ops); {hint}")
    template_of_pair = {(kinds[j - 1], kinds[j]): j for j in range(2, captured)}  # the last one wins
    template = {}
    for p in range(captured, depth):
        j = template_of_pair.get((kinds[p - 1], kinds[p]))
        if j is None or kinds[captured - 1] != kinds[-1]:
            raise ValueError(f"stack {stack!r}: the {captured} captured blocks hold no block of kind "
                             f"{kinds[p]} after one of kind {kinds[p - 1]} (block {p}); {hint}")
        template[p] = j
    # a block's inputs: its own ops, its predecessor, block 0 or outside the stack
    sb, db = block_of[src], block_of[dst]
    skip = (db >= 2) & (sb >= 1) & (sb < db - 1)
    if skip.any():
        e = int(np.flatnonzero(skip)[0])
        raise ValueError(f"stack {stack!r}: block {db[e]} reads block {sb[e]} (not its predecessor, not "
                         f"block 0), which copies cannot follow; {hint}")
    # ids of each block's ops, copies numbered after the existing ids
    block_ids: list[np.ndarray] = [ids[r] for r in rows]
    next_id = int(ids.max()) + 1
    for p in range(captured, depth):
        k = len(rows[template[p]])
        block_ids.append(next_id + np.arange(k, dtype=np.int64))
        next_id += k
    # edges: out of the last captured block to after the stack now leave from block L-1
    e_src = g.edges["src"].copy()
    out_last = (sb == captured - 1) & (db < 0) & (layer[dst] > last)
    e_src[out_last] = block_ids[depth - 1][rel[src[out_last]]]
    add_src, add_dst, add_b, add_a = [e_src], [g.edges["dst"]], [g.edges["bytes"]], [g.edges["arg"]]
    for p in range(captured, depth):
        j = template[p]
        sel = np.flatnonzero(db == j)
        s_rows, d_rows = src[sel], dst[sel]
        s_new = ids[s_rows].copy()
        own, prev = sb[sel] == j, sb[sel] == j - 1
        s_new[own] = block_ids[p][rel[s_rows[own]]]
        s_new[prev] = block_ids[p - 1][rel[s_rows[prev]]]
        add_src.append(s_new)
        add_dst.append(block_ids[p][rel[d_rows]])
        add_b.append(g.edges["bytes"][sel])
        add_a.append(g.edges["arg"][sel])
    edges = {"src": np.concatenate(add_src).astype(np.int64), "dst": np.concatenate(add_dst).astype(np.int64),
             "bytes": np.concatenate(add_b).astype(np.int64), "arg": np.concatenate(add_a).astype(np.int16)}
    # node columns: the originals, then the copies
    extra = depth - captured
    layer_new = np.where(layer > last, layer + extra, layer)
    cols = {}
    for c, v in g.nodes.items():
        parts = [layer_new.astype(v.dtype) if c == "layer" else v]
        for p in range(captured, depth):
            j = template[p]
            piece = v[rows[j]].copy()
            if c == "id":
                piece = block_ids[p]
            elif c == "layer":
                piece = np.full(len(piece), last + p - captured + 1, dtype=v.dtype)
            elif c == "name":
                pat = re.compile(rf"\b{re.escape(stack)}\.{j}\b")
                piece = np.array([pat.sub(f"{stack}.{p}", s) for s in piece], dtype=object)
            parts.append(piece)
        cols[c] = np.concatenate(parts)
    # the copies' rows right after the last captured block's, as a capture of every block orders
    # them; ids renumbered to the row order
    r_last = int(rows[-1].max())
    order = np.concatenate([np.arange(r_last + 1), np.arange(n0, len(cols["id"])), np.arange(r_last + 1, n0)])
    cols = {c: v[order] for c, v in cols.items()}
    old_ids = cols["id"]
    by_id = np.argsort(old_ids)

    def renumber(x: np.ndarray) -> np.ndarray:
        return by_id[np.searchsorted(old_ids[by_id], x)].astype(np.int64)

    edges["src"], edges["dst"] = renumber(edges["src"]), renumber(edges["dst"])
    cols["id"] = np.arange(len(order), dtype=np.int64)
    layers = names[:last + 1] + [f"{stack}.{p}" for p in range(captured, depth)] + names[last + 1:]
    meta = dict(g.meta, layers=layers)
    if g.meta.get("shared_params"):  # a parameter a template reads (Zamba's shared block): its copies too
        copies: dict[str, list[str]] = {}
        for p in range(captured, depth):
            copies.setdefault(f"{stack}.{template[p]}", []).append(f"{stack}.{p}")
        meta["shared_params"] = [dict(sp, layers=list(sp["layers"]) + [c for n in sp["layers"]
                                                                       for c in copies.get(n, [])])
                                 for sp in g.meta["shared_params"]]
    return OpGraph(cols, edges, meta)
