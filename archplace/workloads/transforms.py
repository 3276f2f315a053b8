"""Graph-to-graph transforms on forward operator graphs: operator fusion, Megatron role tagging,
replication of captured transformer blocks, and tensor-model-parallel (TMP) slicing.

Each takes an ``OpGraph`` and returns a new one; inputs are never modified.
"""

from __future__ import annotations

import re

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


def replicate_blocks(g: OpGraph, stack: str, captured: int, total: int) -> OpGraph:
    """Grow the block stack ``stack`` (e.g. ``encoder.layer``) from ``captured`` blocks to
    ``total`` by copying its last block. Edges into the last block from the block before it are
    chained copy to copy; edges from anywhere else (masks, position bias, encoder output) feed every
    copy; edges out of the last block leave from the last copy."""
    if total <= captured:
        return g
    names = list(g.meta["layers"])
    last_name, prev_name = f"{stack}.{captured - 1}", f"{stack}.{captured - 2}"
    if last_name not in names or prev_name not in names:
        raise ValueError(f"cannot replicate {stack!r}: captured layers {names}")
    li, pi = names.index(last_name), names.index(prev_name)
    layer = g.nodes["layer"]
    rows_last = np.flatnonzero(layer == li)
    rows_prev = np.flatnonzero(layer == pi)
    if len(rows_last) != len(rows_prev):
        raise ValueError(f"blocks {prev_name} and {last_name} differ in structure; capture more blocks")
    rel_of_prev = {int(r): i for i, r in enumerate(rows_prev)}
    rel_of_last = {int(r): i for i, r in enumerate(rows_last)}
    extra = total - captured
    k = len(rows_last)
    ids = g.nodes["id"]
    next_id = int(ids.max()) + 1 if len(ids) else 0
    # node rows: copies go right after the last block's layer index
    copy_ids = next_id + np.arange(extra * k).reshape(extra, k)
    new_layer_names = names[:li + 1] + [f"{stack}.{captured + j}" for j in range(extra)] + names[li + 1:]
    shift = np.where(layer > li, layer + extra, layer)
    pat = re.compile(rf"\b{re.escape(stack)}\.{captured - 1}\b")
    cols = {}
    for c, v in g.nodes.items():
        base = v.copy()
        if c == "layer":
            base = shift.astype(v.dtype)
        reps = [base]
        for j in range(extra):
            piece = v[rows_last].copy()
            if c == "id":
                piece = copy_ids[j]
            elif c == "layer":
                piece = np.full(k, li + 1 + j, dtype=v.dtype)
            elif c == "name":
                piece = np.array([pat.sub(f"{stack}.{captured + j}", s) for s in piece], dtype=object)
            reps.append(piece)
        cols[c] = np.concatenate(reps)
    src, dst = g.edge_pos
    esrc, edst = g.edges["src"].copy(), g.edges["dst"].copy()
    eb, ea = g.edges["bytes"], g.edges["arg"]
    new_src, new_dst, new_b, new_a = [], [], [], []
    last_copy = copy_ids[-1]
    for e in range(g.num_edges):
        s, d = int(src[e]), int(dst[e])
        s_in, d_in = s in rel_of_last, d in rel_of_last
        if s_in and d_in:  # internal edge of the last block: repeat in every copy
            for j in range(extra):
                new_src.append(copy_ids[j][rel_of_last[s]])
                new_dst.append(copy_ids[j][rel_of_last[d]])
                new_b.append(eb[e])
                new_a.append(ea[e])
        elif d_in:  # into the last block
            for j in range(extra):
                if s in rel_of_prev:  # chained: from the previous block's matching op
                    prev = ids[rows_last[rel_of_prev[s]]] if j == 0 else copy_ids[j - 1][rel_of_prev[s]]
                else:
                    prev = ids[s]
                new_src.append(prev)
                new_dst.append(copy_ids[j][rel_of_last[d]])
                new_b.append(eb[e])
                new_a.append(ea[e])
        elif s_in:  # out of the last block: now leaves from the last copy
            esrc[e] = last_copy[rel_of_last[s]]
    edges = {"src": np.concatenate([esrc, np.asarray(new_src, dtype=np.int64)]),
             "dst": np.concatenate([edst, np.asarray(new_dst, dtype=np.int64)]),
             "bytes": np.concatenate([eb, np.asarray(new_b, dtype=np.int64)]),
             "arg": np.concatenate([ea, np.asarray(new_a, dtype=np.int16)])}
    # rows: copies right after the block they copy, ids renumbered in row order, so that a
    # replicated graph equals a full capture row for row
    n0 = g.num_nodes
    order = np.concatenate([np.arange(rows_last[-1] + 1), n0 + np.arange(extra * k),
                            np.arange(rows_last[-1] + 1, n0)])
    cols = {c: v[order] for c, v in cols.items()}
    old_ids = cols["id"]
    remap_sorted = np.argsort(old_ids)
    def renumber(x: np.ndarray) -> np.ndarray:
        return remap_sorted[np.searchsorted(old_ids[remap_sorted], x)].astype(np.int64)
    edges["src"], edges["dst"] = renumber(edges["src"]), renumber(edges["dst"])
    fwd = cols["fwd_id"]
    cols["fwd_id"] = np.where(fwd >= 0, renumber(np.maximum(fwd, old_ids.min())), -1)
    cols["id"] = np.arange(len(order), dtype=np.int64)
    meta = dict(g.meta, layers=new_layer_names)
    return OpGraph(cols, edges, meta)


def slice_tensor_parallel(g: OpGraph, t: int) -> OpGraph:
    """One device's slice of a forward graph under Megatron tensor-model parallelism of width ``t``.

    Column-parallel GEMMs keep 1/t of their output features, row-parallel GEMMs 1/t of their
    reduction dimension and are followed by a forward AllReduce of their output; ops between them
    (attention heads, the MLP hidden activation) carry 1/t of their work. Before the column GEMMs
    a ``tp_copy`` node stands for Megatron's copy-to-region: identity forward, AllReduce of the
    input gradient in backward.
    """
    if t < 1 or t & (t - 1):
        raise ValueError(f"tmp width must be a power of two >= 1, got {t}")
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
    check(shard & (nd["gemm_b"] > 0), "gemm_b")
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
    # AllReduce after every row-parallel GEMM
    for r in np.flatnonzero(row):
        ar = next_id
        next_id += 1
        ob = int(nd["output_bytes"][r])
        new_rows.append(dict(id=ar, name=f"{nd['name'][r]}/allreduce", kind="allreduce", core="comm",
                             layer=nd["layer"][r], input_bytes=ob, output_bytes=ob,
                             flops=ob / bpe * (t - 1) / t, vector_flops=ob / bpe * (t - 1) / t))
        out = src == r
        e_src[out] = ar
        add_src.append(ids[r])
        add_dst.append(ar)
        add_b.append(ob)
        add_a.append(0)
    # copy-to-region before the column GEMMs, one per (producer, layer)
    copies: dict[tuple[int, int], int] = {}
    for e in np.flatnonzero(col[dst] & ~col[src] & ~shard[src]):
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
