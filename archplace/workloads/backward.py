"""Derive the backward pass of a forward operator graph, giving the complete training graph.

Rules (per forward op u):
- GEMM ``Y = A·B`` (shape b×m×k · b×k×n): ``dA = dY·Bᵀ`` (b×m×n · b×n×k) and ``dB = Aᵀ·dY``
  (b×k×m · b×m×n), each 2·b·m·n·k flops. For a linear layer dB is the weight gradient (batch
  folded into m) and dA reads the weights (its ``weight_bytes``); between two activations dA reads
  B (its ``input_bytes``). A fused GEMM first runs the gradient of its vector part.
- an embedding lookup gives a scatter-add of dY into the rows it read (read, add, write back);
- a data-moving op (``copy``) moves the bytes back;
- a vector op gives one gradient op of the same kind, ``bwd_flops_factor`` × its forward flops;
- a shape-only op gives a shape-only gradient; a forward AllReduce an identity; a ``tp_copy`` the
  AllReduce of the input gradient (Megatron's copy-to-region);
- fused attention (``attention_fusion.py``) gives one FlashAttention backward op (dQ, dK, dV);
- model inputs get no gradient.
Edges: each forward edge u→v becomes a gradient edge from v's gradient op for that argument to
u's gradient entry; each forward op with saved activations sends them to its gradient ops; every
forward output seeds its own gradient.
"""

from __future__ import annotations

import numpy as np

from .attention_fusion import DEFAULT_SRAM_BYTES, attention_backward_row, fuse_attention
from .graph import OpGraph
from .ops import OP_KINDS

ATTENTION_MODES = ("eager", "sdpa")


def derive_backward(fwd: OpGraph) -> OpGraph:
    """Forward graph → training graph (forward rows first, then backward rows)."""
    nd = fwd.nodes
    if nd["is_backward"].any():
        raise ValueError("derive_backward takes a forward-only graph; this one has backward ops")
    n = fwd.num_nodes
    ids = nd["id"]
    bpe = int(fwd.meta.get("bytes_per_element", 2))
    next_id = int(ids.max()) + 1 if n else 0
    rows: list[dict] = []
    entry: list[list[int]] = [[] for _ in range(n)]  # gradient ops that receive dY of u
    arg_out: list[dict[int, int]] = [{} for _ in range(n)]  # arg position -> op emitting its grad
    saved_to: list[list[int]] = [[] for _ in range(n)]
    internal: list[tuple[int, int, int]] = []  # vector-gradient -> GEMM-gradient edges of fused ops

    def add(u: int, **kw) -> int:
        nonlocal next_id
        row = dict(kw, id=next_id, is_backward=True, fwd_id=int(ids[u]), layer=int(nd["layer"][u]),
                   tp_role=nd["tp_role"][u])
        rows.append(row)
        next_id += 1
        return row["id"]

    for u in fwd.topo_order()[::-1]:
        kind, core = nd["kind"][u], nd["core"][u]
        name = nd["name"][u]
        out_b, in_b = int(nd["output_bytes"][u]), int(nd["input_bytes"][u])
        if kind == "input" or kind == "profiled":
            continue
        if kind == "attention":  # fused attention: one FlashAttention backward op (Algorithm 4)
            entry[u] = [add(u, **attention_backward_row(fwd, u))]
            arg_out[u] = {}  # it emits dQ, dK, dV (and the gradient of a live mask) at once
            saved_to[u] = entry[u]
            continue
        if core in ("tensor", "fused"):
            b, m, nn, k = (int(nd[c][u]) for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))
            gemm_flops = 2.0 * b * m * nn * k
            grad_in = out_b
            first: list[int] = []
            if core == "fused":
                vec = float(nd["vector_flops"][u])
                vg = add(u, name=f"{name}/grad_vec", kind="elementwise", core="vector", flops=vec,
                         vector_flops=vec, input_bytes=2 * out_b, output_bytes=b * m * nn * bpe)
                first = [vg]
                grad_in = b * m * nn * bpe
            is_linear = kind in ("linear", "conv")
            # dA = dY·Bᵀ reads B: a linear layer's weights (``weight_bytes``), else the other operand
            da = add(u, name=f"{name}/dgrad", kind=kind, core="tensor", gemm_b=b, gemm_m=m, gemm_n=k,
                     gemm_k=nn, flops=gemm_flops,
                     input_bytes=grad_in + (0 if is_linear else b * k * nn * bpe),
                     weight_bytes=int(nd["weight_bytes"][u]) if is_linear else 0,
                     output_bytes=b * m * k * bpe)
            db_b, db_m = (1, b * m) if is_linear else (b, m)
            db = add(u, name=f"{name}/wgrad", kind=kind, core="tensor", gemm_b=db_b, gemm_m=k,
                     gemm_n=nn, gemm_k=db_m, flops=gemm_flops,
                     input_bytes=grad_in + (b * m * k * bpe),
                     output_bytes=(nd["weight_bytes"][u] if is_linear else b * k * nn * bpe))
            if first:
                entry[u] = first
                internal += [(first[0], da, grad_in), (first[0], db, grad_in)]
            else:
                entry[u] = [da, db]
            arg_out[u] = {0: da, 1: db}
            saved_to[u] = [db] if is_linear else [da, db]
        else:
            info = OP_KINDS[kind]
            if core == "comm":  # forward AllReduce: its gradient passes through
                gk, gc, fl = "view", "none", 0.0
            elif kind == "tp_copy":  # Megatron copy-to-region: AllReduce the input gradient
                gk, gc, fl = "allreduce", "comm", float(nd["flops"][u])
                t = int(fwd.meta.get("tmp", 1))
                fl = out_b / bpe * (t - 1) / max(t, 1)
            elif core == "vector":
                gk, gc, fl = kind, "vector", info.bwd_flops_factor * float(nd["flops"][u])
            else:
                gk, gc, fl = "view", "none", 0.0
            saved = int(nd["saved_bytes"][u])
            grad_in, out_grad = out_b + saved, in_b
            if kind == "embedding":
                # scatter-add of dY into the rows it looked up (read, add, write back): the rows are
                # its input bytes beyond the saved ids
                looked_up = in_b - saved
                grad_in, out_grad, fl = out_b + saved + looked_up, looked_up, looked_up / bpe
            elif kind == "copy":  # the bytes move back (a gather's scatter-add uses its saved indices)
                out_grad = in_b - saved
            gid = add(u, name=f"{name}/grad", kind=gk, core=gc, flops=fl,
                      vector_flops=fl if gc in ("vector", "comm") else 0.0,
                      input_bytes=grad_in, output_bytes=out_grad)
            entry[u] = [gid]
            arg_out[u] = {}
            saved_to[u] = [gid]
    return _assemble(fwd, rows, entry, arg_out, saved_to, internal)


def _assemble(fwd, rows, entry, arg_out, saved_to, internal) -> OpGraph:
    nd = fwd.nodes
    n = fwd.num_nodes
    ids = nd["id"]
    src, dst = fwd.edge_pos
    acc: dict[tuple[int, int], list[int]] = {}

    def edge(s: int, d: int, b: int, arg: int) -> None:
        cur = acc.get((s, d))
        if cur is None:
            acc[(s, d)] = [b, arg]
        else:
            cur[0] += b
    for s, d, b in internal:
        edge(s, d, b, 0)
    has_out = np.zeros(n, dtype=bool)
    has_out[src] = True
    for e in range(fwd.num_edges):
        u, v = int(src[e]), int(dst[e])
        if not entry[u] or not entry[v]:
            continue
        a = int(fwd.edges["arg"][e])
        g_from = arg_out[v].get(a, entry[v][-1] if not arg_out[v] else arg_out[v].get(0))
        if g_from is None:
            continue
        for g_to in entry[u]:
            edge(g_from, g_to, int(nd["output_bytes"][u]), 0)
    for u in range(n):
        if not entry[u]:
            continue
        if nd["saved_bytes"][u] > 0:
            for g in saved_to[u]:
                edge(int(ids[u]), g, int(nd["saved_bytes"][u]), 1)
        if not has_out[u]:  # forward output: seeds its own gradient
            for g in entry[u]:
                edge(int(ids[u]), g, int(nd["output_bytes"][u]), 1)
    cols = {}
    for c, v in nd.items():
        default = "" if v.dtype == object else (-1 if c in ("fwd_id",) else 0)
        extra = np.array([r.get(c, default) for r in rows], dtype=v.dtype)
        cols[c] = np.concatenate([v, extra])
    keys = list(acc)
    edges = {
        "src": np.concatenate([fwd.edges["src"], np.array([k[0] for k in keys], dtype=np.int64)]),
        "dst": np.concatenate([fwd.edges["dst"], np.array([k[1] for k in keys], dtype=np.int64)]),
        "bytes": np.concatenate([fwd.edges["bytes"], np.array([acc[k][0] for k in keys], dtype=np.int64)]),
        "arg": np.concatenate([fwd.edges["arg"], np.array([acc[k][1] for k in keys], dtype=np.int16)]),
    }
    return OpGraph(cols, edges, dict(fwd.meta, training=True))


def with_attention(fwd: OpGraph, attention: str, *, sram_bytes: int = DEFAULT_SRAM_BYTES) -> OpGraph:
    """The training graph of forward graph ``fwd`` with attention run as ``attention`` says: ``eager``
    (as captured: the score matrix goes through HBM; exactly ``derive_backward(fwd)``) or ``sdpa`` (a
    fused FlashAttention-style kernel, ``attention_fusion.fuse_attention``, for an SRAM of
    ``sram_bytes``, by default an H100's)."""
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention is {attention!r}; allowed: {list(ATTENTION_MODES)}")
    return derive_backward(fuse_attention(fwd, sram_bytes=sram_bytes) if attention == "sdpa" else fwd)
