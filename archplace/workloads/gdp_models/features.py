"""The per-node feature matrix of a GDP graph for the placement policy (:func:`node_features`)."""

from __future__ import annotations

import numpy as np

from ..graph import OpGraph
from ..ops import OP_KINDS

# GDP graphs are captured eager and never hold fused attention (``attention_fusion.py``); that kind is
# left out of the one-hot (a column that is 0 on every GDP graph)
_KIND_NAMES = sorted(k for k in OP_KINDS if k != "attention")
# the size and degree columns, standardised per graph (z-score over the graph's nodes)
STANDARDISED = ("z_log1p_output_bytes", "z_log1p_flops", "z_log1p_weight_bytes", "z_log1p_in_degree",
                "z_log1p_out_degree")


def longest_path_depth(n: int, src: np.ndarray, dst: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Hops on the longest path from any source to each node (sources 0), ``order`` a topological order.

    One pass over the nodes in that order: a node's depth is one more than its deepest producer's."""
    depth = np.zeros(n, np.int64)
    by_dst = np.argsort(dst, kind="stable")
    ptr = np.searchsorted(dst[by_dst], np.arange(n + 1))
    preds = src[by_dst]
    for v in order:
        a, b = ptr[v], ptr[v + 1]
        if b > a:
            depth[v] = depth[preds[a:b]].max() + 1
    return depth


def _zscore(col: np.ndarray) -> np.ndarray:
    sd = col.std()
    return (col - col.mean()) / sd if sd > 0 else np.zeros_like(col)  # a constant column carries nothing


def node_features(graph: OpGraph) -> tuple[np.ndarray, list[str]]:
    """Per-node features for the placement policy, ``[n, F]`` float32 and their names.

    * a one-hot op kind (over the sorted :data:`OP_KINDS` but ``attention``), 0/1;
    * ``log1p`` of output bytes, flops, weight bytes, in- and out-degree, each **standardised over the
      graph's nodes** (mean 0, std 1; a constant column is 0). Unscaled, ``log1p`` flops reach ~25 and
      swamp the 0/1 columns in the policy's input projection; a per-graph scale keeps every column
      O(1) on every graph (the policy then sees sizes relative to the rest of the graph, not absolute:
      the device memory is not a feature either);
    * ``is_backward`` (0/1);
    * the topological position, in [0, 1]: ``topo_rank`` (Kahn's order, smallest row first, so
      deterministic, over n - 1), ``topo_depth`` (hops on the longest path from a source, over the
      graph's longest path) and ``topo_height`` (hops on the longest path to a sink, likewise). The
      placer has no positional encoding (spec §3.3) and GraphSAGE sees 3 hops, so without these a
      node cannot tell where in a deep graph it lies, and two copies of a layer look alike.

    GDP's own list is "operation type, output shape, adjacent node ids" (spec §3.1, encoding
    unspecified); sizes stand in for shapes here, and the degrees and position for the adjacency, which
    the graph network reads from the edges anyway."""
    nd = graph.nodes
    n = graph.num_nodes
    kind_index = {k: i for i, k in enumerate(_KIND_NAMES)}
    onehot = np.zeros((n, len(_KIND_NAMES)), dtype=np.float32)
    onehot[np.arange(n), [kind_index[k] for k in nd["kind"]]] = 1.0
    src, dst = graph.edge_pos
    indeg = np.bincount(dst, minlength=n)
    outdeg = np.bincount(src, minlength=n)
    order = graph.topo_order()
    rank = np.empty(n, dtype=np.float64)
    rank[order] = np.arange(n)
    rank /= max(n - 1, 1)
    depth = longest_path_depth(n, src, dst, order).astype(np.float64)
    height = longest_path_depth(n, dst, src, order[::-1]).astype(np.float64)
    longest = max(depth.max(initial=0.0), 1.0)
    sizes = [np.log1p(nd["output_bytes"].astype(np.float64)), np.log1p(nd["flops"].astype(np.float64)),
             np.log1p(nd["weight_bytes"].astype(np.float64)), np.log1p(indeg), np.log1p(outdeg)]
    dense = np.stack([*(_zscore(c) for c in sizes), nd["is_backward"].astype(np.float64), rank,
                      depth / longest, height / longest], axis=1).astype(np.float32)
    names = [f"kind={k}" for k in _KIND_NAMES] + [*STANDARDISED, "is_backward", "topo_rank", "topo_depth",
                                                  "topo_height"]
    return np.concatenate([onehot, dense], axis=1), names
