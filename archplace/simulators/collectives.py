"""One price for every collective, in every command.

Why one module: the same AllReduce of the same bytes over the same link must cost the same whether
``place``, ``search``, ``shard``, ``pipeline``, the GPU train step, the GDP simulator or the GPU-cluster
co-design prices it. Each of those used to carry its own formula, and two of them charged twice a ring.

The forms are the bandwidth-optimal ring algorithms (Patarasuk & Yuan 2009; Thakur et al. 2005), as
NCCL runs them for large messages, with ``bytes_per_s`` the per-rank, per-direction link rate:

- AllReduce (reduce-scatter, then all-gather): each rank sends ``2 (d − 1) / d · nbytes``, in
  ``2 (d − 1)`` steps;
- AllGather and ReduceScatter (``nbytes`` the full, gathered buffer): ``(d − 1) / d · nbytes`` in
  ``d − 1`` steps;
- all-to-all (``nbytes`` each rank's whole buffer): ``(d − 1) / d · nbytes`` leaves each rank;
- point-to-point: ``nbytes`` once;
- two-level AllReduce over ``nodes`` nodes of ``ranks_per_node`` ranks: a reduce-scatter inside the
  node, an AllReduce of each rank's ``1 / ranks_per_node`` shard across the nodes (every rank on its own
  share of the node's network, in parallel), an all-gather inside the node (NCCL's hierarchical
  algorithm; Megatron's and torchtitan's DP over nodes).

Every form takes an optional ``latency_s`` per step (0 by default: the cost models here are
bandwidth models; a per-step latency matters only for small messages).

``phaze_eq18_allreduce_s`` is the Phaze paper's formula, ``4 (d − 1) / d · bytes / bw`` (its C++
``4·(d−1)·parameterSize/bw/d`` with the size already in bytes: twice the ring). It is used only behind
``--sync-model paper``, so the paper's numbers can be reproduced; nothing else prices with it.

All functions take scalars or numpy arrays (broadcast together) and return a float for scalar inputs,
an array otherwise; ``ranks`` must be >= 1 (one rank costs 0) and a bandwidth must be positive.
"""

from __future__ import annotations

import numpy as np

# bytes each rank sends per (d − 1) / d of the buffer
RING_ALLREDUCE_FACTOR = 2.0
PHAZE_EQ18_FACTOR = 4.0

# the dtype a gradient is reduced in, bytes per element (``--grad-reduce-dtype``)
GRAD_REDUCE_DTYPES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _out(x, *inputs):
    return float(x) if all(np.ndim(i) == 0 for i in inputs) else x


def _check(ranks, bytes_per_s, nbytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.asarray(ranks, dtype=float)
    b = np.asarray(bytes_per_s, dtype=float)
    n = np.asarray(nbytes, dtype=float)
    if np.any(r < 1) or np.any(~np.isfinite(r)):
        raise ValueError(f"ranks must be >= 1, got {ranks!r}")
    if np.any(n < 0) or np.any(np.isnan(n)):
        raise ValueError(f"nbytes must be >= 0, got {nbytes!r}")
    if np.any(~(b > 0)):
        raise ValueError(f"bytes_per_s must be > 0, got {bytes_per_s!r}")
    return r, b, n


def _ring(factor: float, nbytes, ranks, bytes_per_s, latency_s: float, steps_per_rank: float):
    r, b, n = _check(ranks, bytes_per_s, nbytes)
    t = factor * (r - 1.0) / r * n / b + steps_per_rank * (r - 1.0) * latency_s
    return _out(t, nbytes, ranks, bytes_per_s)


def allreduce_s(nbytes, ranks, bytes_per_s, latency_s: float = 0.0):
    """A ring AllReduce of ``nbytes`` over ``ranks`` ranks: ``2 (d − 1) / d · nbytes / bytes_per_s``
    plus ``2 (d − 1)`` step latencies (0 for one rank)."""
    return _ring(RING_ALLREDUCE_FACTOR, nbytes, ranks, bytes_per_s, latency_s, 2.0)


def allgather_s(nbytes, ranks, bytes_per_s, latency_s: float = 0.0):
    """A ring AllGather whose gathered result is ``nbytes``: ``(d − 1) / d · nbytes / bytes_per_s``."""
    return _ring(1.0, nbytes, ranks, bytes_per_s, latency_s, 1.0)


def reduce_scatter_s(nbytes, ranks, bytes_per_s, latency_s: float = 0.0):
    """A ring ReduceScatter of an ``nbytes`` buffer: the same bytes as an AllGather of it."""
    return _ring(1.0, nbytes, ranks, bytes_per_s, latency_s, 1.0)


def alltoall_s(nbytes, ranks, bytes_per_s, latency_s: float = 0.0):
    """An all-to-all of each rank's ``nbytes`` buffer: ``(d − 1) / d`` of it leaves each rank."""
    return _ring(1.0, nbytes, ranks, bytes_per_s, latency_s, 1.0)


def p2p_s(nbytes, bytes_per_s, latency_s: float = 0.0):
    """A point-to-point send of ``nbytes``: ``latency_s + nbytes / bytes_per_s`` (a message costs its
    latency even when it is empty)."""
    _, b, n = _check(1, bytes_per_s, nbytes)
    return _out(latency_s + n / b, nbytes, bytes_per_s)


def two_level_allreduce_s(nbytes, ranks_per_node: int, nodes: int, intra_bytes_per_s, inter_bytes_per_s,
                          latency_s: float = 0.0):
    """A hierarchical AllReduce over ``nodes × ranks_per_node`` ranks: reduce-scatter inside each node,
    AllReduce of each rank's ``1 / ranks_per_node`` shard across the nodes at ``inter_bytes_per_s`` (the
    rank's own share of its node's network), all-gather inside the node. With one node it is the
    intra-node ring; with one rank per node the inter-node ring."""
    g = np.asarray(ranks_per_node, dtype=float)
    inside = reduce_scatter_s(nbytes, ranks_per_node, intra_bytes_per_s, latency_s) \
        + allgather_s(nbytes, ranks_per_node, intra_bytes_per_s, latency_s)
    across = allreduce_s(np.asarray(nbytes, dtype=float) / g, nodes, inter_bytes_per_s, latency_s)
    return _out(np.asarray(inside) + np.asarray(across), nbytes, ranks_per_node, nodes,
                intra_bytes_per_s, inter_bytes_per_s)


def phaze_eq18_allreduce_s(nbytes, ranks, bytes_per_s):
    """The Phaze paper's eq. 18, ``4 (d − 1) / d · nbytes / bytes_per_s``: twice the ring. Only
    ``--sync-model paper`` prices with it."""
    return _ring(PHAZE_EQ18_FACTOR, nbytes, ranks, bytes_per_s, 0.0, 0.0)


def grad_reduce_bytes_per_param(grad_reduce_dtype: str) -> int:
    """Bytes per parameter of a gradient reduced in ``grad_reduce_dtype`` (``--grad-reduce-dtype``)."""
    if grad_reduce_dtype not in GRAD_REDUCE_DTYPES:
        raise ValueError(f"grad_reduce_dtype must be one of {sorted(GRAD_REDUCE_DTYPES)}, "
                         f"got {grad_reduce_dtype!r}")
    return GRAD_REDUCE_DTYPES[grad_reduce_dtype]
