"""The per-node feature matrix of a GDP graph for the placement policy (:func:`node_features`)."""

from __future__ import annotations

import numpy as np

from ..graph import OpGraph
from ..ops import OP_KINDS

# GDP graphs are captured eager and never hold fused attention (``attention_fusion.py``); leaving that
# kind out keeps the feature width, so seeded policies and their placements stay as they were
_KIND_NAMES = sorted(k for k in OP_KINDS if k != "attention")


def node_features(graph: OpGraph) -> tuple[np.ndarray, list[str]]:
    """Per-node features for the placement policy, ``[n, F]`` float32 and their names: a one-hot op
    kind (over the sorted :data:`OP_KINDS` but ``attention``), ``log1p`` of output bytes, flops and
    weight bytes,
    ``log1p`` of in- and out-degree, ``is_backward`` and the topological rank scaled to [0, 1]
    (Kahn's order, smallest row first, so deterministic). GDP's own list is "operation type, output
    shape, adjacent node ids" (spec §3.1, encoding unspecified); sizes stand in for shapes here, and the
    degrees and rank for the adjacency, which the graph network reads from the edges anyway."""
    nd = graph.nodes
    n = graph.num_nodes
    kind_index = {k: i for i, k in enumerate(_KIND_NAMES)}
    onehot = np.zeros((n, len(_KIND_NAMES)), dtype=np.float32)
    onehot[np.arange(n), [kind_index[k] for k in nd["kind"]]] = 1.0
    src, dst = graph.edge_pos
    indeg = np.bincount(dst, minlength=n)
    outdeg = np.bincount(src, minlength=n)
    rank = np.empty(n, dtype=np.float64)
    rank[graph.topo_order()] = np.arange(n)
    rank /= max(n - 1, 1)
    dense = np.stack([np.log1p(nd["output_bytes"].astype(np.float64)), np.log1p(nd["flops"]),
                      np.log1p(nd["weight_bytes"].astype(np.float64)), np.log1p(indeg), np.log1p(outdeg),
                      nd["is_backward"].astype(np.float64), rank], axis=1).astype(np.float32)
    names = [f"kind={k}" for k in _KIND_NAMES] + [
        "log1p_output_bytes", "log1p_flops", "log1p_weight_bytes", "log1p_in_degree", "log1p_out_degree",
        "is_backward", "topo_rank"]
    return np.concatenate([onehot, dense], axis=1), names
