"""Operator-graph IR and its sources: real `transformers` models, dnn-partitioning JSON, synthetic."""

from .graph import EDGE_COLUMNS, NODE_COLUMNS, OpGraph
from .layers import LayerGraph, layer_graph, layer_subgraph, structural_hashes
from .ops import CORE_CLASSES, OP_KINDS, op_kind

__all__ = ["CORE_CLASSES", "EDGE_COLUMNS", "NODE_COLUMNS", "OP_KINDS", "LayerGraph", "OpGraph",
           "layer_graph", "layer_subgraph", "op_kind", "structural_hashes"]
