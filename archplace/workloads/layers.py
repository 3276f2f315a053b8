"""The layer view of an operator graph: the coarse layer graph the placement DP works on, each
layer's operator subgraph for the ILP, and structural hashes so identical blocks are solved once.

A layer (Phaze) is a contiguous subgraph always placed on one accelerator.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from .graph import OpGraph

# Optimizer state per parameter, beside the parameter and its gradient (each in the graph's precision),
# as Megatron and ZeRO count mixed-precision training (Rajbhandari et al. 2020, §3.1: 2 + 2 + 12 bytes
# per parameter for Adam): an fp32 master copy when parameters are narrower than fp32, plus
# Adam's two fp32 moments; Adafactor (Shazeer & Stern 2018, without momentum, T5's setting) keeps only
# factored second moments, O(rows + columns), which we count as 0; plain SGD keeps nothing (the Phaze
# paper's setting).
OPTIMIZERS = ("sgd", "adam", "adafactor")
MASTER_COPY_BYTES = 4                     # fp32 master weights, when parameters are narrower
MOMENT_BYTES = {"sgd": 0, "adam": 8, "adafactor": 0}


def optimizer_bytes_per_param(optimizer: str, bytes_per_element: int) -> float:
    """Optimizer-state bytes per parameter (not counting the parameter and its gradient)."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    if optimizer == "sgd":
        return 0.0
    return float((MASTER_COPY_BYTES if bytes_per_element < 4 else 0) + MOMENT_BYTES[optimizer])

_HASH_NODE_COLUMNS = ("kind", "core", "is_backward", "gemm_b", "gemm_m", "gemm_n", "gemm_k", "flops",
                      "vector_flops", "input_bytes", "output_bytes", "weight_bytes", "saved_bytes",
                      "tp_role")


@dataclass(frozen=True)
class LayerGraph:
    """Layers as nodes (arrays indexed by layer) and the transfers between them.

    ``edge_*`` arrays list forward cross-layer transfers summed per layer pair; the backward pass
    sends gradients of the same sizes the other way.
    """

    names: tuple[str, ...]
    param_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    activation_bytes: np.ndarray  # saved for backward, one microbatch
    forward_flops: np.ndarray
    backward_flops: np.ndarray
    num_ops: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_bytes: np.ndarray
    structural_hash: tuple[str, ...]
    optimizer: str
    # tied weights: one entry per parameter that several layers hold (an embedding and its tied LM
    # head): (the layers holding it, its bytes per device). ``param_bytes`` counts it in each of them
    # (each stage holding one of them keeps a copy, its gradient and its optimizer state); their
    # gradients are summed by an AllReduce between the stages holding them.
    tied_groups: tuple[tuple[tuple[int, ...], int], ...] = ()

    @property
    def num_layers(self) -> int:
        return len(self.names)

    @property
    def tied_bytes(self) -> np.ndarray:
        """Per layer, the bytes of its parameters that other layers hold too (0 for most layers)."""
        out = np.zeros(self.num_layers, dtype=np.int64)
        for layers, nbytes in self.tied_groups:
            out[list(layers)] += nbytes
        return out

    def unique_param_bytes(self, layers: np.ndarray | list[int] | None = None) -> int:
        """Parameter bytes of ``layers`` (default all) with each tied parameter counted once: what
        one device holding all of them keeps."""
        sel = np.arange(self.num_layers) if layers is None else np.asarray(layers, dtype=np.int64)
        total = int(self.param_bytes[sel].sum())
        chosen = set(sel.tolist())
        for group, nbytes in self.tied_groups:
            total -= nbytes * max(len(chosen.intersection(group)) - 1, 0)
        return total

    def repeat_groups(self) -> list[list[int]]:
        """Layers with equal structural hashes, in first-appearance order (singletons included)."""
        groups: dict[str, list[int]] = {}
        for i, h in enumerate(self.structural_hash):
            groups.setdefault(h, []).append(i)
        return list(groups.values())

    def is_linear(self) -> bool:
        """True when layer i feeds only later layers and i → i+1 exists for every i: then the
        downsets are the suffixes (the DP's fast path)."""
        chain = set(zip(self.edge_src.tolist(), self.edge_dst.tolist()))
        return all((i, i + 1) in chain for i in range(self.num_layers - 1)) and bool(
            np.all(self.edge_src < self.edge_dst))


def layer_graph(g: OpGraph, optimizer: str = "adam") -> LayerGraph:
    bpe = int(g.meta.get("bytes_per_element", 2) or 2)
    state_per_param_byte = optimizer_bytes_per_param(optimizer, bpe) / bpe
    names = tuple(g.meta.get("layers", ()))
    if not names:
        raise ValueError(f"graph {g.meta.get('model')!r} has no layers (meta['layers'] is empty)")
    L = len(names)
    nd = g.nodes
    layer = nd["layer"]
    if (layer < 0).any():
        i = int(np.flatnonzero(layer < 0)[0])
        raise ValueError(f"node {nd['id'][i]} ({nd['name'][i]}): field 'layer' is -1; every op "
                         "needs a layer for the layer view")
    fwd = ~nd["is_backward"]

    def per_layer(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.bincount(layer[mask], weights=values[mask].astype(np.float64), minlength=L)

    params = per_layer(nd["weight_bytes"], fwd).astype(np.int64)
    src, dst = g.edge_pos
    cross = (layer[src] != layer[dst]) & fwd[src] & fwd[dst]
    pair = layer[src[cross]].astype(np.int64) * L + layer[dst[cross]]
    uniq, inv = np.unique(pair, return_inverse=True)
    ebytes = np.bincount(inv, weights=g.edges["bytes"][cross].astype(np.float64),
                         minlength=len(uniq)).astype(np.int64)
    return LayerGraph(
        names=names,
        param_bytes=params,
        optimizer_bytes=(params * state_per_param_byte).astype(np.int64),
        activation_bytes=per_layer(nd["saved_bytes"], fwd).astype(np.int64),
        forward_flops=per_layer(nd["flops"], fwd),
        backward_flops=per_layer(nd["flops"], ~fwd),
        num_ops=np.bincount(layer, minlength=L),
        edge_src=(uniq // L).astype(np.int64),
        edge_dst=(uniq % L).astype(np.int64),
        edge_bytes=ebytes,
        structural_hash=structural_hashes(g),
        optimizer=optimizer,
        tied_groups=tied_groups(g),
    )


def tied_groups(g: OpGraph) -> tuple[tuple[tuple[int, ...], int], ...]:
    """``LayerGraph.tied_groups`` from the graph's ``meta["shared_params"]`` (layer names to indices)."""
    names = list(g.meta.get("layers", ()))
    out = []
    for p in g.meta.get("shared_params") or ():
        missing = [n for n in p["layers"] if n not in names]
        if missing:
            raise ValueError(f"shared parameter {p['param']!r}: layers {missing} are not in the graph")
        out.append((tuple(names.index(n) for n in p["layers"]), int(p["bytes"])))
    return tuple(out)


def structural_hashes(g: OpGraph) -> tuple[str, ...]:
    """One hash per layer over its ops (in row order, names and ids ignored), its internal edges by
    relative position, and the sizes crossing its boundary. Identical transformer blocks hash equal."""
    names = g.meta.get("layers", ())
    nd = g.nodes
    layer = nd["layer"]
    src, dst = g.edge_pos
    rel = np.empty(g.num_nodes, dtype=np.int64)
    out = []
    for i in range(len(names)):
        rows = np.flatnonzero(layer == i)
        rel[rows] = np.arange(len(rows))
        h = hashlib.blake2b(digest_size=12)
        for c in _HASH_NODE_COLUMNS:
            v = nd[c][rows]
            h.update("\x1f".join(map(str, v)).encode() if v.dtype == object else v.tobytes())
        # fwd_id as a relative position inside the layer
        fwd_rows = np.searchsorted(np.sort(nd["id"]), nd["fwd_id"][rows])
        id_order = np.argsort(nd["id"])
        mapped = np.where(nd["fwd_id"][rows] >= 0,
                          rel[id_order[np.clip(fwd_rows, 0, g.num_nodes - 1)]], -1)
        h.update(mapped.tobytes())
        inside = (layer[src] == i) & (layer[dst] == i)
        h.update(rel[src[inside]].tobytes() + rel[dst[inside]].tobytes())
        h.update(g.edges["bytes"][inside].tobytes())
        into = (layer[dst] == i) & (layer[src] != i)
        leave = (layer[src] == i) & (layer[dst] != i)
        h.update(np.sort(rel[dst[into]] * 1_000_003 + g.edges["bytes"][into]).tobytes())
        h.update(np.sort(rel[src[leave]] * 1_000_003 + g.edges["bytes"][leave]).tobytes())
        out.append(h.hexdigest())
    return tuple(out)


def layer_subgraph(g: OpGraph, layer: int, backward: bool = False) -> OpGraph:
    """The operator subgraph of one layer, forward or backward ops only."""
    names = g.meta.get("layers", ())
    if not 0 <= layer < len(names):
        raise ValueError(f"layer {layer} out of range; the graph has {len(names)} layers")
    mask = (g.nodes["layer"] == layer) & (g.nodes["is_backward"] == backward)
    meta = dict(g.meta, layer=names[layer], pass_="backward" if backward else "forward")
    return g.subgraph(mask, meta=meta)
