"""Fused attention: replace each eager attention chain of a forward graph by one FlashAttention op.

A captured transformer runs attention eagerly: ``S = Q·Kᵀ`` (a batched GEMM, batch = micro-batch ·
heads), then scale / mask / softmax / dropout on the N×N score matrix, then ``O = P·V``. Every one of
those ops reads and writes the N×N matrix through HBM. Users train with a fused kernel
(``torch.nn.functional.scaled_dot_product_attention``, FlashAttention) that keeps the score matrix in
on-chip SRAM, so a cost model of the eager graph charges traffic the real step never moves.

:func:`fuse_attention` finds each chain and replaces it by one op of kind ``attention`` (core
``tensor``) whose bytes are the IO-aware HBM traffic of FlashAttention:

    Dao, Fu, Ermon, Rudra, Ré, "FlashAttention: Fast and Memory-Efficient Exact Attention with
    IO-Awareness", NeurIPS 2022 (arXiv:2205.14135v2). Algorithm 1 (§3.1, p. 5) is the forward pass,
    Theorem 2 (§3.2, p. 6) its IO complexity Θ(N²d²/M) for SRAM size M; Algorithm 4 (Appendix B.4)
    is the backward pass and Theorem 5 (Appendix C) its IO complexity, also Θ(N²d²/M).

We count the reads and writes each algorithm performs, line by line (:func:`flash_forward_traffic`,
:func:`flash_backward_traffic`), rather than the Θ bound, so the numbers can be checked by hand.
``derive_backward`` (``backward.py``) gives the fused op one backward op of kind ``attention``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .graph import OpGraph
from .ops import OP_KINDS

# The SRAM size M the kernel tiles for, when no GPU is named: the shared memory one thread block of an
# H100 / H200 SM may use, 227 KB of the SM's 228 KB ("NVIDIA H100 Tensor Core GPU Architecture"
# whitepaper, 2022, §"H100 SM Architecture": up to 228 KB shared memory per SM, 227 KB per block).
DEFAULT_SRAM_BYTES = 227 * 1024
STAT_BYTES = 4  # the softmax statistics ℓ, m are fp32 in every FlashAttention implementation

# ops allowed between the two GEMMs: scale, mask, softmax, dropout, casts and views
_CHAIN_KINDS = frozenset({"view", "copy", "mul", "div", "add", "sub", "where", "softmax", "dropout",
                          "elementwise"})


@dataclass(frozen=True)
class FlashTraffic:
    """HBM bytes the whole op reads and writes (all batch·head pairs) and the tiling that gives them."""

    read_bytes: int
    write_bytes: int
    t_c: int  # passes over Q and O (forward) or over Q, O, dO, dQ (backward): ceil(N_k / B_c)
    block_c: int  # B_c = ceil(M / 4d)
    block_r: int  # B_r = min(B_c, d)


def _blocks(sram_bytes: int, bytes_per_element: int, d: int, n_k: int) -> tuple[int, int, int]:
    """Algorithm 1 line 1: B_c = ⌈M/4d⌉, B_r = min(⌈M/4d⌉, d), with M the SRAM size in elements;
    line 3: T_c = ⌈N/B_c⌉ blocks of K and V."""
    if sram_bytes < 4 * d * bytes_per_element:
        raise ValueError(f"sram_bytes {sram_bytes} is below 4·d elements ({4 * d * bytes_per_element} "
                         f"bytes for head dimension {d}); Theorem 2 needs d <= M")
    m_elems = sram_bytes // bytes_per_element
    b_c = math.ceil(m_elems / (4 * d))
    return b_c, min(b_c, d), math.ceil(n_k / b_c)


def flash_forward_traffic(b: int, n_q: int, n_k: int, d: int, d_v: int, *, sram_bytes: int,
                          bytes_per_element: int) -> FlashTraffic:
    """HBM traffic of FlashAttention's forward pass (Algorithm 1) for ``b`` = batch·heads pairs.

    Line 2 initialises O = 0, ℓ = 0, m = -∞ in HBM (writes N_q·d_v + 2·N_q); line 6 loads K_j, V_j once
    each (reads N_k·(d + d_v) in all); each of the T_c outer iterations loads every Q_i, O_i, ℓ_i, m_i
    (line 8: N_q·(d + d_v) + 2·N_q) and writes back O_i, ℓ_i, m_i (lines 12-13: N_q·d_v + 2·N_q).
    Matrices count ``bytes_per_element``, the statistics ℓ, m fp32."""
    b_c, b_r, t_c = _blocks(sram_bytes, bytes_per_element, d, n_k)
    e, s = bytes_per_element, STAT_BYTES
    read = n_k * (d + d_v) * e + t_c * (n_q * (d + d_v) * e + 2 * n_q * s)
    write = (1 + t_c) * (n_q * d_v * e + 2 * n_q * s)
    return FlashTraffic(b * read, b * write, t_c, b_c, b_r)


def flash_backward_traffic(b: int, n_q: int, n_k: int, d: int, d_v: int, *, sram_bytes: int,
                           bytes_per_element: int) -> FlashTraffic:
    """HBM traffic of FlashAttention's backward pass (Algorithm 4, Appendix B.4).

    Line 5 initialises dQ, dK, dV = 0 in HBM (writes N_q·d + N_k·(d + d_v)); line 7 loads K_j, V_j once
    each (reads N_k·(d + d_v)); each of the T_c outer iterations loads every Q_i, O_i, dO_i, dQ_i, ℓ_i,
    m_i (line 10: N_q·(2d + 2d_v) + 2·N_q) and writes dQ_i back (line 20: N_q·d); line 23 writes
    dK_j, dV_j once (N_k·(d + d_v))."""
    b_c, b_r, t_c = _blocks(sram_bytes, bytes_per_element, d, n_k)
    e, s = bytes_per_element, STAT_BYTES
    read = n_k * (d + d_v) * e + t_c * (n_q * (2 * d + 2 * d_v) * e + 2 * n_q * s)
    write = (n_q * d + 2 * n_k * (d + d_v)) * e + t_c * n_q * d * e
    return FlashTraffic(b * read, b * write, t_c, b_c, b_r)


@dataclass(frozen=True)
class _Site:
    qk: int  # row of the Q·Kᵀ GEMM (possibly fused with its scale)
    pv: int  # row of the P·V GEMM
    chain: tuple[int, ...]  # rows strictly between them (and dead view sinks hanging off them)
    v_edge: int  # edge index carrying V into the P·V GEMM
    extra_edges: tuple[int, ...]  # edges from outside the chain into it (a live mask, a bias)


def _is_dead_sink(nd: dict, outs: list[np.ndarray], r: int) -> bool:
    """A shape-only op nobody reads (torch.export's ``_assert_tensor_metadata``)."""
    return nd["kind"][r] == "view" and len(outs[r]) == 0 and nd["output_bytes"][r] == 0


def find_attention(g: OpGraph) -> tuple[list[_Site], list[str]]:
    """The eager attention chains of a forward graph, and why other Q·Kᵀ candidates were left alone.

    A chain starts at an activation-by-activation batched GEMM (``matmul``, no weights), runs through
    single-consumer ops of the kinds in ``_CHAIN_KINDS`` holding exactly one softmax, and ends at the
    next ``matmul`` of the same layer whose other operand is V: (b, N_q, N_k, d) then (b, N_q, d_v, N_k).
    A score matrix read elsewhere (returned attention weights) keeps its chain eager."""
    nd = g.nodes
    n = g.num_nodes
    src, dst = g.edge_pos
    order_s = np.argsort(src, kind="stable")
    starts_s = np.searchsorted(src[order_s], np.arange(n + 1))
    outs = [order_s[starts_s[i]:starts_s[i + 1]] for i in range(n)]
    order_d = np.argsort(dst, kind="stable")
    starts_d = np.searchsorted(dst[order_d], np.arange(n + 1))
    ins = [order_d[starts_d[i]:starts_d[i + 1]] for i in range(n)]
    gemm = ("tensor", "fused")
    sites: list[_Site] = []
    skipped: list[str] = []
    taken = np.zeros(n, dtype=bool)
    for s in g.topo_order():
        if (nd["kind"][s] != "matmul" or nd["core"][s] not in gemm or nd["weight_bytes"][s] > 0
                or nd["is_backward"][s] or taken[s]):
            continue
        chain: list[int] = []
        v, pv, why = int(s), -1, ""
        softmaxes = 0
        while True:
            live = [int(dst[e]) for e in outs[v] if not _is_dead_sink(nd, outs, int(dst[e]))]
            chain += [int(dst[e]) for e in outs[v] if _is_dead_sink(nd, outs, int(dst[e]))]
            if len(live) != 1:
                why = f"{len(live)} consumers of {nd['name'][v]}"
                break
            w = live[0]
            if nd["layer"][w] != nd["layer"][s]:
                why = "leaves the layer"
                break
            if nd["kind"][w] == "matmul" and nd["core"][w] in gemm:
                pv = w
                break
            if nd["kind"][w] not in _CHAIN_KINDS:
                why = f"{nd['kind'][w]} op {nd['name'][w]} in the chain"
                break
            chain.append(w)
            softmaxes += nd["kind"][w] == "softmax"
            v = w
        if pv < 0 or softmaxes != 1:
            if softmaxes or pv >= 0:  # looked like attention: say why it stays eager
                skipped.append(f"{nd['name'][s]}: {why or f'{softmaxes} softmax ops'}")
            continue
        p_edges = [e for e in ins[pv] if int(src[e]) == v]
        v_edges = [e for e in ins[pv] if int(src[e]) != v]
        b, n_q, n_k = (int(nd[c][s]) for c in ("gemm_b", "gemm_m", "gemm_n"))
        if (nd["core"][pv] != "tensor" or len(p_edges) != 1 or len(v_edges) != 1
                or int(nd["gemm_b"][pv]) != b or int(nd["gemm_m"][pv]) != n_q
                or int(nd["gemm_k"][pv]) != n_k):
            skipped.append(f"{nd['name'][s]}: its P·V GEMM {nd['name'][pv]} does not match "
                           f"(b, N_q, N_k) = ({b}, {n_q}, {n_k}) or has a fused epilogue")
            continue
        inside = set(chain) | {int(s)}
        extra = tuple(int(e) for w in chain for e in ins[w] if int(src[e]) not in inside)
        sites.append(_Site(int(s), int(pv), tuple(chain), int(v_edges[0]), extra))
        taken[list(inside | {pv})] = True
    return sites, skipped


def fuse_attention(fwd: OpGraph, *, sram_bytes: int = DEFAULT_SRAM_BYTES) -> OpGraph:
    """Forward graph → the same graph with every eager attention chain as one ``attention`` op.

    The fused op keeps the Q·Kᵀ GEMM's id, layer, role and gemm dims (b = batch·heads, m = N_q,
    n = N_k, k = d); its inputs are Q (arg 0), Kᵀ (arg 1), V (arg 2) and any live input of the chain
    (arg 3: a mask or position bias); the P·V GEMM's consumers read it. ``flops`` = both GEMMs
    (4·b·N²·d for N_q = N_k, d_v = d) + the chain's vector work (scale, mask, softmax, dropout), which
    is ``vector_flops``. Its bytes are Algorithm 1's HBM traffic (:func:`flash_forward_traffic`) for
    an SRAM of ``sram_bytes``; it saves Q, K, V, O and the softmax statistics, not the N×N matrix.
    ``meta["fused_attention"]`` records the SRAM size and, per fused op, what its backward needs.
    Raises (one line) when the graph holds no eager attention."""
    if fwd.nodes["is_backward"].any():
        raise ValueError("fuse_attention takes a forward-only graph; this one has backward ops")
    if not isinstance(sram_bytes, (int, np.integer)) or isinstance(sram_bytes, bool) or sram_bytes <= 0:
        raise ValueError(f"sram_bytes must be a positive integer, got {sram_bytes!r}")
    sites, skipped = find_attention(fwd)
    if not sites:
        raise ValueError(f"model {fwd.meta.get('model', '?')!r}: no eager attention (Q·Kᵀ -> softmax -> "
                         "·V) found to fuse; --attention sdpa needs one" +
                         (f" (left eager: {skipped[0]})" if skipped else ""))
    nd = fwd.nodes
    ids = nd["id"]
    bpe = int(fwd.meta.get("bytes_per_element", 2))
    new = {k: v.copy() for k, v in nd.items()}
    merged_into = np.arange(fwd.num_nodes)
    absorbed = np.zeros(fwd.num_nodes, dtype=bool)
    src, dst = fwd.edge_pos
    arg = fwd.edges["arg"].copy()
    names: dict[str, int] = {}
    info: dict[str, dict] = {}
    for site in sites:
        s, pv = site.qk, site.pv
        rows = [s, *site.chain, pv]
        b, n_q, n_k, d = (int(nd[c][s]) for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))
        d_v = int(nd["gemm_n"][pv])
        gemm_flops = 2.0 * b * n_q * n_k * d + 2.0 * b * n_q * n_k * d_v
        vec = float(nd["vector_flops"][rows].sum())
        # the gradient of the chain's vector ops, as the eager backward counts it (bwd_flops_factor)
        vec_grad = float(sum(OP_KINDS[nd["kind"][r]].bwd_flops_factor * nd["vector_flops"][r]
                             for r in site.chain if nd["core"][r] == "vector"))
        vec_grad += float(nd["vector_flops"][s])  # the scale fused into Q·Kᵀ, differentiated once
        fw = flash_forward_traffic(b, n_q, n_k, d, d_v, sram_bytes=int(sram_bytes), bytes_per_element=bpe)
        module = str(nd["name"][s]).rsplit("/", 1)[0]
        name = f"{module}/attention"
        names[name] = names.get(name, 0) + 1
        if names[name] > 1:
            name = f"{name}_{names[name]}"
        new["kind"][s], new["core"][s], new["name"][s] = "attention", "tensor", name
        new["flops"][s] = gemm_flops + vec
        new["vector_flops"][s] = vec
        new["input_bytes"][s], new["output_bytes"][s] = fw.read_bytes, fw.write_bytes
        new["weight_bytes"][s] = int(nd["weight_bytes"][rows].sum())
        new["saved_bytes"][s] = b * ((n_q * (d + d_v) + n_k * (d + d_v)) * bpe + 2 * n_q * STAT_BYTES)
        for r in rows[1:]:
            absorbed[r] = True
            merged_into[r] = s
        arg[site.v_edge] = 2
        arg[list(site.extra_edges)] = 3
        info[str(int(ids[s]))] = {
            "d_v": d_v, "t_c": fw.t_c, "block_c": fw.block_c, "block_r": fw.block_r,
            "bwd_vector_flops": vec + vec_grad + 2.0 * b * n_q * d_v,  # recompute + gradient + rowsum(dO∘O)
            "eager_flops": float(nd["flops"][rows].sum()),
            "eager_bytes": int((nd["input_bytes"][rows] + nd["output_bytes"][rows]).sum()),
            "eager_saved_bytes": int(nd["saved_bytes"][rows].sum()),
            "eager_ops": [str(nd["name"][r]) for r in rows],
        }
    keep = ~absorbed
    e_src, e_dst = ids[merged_into[src]], ids[merged_into[dst]]
    ekeep = e_src != e_dst
    edges = {"src": e_src[ekeep], "dst": e_dst[ekeep], "bytes": fwd.edges["bytes"][ekeep],
             "arg": arg[ekeep]}
    meta = dict(fwd.meta, fused_attention={"sram_bytes": int(sram_bytes), "ops": info,
                                           "left_eager": skipped})
    return OpGraph({k: v[keep] for k, v in new.items()}, edges, meta)


def attention_backward_row(fwd: OpGraph, u: int) -> dict:
    """Columns of the backward op of fused attention row ``u`` (FlashAttention's Algorithm 4).

    It recomputes S = Q·Kᵀ and runs dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q: five GEMMs against the
    forward's two, 2.5× the forward GEMM flops for d_v = d. Its vector work recomputes the chain's
    softmax, differentiates it, and forms D = rowsum(dO∘O). Bytes: Algorithm 4's HBM traffic."""
    nd = fwd.nodes
    fa = fwd.meta.get("fused_attention") or {}
    rec = (fa.get("ops") or {}).get(str(int(nd["id"][u])))
    if rec is None:
        raise ValueError(f"node {nd['id'][u]} ({nd['name'][u]}): an attention op without its record in "
                         "meta['fused_attention']; build it with fuse_attention")
    b, n_q, n_k, d = (int(nd[c][u]) for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))
    d_v = int(rec["d_v"])
    bpe = int(fwd.meta.get("bytes_per_element", 2))
    bw = flash_backward_traffic(b, n_q, n_k, d, d_v, sram_bytes=int(fa["sram_bytes"]), bytes_per_element=bpe)
    gemm_flops = 2.0 * b * n_q * n_k * (3 * d + 2 * d_v)
    vec = float(rec["bwd_vector_flops"])
    return dict(name=f"{nd['name'][u]}/grad", kind="attention", core="tensor", gemm_b=b, gemm_m=n_q,
                gemm_n=n_k, gemm_k=d, flops=gemm_flops + vec, vector_flops=vec,
                input_bytes=bw.read_bytes, output_bytes=bw.write_bytes)

