"""Graph-to-graph transforms on forward operator graphs: operator fusion, Megatron role tagging,
replication of captured transformer blocks, and tensor-model-parallel (TMP) slicing.

Each takes an ``OpGraph`` and returns a new one; inputs are never modified.
"""

from __future__ import annotations

import numpy as np

from .graph import OpGraph

# element-wise vector ops a preceding tensor op absorbs (Phaze: "a tensor core operator followed by
# a vector core operator is fused and can only be executed on the fused core")
_FUSABLE = frozenset({"gelu", "relu", "silu", "tanh", "sigmoid", "dropout", "add", "mul", "div",
                      "sub", "elementwise"})
_SCALED = ("flops", "vector_flops", "input_bytes", "output_bytes", "weight_bytes", "saved_bytes")


def _out_lists(g: OpGraph) -> list[np.ndarray]:
    """Out-edge indices per node row (edges are sorted by source row)."""
    src, _ = g.edge_pos
    starts = np.searchsorted(src, np.arange(g.num_nodes + 1))
    return [np.arange(starts[i], starts[i + 1]) for i in range(g.num_nodes)]


def fuse_tensor_vector(g: OpGraph) -> OpGraph:
    """Merge each GEMM whose only consumer is an element-wise vector op (through single-consumer
    views) into one ``fused`` node. Row-parallel GEMMs stay alone: Megatron's AllReduce has to
    run between the GEMM and whatever follows it."""
    n = g.num_nodes
    src, dst = g.edge_pos
    outs = _out_lists(g)
    nd = g.nodes
    merged_into = np.arange(n)
    absorbed = np.zeros(n, dtype=bool)
    new = {k: v.copy() for k, v in nd.items()}
    for u in range(n):
        if nd["core"][u] != "tensor" or nd["tp_role"][u] == "row" or absorbed[u]:
            continue
        chain, v = [], u
        while len(outs[v]) == 1:
            w = int(dst[outs[v][0]])
            if nd["layer"][w] != nd["layer"][u] or nd["is_backward"][w]:
                break
            chain.append(w)
            if nd["kind"][w] != "view":
                break
            v = w
        if not chain or nd["kind"][chain[-1]] not in _FUSABLE:
            continue
        for w in chain:
            absorbed[w] = True
            merged_into[w] = u
            for c in ("flops", "vector_flops", "weight_bytes", "saved_bytes"):
                new[c][u] += nd[c][w]
            new["input_bytes"][u] += nd["input_bytes"][w] - nd["output_bytes"][u]
        last = chain[-1]
        new["input_bytes"][u] = max(new["input_bytes"][u], nd["input_bytes"][u])
        new["output_bytes"][u] = nd["output_bytes"][last]
        new["core"][u] = "fused"
        new["name"][u] = f"{nd['name'][u]}+{nd['kind'][last]}"
    if not absorbed.any():
        return g
    keep = ~absorbed
    ids = nd["id"]
    e_src = ids[merged_into[src]]
    e_dst = ids[merged_into[dst]]
    ekeep = e_src != e_dst
    edges = {"src": e_src[ekeep], "dst": e_dst[ekeep], "bytes": g.edges["bytes"][ekeep],
             "arg": g.edges["arg"][ekeep]}
    return OpGraph({k: v[keep] for k, v in new.items()}, edges, dict(g.meta))


def _same_layer_reach(g: OpGraph, seeds: np.ndarray, reverse: bool, stop: np.ndarray) -> np.ndarray:
    """Rows reachable from ``seeds`` along edges inside one layer (forward or reversed), not
    continuing past rows in ``stop``."""
    src, dst = g.edge_pos
    layer = g.nodes["layer"]
    inside = layer[src] == layer[dst]
    a, b = (dst, src) if reverse else (src, dst)
    a, b = a[inside], b[inside]
    reach = seeds.copy()
    order = g.topo_order()
    if reverse:
        order = order[::-1]
    succ_order = np.argsort(a, kind="stable")
    starts = np.searchsorted(a[succ_order], np.arange(g.num_nodes + 1))
    bs = b[succ_order]
    for u in order:
        if reach[u] and (seeds[u] or not stop[u]):
            reach[bs[starts[u]:starts[u + 1]]] = True
    return reach


def tag_tensor_parallel(g: OpGraph) -> OpGraph:
    """Mark Megatron roles: column- and row-parallel GEMMs come from module names at capture;
    every op of the same layer between a column GEMM and a row GEMM is ``shard`` (split by heads
    or by the MLP hidden dimension)."""
    role = g.nodes["tp_role"]
    col, row = role == "col", role == "row"
    if not col.any():
        return g
    between = (_same_layer_reach(g, col, False, stop=row) & _same_layer_reach(g, row, True, stop=col)
               & ~col & ~row)
    nodes = dict(g.nodes)
    nodes["tp_role"] = np.where(between, "shard", role).astype(object)
    return OpGraph(nodes, dict(g.edges), dict(g.meta))


def check_head_widths(meta: dict, t: int) -> None:
    """A tensor-parallel width must divide the query heads and the KV heads (``meta["heads"]``, from
    the model's config); one line naming the field and the widths allowed otherwise."""
    heads = meta.get("heads") or {}
    for field_name, n in heads.items():
        if int(n) % t:
            allowed = [w for w in (2 ** i for i in range(12)) if all(int(v) % w == 0 for v in heads.values())]
            raise ValueError(f"tmp width {t} does not divide field {field_name!r} = {n} of model "
                             f"{meta.get('model')!r}; allowed widths: {allowed}")


def _slice_vocab(g: OpGraph, nd: dict[str, np.ndarray], t: int):
    """Megatron's vocab-parallel embedding, LM head and cross-entropy at width ``t`` (in place on
    ``nd``): each device holds ``V' = ceil(V/t)`` of the ``V`` vocabulary rows. The embedding keeps its
    output (zeros for ids outside its rows, summed by an AllReduce) and reads ``V'/V`` of the rows;
    the LM head computes ``V'`` logits per token; the ops after it in its layer (the cross-entropy)
    do ``V'/V`` of their work. Returns the LM head GEMMs, the ops after them, each cross-entropy row
    with its tokens, and the meta update (shared parameters' bytes per device)."""
    role, core = nd["tp_role"], nd["core"]
    vocab = role == "vocab"
    none = np.zeros(g.num_nodes, dtype=bool)
    V = int(g.meta.get("vocab_size") or 0)
    if not vocab.any() or V <= 0:
        return none, none, [], {}
    Vp = -(-V // t)
    gemm = vocab & np.isin(core, ("tensor", "fused"))
    lookup = vocab & (nd["kind"] == "embedding")
    after = _same_layer_reach(g, gemm, False, stop=none) & ~gemm if gemm.any() else none
    ce = after & (nd["kind"] == "cross_entropy")
    bpe = int(g.meta.get("bytes_per_element", 2))
    cross_entropy = [(int(r), int(nd["input_bytes"][r]) // (bpe * V)) for r in np.flatnonzero(ce)]

    def scale(c: str, mask: np.ndarray) -> None:
        if nd[c].dtype.kind == "f":
            nd[c][mask] = nd[c][mask] * Vp / V
        else:
            nd[c][mask] = -(-nd[c][mask] * Vp // V)
    rows_read = nd["input_bytes"] - nd["saved_bytes"]  # a lookup's input: its ids (saved) and rows
    scale("weight_bytes", gemm | lookup)
    nd["input_bytes"][lookup] = nd["saved_bytes"][lookup] + -(-rows_read[lookup] * Vp // V)
    for c in ("gemm_n", "flops", "vector_flops", "output_bytes"):
        scale(c, gemm)
    for c in ("flops", "vector_flops", "input_bytes", "saved_bytes"):
        scale(c, after)
    scale("output_bytes", after & ~ce)  # the loss stays one number
    shared = [dict(p, bytes=-(-int(p["bytes"]) * Vp // V)) if p.get("vocab") else p
              for p in g.meta.get("shared_params") or ()]
    return gemm, after, cross_entropy, {"shared_params": shared, "vocab_per_device": Vp}


def slice_tensor_parallel(g: OpGraph, t: int) -> OpGraph:
    """One device's slice of a forward graph under Megatron tensor-model parallelism of width ``t``.

    Column-parallel GEMMs keep 1/t of their output features, row-parallel GEMMs 1/t of their
    reduction dimension and are followed by a forward AllReduce of their output; ops between them
    (attention heads, the MLP hidden activation) carry 1/t of their work. Before the column GEMMs
    a ``tp_copy`` node stands for Megatron's copy-to-region: identity forward, AllReduce of the
    input gradient in backward. The word embedding, the LM head and the cross-entropy split by
    vocabulary (``_slice_vocab``). The width must divide the query and the KV heads
    (``check_head_widths``), whatever the microbatch.
    """
    if t < 1 or t & (t - 1):
        raise ValueError(f"tmp width must be a power of two >= 1, got {t}")
    check_head_widths(g.meta, t)
    meta = dict(g.meta, tmp=t)
    if t == 1:
        return OpGraph(dict(g.nodes), dict(g.edges), meta)
    unknown = g.meta.get("tp_unknown") or []
    if unknown:
        from .tp_roles import known_families

        more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
        raise ValueError(f"cannot slice model {g.meta.get('model')!r} at tmp {t}: block GEMM in module "
                         f"{unknown[0]!r}{more} has no tensor-parallel role for family "
                         f"{g.meta.get('family')!r}; families with a role table: {known_families()} "
                         "(archplace/workloads/tp_roles.py; from_module takes tp_roles=), or use tmp 1")
    nd = {k: v.copy() for k, v in g.nodes.items()}
    role = nd["tp_role"]
    col, row, shard = role == "col", role == "row", role == "shard"
    if not (col.any() and row.any()):
        raise ValueError("graph has no Megatron column/row-parallel GEMMs to slice "
                         f"(model {g.meta.get('model')!r})")

    def check(mask: np.ndarray, col_name: str) -> None:
        vals = nd[col_name][mask]
        bad = (vals % t != 0) & (vals > 0)
        if bad.any():
            i = np.flatnonzero(mask)[np.flatnonzero(bad)[0]]
            raise ValueError(f"node {nd['id'][i]} ({nd['name'][i]}): field {col_name!r} = "
                             f"{nd[col_name][i]} is not divisible by tmp width {t}")

    check(col, "gemm_n")
    check(row, "gemm_k")
    # heads per sample (the microbatch multiplies the batch of the attention GEMMs, not the heads)
    mbs = int(g.meta.get("mbs") or 1)
    per_sample = np.where(nd["gemm_b"] % mbs == 0, nd["gemm_b"] // mbs, nd["gemm_b"])
    bad = shard & (per_sample > 0) & (per_sample % t != 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"node {nd['id'][i]} ({nd['name'][i]}): field 'gemm_b' = {nd['gemm_b'][i]} "
                         f"({per_sample[i]} heads per sample) is not divisible by tmp width {t}")
    vocab_gemm, vocab_next, cross_entropy, vmeta = _slice_vocab(g, nd, t)
    meta.update(vmeta)
    nd["gemm_n"][col] //= t
    nd["gemm_k"][row] //= t
    nd["gemm_b"][shard] //= t
    for c in _SCALED:
        scale = shard.copy()
        if c in ("flops", "vector_flops", "weight_bytes"):
            scale |= col | row
        if c == "output_bytes":
            scale |= col
        if c in ("input_bytes", "saved_bytes"):
            scale |= row
        if nd[c].dtype.kind == "f":
            nd[c][scale] /= t
        else:
            nd[c][scale] //= t
    # edges carry the producer's (sliced) output
    src, dst = g.edge_pos
    ids = nd["id"]
    next_id = int(ids.max()) + 1
    new_rows: list[dict] = []
    e_src, e_dst = g.edges["src"].copy(), g.edges["dst"].copy()
    e_bytes = nd["output_bytes"][src].copy()
    e_arg = g.edges["arg"].copy()
    add_src, add_dst, add_b, add_a = [], [], [], []
    bpe = int(g.meta.get("bytes_per_element", 2))
    # AllReduce after every row-parallel GEMM, and after a vocab-parallel embedding (each device
    # looked up its rows, zeros elsewhere): the op's consumers read the AllReduce instead
    vocab_lookup = (role == "vocab") & (nd["kind"] == "embedding")
    after = np.concatenate([np.flatnonzero(row), np.flatnonzero(vocab_lookup)])
    for r in after:
        ar = next_id
        next_id += 1
        ob = int(nd["output_bytes"][r])
        new_rows.append(dict(id=ar, name=f"{nd['name'][r]}/allreduce", kind="allreduce", core="comm",
                             layer=nd["layer"][r], input_bytes=ob, output_bytes=ob,
                             flops=ob / bpe * (t - 1) / t, vector_flops=ob / bpe * (t - 1) / t))
        e_src[src == r] = ar
        add_src.append(ids[r])
        add_dst.append(ar)
        add_b.append(ob)
        add_a.append(0)
    # the vocab-parallel cross-entropy's three AllReduces of one fp32 number per token (Megatron:
    # the logits' maximum, the predicted logit, the sum of exponentials), one after the other
    for r, tokens in cross_entropy:
        prev = ids[r]
        ob = 4 * tokens
        for what in ("max", "predicted", "sum_exp"):
            ar = next_id
            next_id += 1
            new_rows.append(dict(id=ar, name=f"{nd['name'][r]}/allreduce_{what}", kind="allreduce",
                                 core="comm", layer=nd["layer"][r], input_bytes=ob, output_bytes=ob,
                                 flops=tokens * (t - 1) / t, vector_flops=tokens * (t - 1) / t))
            add_src.append(prev)
            add_dst.append(ar)
            add_b.append(ob)
            add_a.append(0)
            prev = ar
        e_src[src == r] = prev
    # copy-to-region before the column GEMMs (and the vocab-parallel LM head), one per (producer, layer)
    copies: dict[tuple[int, int], int] = {}
    into = col | vocab_gemm
    for e in np.flatnonzero(into[dst] & ~into[src] & ~shard[src] & ~vocab_next[src]):
        s, d = int(src[e]), int(dst[e])
        key = (s, int(nd["layer"][d]))
        if key not in copies:
            copies[key] = next_id
            ob = int(nd["output_bytes"][s])
            new_rows.append(dict(id=next_id, name=f"{nd['name'][d]}/tp_copy", kind="tp_copy",
                                 core="none", layer=nd["layer"][d], input_bytes=ob, output_bytes=ob))
            add_src.append(ids[s])
            add_dst.append(next_id)
            add_b.append(ob)
            add_a.append(0)
            next_id += 1
        e_src[e] = copies[key]
    if new_rows:
        for c, v in nd.items():
            default = "" if v.dtype == object else (-1 if c == "fwd_id" else 0)
            extra = np.array([r.get(c, default) for r in new_rows], dtype=v.dtype)
            nd[c] = np.concatenate([v, extra])
    edges = {"src": np.concatenate([e_src, add_src]).astype(np.int64),
             "dst": np.concatenate([e_dst, add_dst]).astype(np.int64),
             "bytes": np.concatenate([e_bytes, add_b]).astype(np.int64),
             "arg": np.concatenate([e_arg, add_a]).astype(np.int16)}
    return OpGraph(nd, edges, meta)
