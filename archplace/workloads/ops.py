"""Operator kinds, their core classes and how each kind behaves in training.

The mapping follows Phaze (spec ``phaze.md`` §3.2 and §11.2): GEMM-like ops run on tensor cores,
element-wise / normalisation / reduction ops on vector cores, data-moving ops (copies, gathers) on
vector cores for their bytes alone, shape-only ops cost nothing, and collectives are communication.
A tensor op fused with the vector op that follows it runs on a "fused" core (a tensor core paired
with a vector core).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CORE_CLASSES = ("tensor", "vector", "fused", "comm", "none")
# bytes per element of a training precision: what a graph is built with (``bytes_per_element``)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class OpKind:
    """Static facts about one operator kind.

    ``saves`` says which activations the forward op keeps for its backward pass: its inputs, its
    output, or nothing. ``bwd_flops_factor`` scales forward flops into the gradient op's flops for
    vector ops (GEMMs derive exact shapes instead).
    """

    name: str
    core: str
    saves: str = "none"  # "input" | "output" | "none"
    bwd_flops_factor: float = 1.0
    flops_per_element: float = 1.0  # vector work per output element in the forward pass


_KINDS = [
    # tensor cores
    OpKind("linear", "tensor", saves="input"),
    OpKind("matmul", "tensor", saves="input"),
    OpKind("conv", "tensor", saves="input"),
    # fused attention (FlashAttention / SDPA, ``attention_fusion.py``): both attention GEMMs and the
    # softmax between them in one kernel; it keeps Q, K, V, O and the softmax statistics
    OpKind("attention", "tensor", saves="input"),
    # vector cores
    OpKind("embedding", "vector", saves="input", flops_per_element=0.0),
    OpKind("layernorm", "vector", saves="input", bwd_flops_factor=2.0, flops_per_element=8.0),
    OpKind("softmax", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=5.0),
    OpKind("gelu", "vector", saves="input", bwd_flops_factor=1.5, flops_per_element=8.0),
    OpKind("relu", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=1.0),
    OpKind("silu", "vector", saves="input", bwd_flops_factor=1.5, flops_per_element=4.0),
    OpKind("tanh", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=4.0),
    OpKind("sigmoid", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=4.0),
    OpKind("dropout", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=2.0),
    OpKind("add", "vector", saves="none", bwd_flops_factor=0.0),
    OpKind("sub", "vector", saves="none", bwd_flops_factor=0.0),
    OpKind("mul", "vector", saves="input", bwd_flops_factor=2.0),
    OpKind("div", "vector", saves="input", bwd_flops_factor=2.0),
    OpKind("pow", "vector", saves="input", bwd_flops_factor=2.0, flops_per_element=2.0),
    OpKind("exp", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=4.0),
    OpKind("log", "vector", saves="input", bwd_flops_factor=1.0, flops_per_element=4.0),
    OpKind("rsqrt", "vector", saves="output", bwd_flops_factor=3.0, flops_per_element=2.0),
    OpKind("neg", "vector", saves="none", bwd_flops_factor=1.0),
    OpKind("mean", "vector", saves="none", bwd_flops_factor=1.0),
    OpKind("sum", "vector", saves="none", bwd_flops_factor=1.0),
    OpKind("cat", "vector", saves="none", bwd_flops_factor=1.0, flops_per_element=0.0),
    OpKind("where", "vector", saves="input", bwd_flops_factor=1.0),
    OpKind("pool", "vector", saves="input", bwd_flops_factor=1.0),
    OpKind("batchnorm", "vector", saves="input", bwd_flops_factor=2.0, flops_per_element=4.0),
    OpKind("cross_entropy", "vector", saves="output", bwd_flops_factor=1.0, flops_per_element=5.0),
    OpKind("elementwise", "vector", saves="input", bwd_flops_factor=1.0),
    # data movement (clone, casts, gathers, reshapes that cannot be views): no arithmetic, only its
    # bytes read and written; its gradient moves the bytes back (a scatter-add for a gather)
    OpKind("copy", "vector", saves="none", bwd_flops_factor=0.0, flops_per_element=0.0),
    # communication (Megatron tensor-model parallelism)
    OpKind("allreduce", "comm"),
    # shape-only / bookkeeping ops: no compute
    OpKind("view", "none"),
    OpKind("input", "none"),
    OpKind("tp_copy", "none"),  # identity forward, AllReduce of the gradient in backward
    # measured ops from profiled graphs (dnn-partitioning): latency comes with the node
    OpKind("profiled", "none"),
]

OP_KINDS: dict[str, OpKind] = {k.name: k for k in _KINDS}
TENSOR_KINDS = frozenset(k.name for k in _KINDS if k.core == "tensor")


def moved_bytes(nodes: dict) -> np.ndarray:
    """Bytes each op moves between memory and the cores: its activations in and out and the parameters
    it reads. An embedding lookup holds its table (``weight_bytes``, for memory) but reads only the
    rows it gathers, which its ``input_bytes`` already count (with the ids), so its table is left out."""
    w = np.where(nodes["kind"] == "embedding", 0, nodes["weight_bytes"])
    return (nodes["input_bytes"] + nodes["output_bytes"] + w).astype(np.float64)


def op_kind(name: str) -> OpKind:
    try:
        return OP_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown op kind {name!r}; allowed: {sorted(OP_KINDS)}") from None
