"""Which ``view`` rows of a captured training graph run a copy kernel on a GPU.

A view is free in the forward pass, but autograd materialises some of their gradients: the backward of a
``split``/``chunk``/``unbind`` concatenates the pieces' gradients, and the backward of a ``view``/
``reshape`` whose output reaches its first real op through an odd number of transposes receives a
non-contiguous gradient that its backward ``reshape`` copies. The op models (``simulators/gpu_ops.py``)
charge those rows their bytes; this module only reads the graph (its edges and node names), so it lives
with the graphs.
"""

from __future__ import annotations

import re

import numpy as np

from .graph import OpGraph

_CAT_GRAD_VIEWS = ("split", "split_with_sizes", "chunk", "unbind")
_RESHAPE_VIEWS = ("view", "_unsafe_view", "reshape", "flatten")
_TRANSPOSE_VIEWS = ("transpose", "permute", "t")


def _fx_base(name: str) -> str:
    """The aten op of a captured row's name (``model.layers.0.attn/view_9+mul`` -> ``view``)."""
    last = str(name).split("/grad")[0].rsplit("/", 1)[-1].split("+")[0]
    return re.sub(r"_\d+$", "", last)


def view_copies(graph: OpGraph) -> np.ndarray:
    """Rows of ``graph`` that are ``view`` rows but run a copy kernel: the backward of a forward
    ``split``/``chunk``/``unbind`` (autograd concatenates the gradients) and the backward of a forward
    ``view``/``reshape`` with one consumer whose output reaches its first non-view op through an odd
    number of ``transpose``/``permute`` views (the gradient arrives transposed, non-contiguous, and
    the view's backward ``reshape`` materialises it; two transposes cancel). Forward views that are
    copies are already ``copy`` rows (``extract._moves_data``)."""
    nd = graph.nodes
    n = graph.num_nodes
    out = np.zeros(n, bool)
    kind = nd["kind"]
    bwd = nd["is_backward"].astype(bool)
    views = np.flatnonzero((kind == "view") & bwd)
    if not len(views):
        return out
    src, dst = graph.edge_pos
    fwd_edge = ~bwd[src] & ~bwd[dst]
    succ: dict[int, list[int]] = {}
    for a, b in zip(src[fwd_edge].tolist(), dst[fwd_edge].tolist()):
        succ.setdefault(a, []).append(b)
    row_of_id = {int(i): r for r, i in enumerate(nd["id"])}
    names = nd["name"]

    def copies_grad(u: int) -> bool:
        base = _fx_base(names[u])
        if base in _CAT_GRAD_VIEWS:
            return True
        if base not in _RESHAPE_VIEWS or len(succ.get(u, ())) != 1:
            return False
        v, flips = succ[u][0], 0
        while kind[v] == "view" and _fx_base(names[v]) in _TRANSPOSE_VIEWS:
            flips += 1
            nxt = succ.get(v, [])
            if len(nxt) != 1:
                return False
            v = nxt[0]
        return flips % 2 == 1 and kind[v] != "view"
    for r in views:
        u = row_of_id.get(int(nd["fwd_id"][r]), -1)
        out[r] = u >= 0 and kind[u] == "view" and copies_grad(u)
    return out
