"""One training iteration of a transformer under every parallelism ``archplace plan`` searches: tensor (t),
context (cp), pipeline (p, with v interleaved chunks and uneven first/last stages), data (d, with ZeRO
0-3), micro-batch b, recomputation, sequence parallelism and fused or eager attention.

Why a second module beside ``train_step``: ``train_step`` is the Megatron step model that
``bench/gpu/gpu_validation.py`` holds against published runs, for identical layers split evenly. A plan
needs the same physics per layer (heterogeneous stacks: dense then MoE, alternating attention), per
stage (uneven splits), and for the knobs the validation does not vary (context parallelism, ZeRO). Every
formula here is ``train_step``'s (the per-layer time is ``train_step.microbatch_time`` vectorised over
layers; tests/test_plan_search.py checks that they agree), and every collective is priced by
``simulators.collectives``:

- context parallelism (ring attention, Liu et al. 2023; Megatron's ``--context-parallel-size``): a rank
  holds ``s / cp`` tokens; its attention core does ``cp`` times the work of a self-attention of ``s /
  cp`` tokens (its queries against every key), so the captured graph at ``s / cp`` has its core times
  scaled by ``cp``; the K and V blocks travel round a ring of ``cp`` ranks (``cp - 1`` sends of this
  rank's K and V forward, twice that backward: K, V and their gradients), hidden behind the attention
  core where it is longer;
- ZeRO 1/2: the gradient all-reduce becomes a reduce-scatter of the gradients and an all-gather of the
  updated bf16 weights, and the optimizer updates ``1 / (d · cp)`` of the parameters; ZeRO 3 (FSDP)
  gathers each stage's weights forward and backward and reduce-scatters its gradients every
  micro-batch, behind the micro-batch's compute where shorter (FSDP's prefetch);
- the data-parallel group is d × cp ranks (context-parallel ranks hold the same weights), on the bus
  bandwidth of ``train_step.dp_ring_bytes_per_s`` (Megatron's rank order: tensor, context, data,
  pipeline), its gradient sync after the pipeline flush (exposed, as the validated model has it).

Times in seconds, sizes in bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from . import collectives
from .train_step import Links, dp_ring_bytes_per_s, pipeline_time_s


@dataclass(frozen=True)
class LayerTimes:
    """Per-layer work of one micro-batch on one GPU of its tensor-parallel group, for the layers of a
    training graph in order (``names``; ``embed`` first and ``head`` last), as numpy arrays (seconds,
    bytes). ``attn_*``: the attention core (the ops tensor parallelism shards by heads)."""

    names: tuple[str, ...]
    fwd_s: np.ndarray
    bwd_s: np.ndarray
    attn_fwd_s: np.ndarray
    attn_bwd_s: np.ndarray
    replicated_fwd_s: np.ndarray
    replicated_bwd_s: np.ndarray
    col_wgrad_s: np.ndarray
    fwd_collective_bytes: np.ndarray
    bwd_collective_bytes: np.ndarray
    params: np.ndarray            # parameters this GPU holds per layer
    shared_params: int            # tied parameters counted in both embed and head

    @cached_property
    def is_block(self) -> np.ndarray:
        """Which layers are blocks (not ``embed`` or ``head``), computed once per instance: every pricing
        of a configuration needs it."""
        return np.array([n not in ("embed", "head") for n in self.names], dtype=bool)

    @cached_property
    def block_index(self) -> np.ndarray:
        return np.flatnonzero(self.is_block)

    def end_sum(self, values: np.ndarray, end: str) -> float:
        """The sum of ``values`` (one per layer) over the layers named ``end`` (``embed`` or ``head``)."""
        return float(sum(values[i] for i, n in enumerate(self.names) if n == end))


def layer_times(graph, time_s) -> LayerTimes:
    """:class:`LayerTimes` of every layer of a training graph with per-row op times ``time_s``
    (communication rows are priced from their bytes, not their times)."""
    nd = graph.nodes
    names = tuple(graph.meta.get("layers") or ())
    n = len(names)
    ts = np.asarray(time_s, dtype=float)
    if ts.shape != (graph.num_nodes,):
        raise ValueError(f"time_s has shape {ts.shape}, the graph has {graph.num_nodes} rows")
    layer = nd["layer"]
    if n == 0 or np.any(layer < 0) or np.any(layer >= n):
        raise ValueError("the graph's rows must all belong to its meta['layers']")
    bwd = nd["is_backward"].astype(bool)
    comm = (nd["core"] == "comm") | (nd["kind"] == "allreduce")
    work = ~comm & (nd["core"] != "none")
    role = nd["tp_role"]
    replicated = work & (role == "") & (nd["core"] == "vector")
    attn = work & (role == "shard")
    wgrad = work & bwd & (role == "col") & np.char.endswith(nd["name"].astype(str), "/wgrad")
    coll = nd["kind"] == "allreduce"
    bpe = int(graph.meta.get("bytes_per_element", 2))

    def per(mask, values=ts):
        return np.bincount(layer[mask], weights=np.asarray(values, float)[mask], minlength=n)

    shared = sum(int(s["bytes"]) for s in graph.meta.get("shared_params") or ()
                 if {"embed", "head"} <= set(s.get("layers", ())))
    return LayerTimes(
        names=names, fwd_s=per(work & ~bwd), bwd_s=per(work & bwd), attn_fwd_s=per(attn & ~bwd),
        attn_bwd_s=per(attn & bwd), replicated_fwd_s=per(replicated & ~bwd),
        replicated_bwd_s=per(replicated & bwd), col_wgrad_s=per(wgrad),
        fwd_collective_bytes=per(coll & ~bwd, nd["input_bytes"]),
        bwd_collective_bytes=per(coll & bwd, nd["input_bytes"]),
        params=np.rint(per(~bwd, nd["weight_bytes"]) / bpe).astype(np.int64), shared_params=shared // bpe)


@dataclass(frozen=True)
class StepKnobs:
    """The knobs that change a layer's time (the rest change only the pipeline and the sync)."""

    tp: int
    cp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    tp_bwd_overlap: bool = True     # Megatron's asynchronous tensor-parallel all-reduce (default since 2021)


def layer_microbatch_s(lt: LayerTimes, knobs: StepKnobs, links: Links, *, cp_bytes_per_s: float,
                       kv_bytes: float) -> np.ndarray:
    """Forward + backward (+ recomputation) of one micro-batch through each layer (``train_step.
    microbatch_time`` per layer, plus context parallelism). ``kv_bytes``: this rank's K and V of one
    layer and micro-batch (``2 · b · s / cp · h_kv / t · 2``); ``embed`` and ``head`` are never
    recomputed (Megatron checkpoints transformer layers only)."""
    t, cp = knobs.tp, knobs.cp
    shrink = (1.0 - 1.0 / t) if knobs.sequence_parallel else 0.0
    extra_f = (cp - 1) * lt.attn_fwd_s       # the core's work against the other ranks' keys
    extra_b = (cp - 1) * lt.attn_bwd_s
    fwd = lt.fwd_s - shrink * lt.replicated_fwd_s + extra_f
    bwd = lt.bwd_s - shrink * lt.replicated_bwd_s + extra_b
    coll_f = collectives.allreduce_s(lt.fwd_collective_bytes, t, links.tp_bytes_per_s)
    coll_b = collectives.allreduce_s(lt.bwd_collective_bytes, t, links.tp_bytes_per_s)
    hidden = np.minimum(coll_b, lt.col_wgrad_s) if knobs.tp_bwd_overlap else 0.0
    is_block = lt.is_block
    if knobs.recompute == "full":
        re_s, re_comm = fwd, coll_f
    elif knobs.recompute == "selective":
        re_s, re_comm = cp * lt.attn_fwd_s, 0.0
    else:
        re_s, re_comm = 0.0, 0.0
    re = np.where(is_block, re_s + re_comm, 0.0)
    cp_exposed = 0.0
    if cp > 1:
        ring_f = (cp - 1) * collectives.p2p_s(kv_bytes, cp_bytes_per_s)
        cp_core_f = cp * lt.attn_fwd_s
        cp_core_b = cp * lt.attn_bwd_s
        cp_exposed = np.where(is_block, np.maximum(ring_f - cp_core_f, 0.0)
                              + np.maximum(2 * ring_f - cp_core_b, 0.0), 0.0)
        if knobs.recompute == "full":
            cp_exposed = cp_exposed + np.where(is_block, np.maximum(ring_f - cp_core_f, 0.0), 0.0)
    return fwd + bwd + coll_f + coll_b - hidden + re + cp_exposed


def layer_forward_s(lt: LayerTimes, knobs: StepKnobs, links: Links, *, cp_bytes_per_s: float,
                    kv_bytes: float) -> np.ndarray:
    """The forward part of :func:`layer_microbatch_s` (its compute, collectives and exposed context-parallel
    ring); the rest, recomputation included, runs in the backward pass."""
    t, cp = knobs.tp, knobs.cp
    shrink = (1.0 - 1.0 / t) if knobs.sequence_parallel else 0.0
    fwd = lt.fwd_s - shrink * lt.replicated_fwd_s + (cp - 1) * lt.attn_fwd_s
    out = fwd + collectives.allreduce_s(lt.fwd_collective_bytes, t, links.tp_bytes_per_s)
    if cp > 1:
        is_block = lt.is_block
        ring_f = (cp - 1) * collectives.p2p_s(kv_bytes, cp_bytes_per_s)
        out = out + np.where(is_block, np.maximum(ring_f - cp * lt.attn_fwd_s, 0.0), 0.0)
    return out


def p2p_stage_s(activation_bytes: float, knobs: StepKnobs, links: Links, virtual_stages: int) -> float:
    """Sends between stages per micro-batch and stage: ``2 v`` of them (activation forward, gradient
    backward), each scatter/gathered (``train_step.step_time``'s form): ``bytes / t`` over the pipeline
    link, then an all-gather over NVLink."""
    t = knobs.tp
    one = activation_bytes / t / links.pp_bytes_per_s + collectives.allgather_s(activation_bytes, t,
                                                                               links.tp_bytes_per_s)
    return 2 * virtual_stages * one


@dataclass(frozen=True)
class Split:
    """Layers per pipeline stage: the first stage ``first`` blocks, the last ``last``, the ``pp - 2``
    middle stages ``middle`` each (an even split has all three equal)."""

    first: int
    middle: int
    last: int
    pp: int

    def layers_per_stage(self) -> list[int]:
        if self.pp == 1:
            return [self.first]
        return [self.first, *([self.middle] * (self.pp - 2)), self.last]


def candidate_splits(blocks: int, pp: int, virtual_stages: int) -> list[Split]:
    """Every split Megatron can run: even when ``v > 1`` (it needs ``pp · v`` to divide the layers); else
    any first and last stage sizes (``--decoder-first/last-pipeline-num-layers``) with the middle stages
    equal, each stage at least one block."""
    if pp == 1:
        return [Split(blocks, 0, 0, 1)]
    if virtual_stages > 1:
        if blocks % (pp * virtual_stages):
            return []
        k = blocks // pp
        return [Split(k, k, k, pp)]
    out = []
    if pp == 2:
        return [Split(f, 0, blocks - f, 2) for f in range(1, blocks)]
    for mid in range(1, (blocks - 2) // (pp - 2) + 1):
        rest = blocks - mid * (pp - 2)
        out += [Split(f, mid, rest - f, pp) for f in range(1, rest)]
    return out


def stage_sums(per_block: np.ndarray, splits: list[Split]) -> np.ndarray:
    """Sum of ``per_block`` (blocks in order) over each stage of each split: shape ``(len(splits), pp)``."""
    if not splits:
        return np.zeros((0, 0))
    pp = splits[0].pp
    pre = np.concatenate([[0.0], np.cumsum(per_block)])
    first = np.array([s.first for s in splits])
    mid = np.array([s.middle for s in splits])
    # stage k (0-based) starts after first + (k - 1) · middle blocks (k >= 1)
    starts = np.zeros((len(splits), pp), dtype=np.int64)
    ends = np.zeros((len(splits), pp), dtype=np.int64)
    ends[:, 0] = first
    for k in range(1, pp):
        starts[:, k] = first + (k - 1) * mid
        ends[:, k] = first + k * mid if k < pp - 1 else len(per_block)
    return pre[ends] - pre[starts]


def dp_sync_parts_s(params, *, zero: int, ranks: int, grad_bytes: int, bytes_per_s: float,
                    param_bytes: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """The two halves of :func:`dp_sync_s` per stage (arrays broadcast over ``params``): what reduces the
    gradients (the all-reduce, or the reduce-scatter), which can run behind the last backward, and what
    gathers the updated weights (ZeRO 1, 2), which can run behind the next forward."""
    p = np.asarray(params, float)
    zero_arr = np.zeros_like(p)
    if ranks == 1 or zero == 3:
        return zero_arr, zero_arr
    if zero == 0:
        return np.asarray(collectives.allreduce_s(p * grad_bytes, ranks, bytes_per_s)) + zero_arr, zero_arr
    return (np.asarray(collectives.reduce_scatter_s(p * grad_bytes, ranks, bytes_per_s)) + zero_arr,
            np.asarray(collectives.allgather_s(p * param_bytes, ranks, bytes_per_s)) + zero_arr)


def dp_sync_s(params: float, *, zero: int, ranks: int, grad_bytes: int, bytes_per_s: float,
              param_bytes: int = 2) -> float:
    """The data-parallel gradient sync after the flush: a ring all-reduce of the gradients (ZeRO 0), a
    reduce-scatter of them and an all-gather of the updated weights (ZeRO 1, 2), nothing (ZeRO 3: every
    micro-batch's reduce-scatter is in :func:`zero3_stage_s`)."""
    reduce, gather = dp_sync_parts_s(params, zero=zero, ranks=ranks, grad_bytes=grad_bytes,
                                     bytes_per_s=bytes_per_s, param_bytes=param_bytes)
    return float(reduce + gather)


def zero3_stage_s(forward_s, backward_s, params, *, ranks: int, grad_bytes: int, bytes_per_s: float,
                  param_bytes: int = 2, overlap: bool = True):
    """One micro-batch through a stage under FSDP (ZeRO 3): its weights are gathered layer by layer for the
    forward, gathered again for the backward and their gradients reduce-scattered, each prefetched behind
    the pass's compute (FSDP's forward and backward prefetch): the forward takes ``max(forward, gather)``,
    the backward ``max(backward, gather + reduce-scatter)``; without ``overlap`` each adds. Arrays
    broadcast."""
    fwd, bwd = np.asarray(forward_s, float), np.asarray(backward_s, float)
    if ranks == 1:
        return fwd + bwd
    ag = collectives.allgather_s(np.asarray(params, float) * param_bytes, ranks, bytes_per_s)
    rs = collectives.reduce_scatter_s(np.asarray(params, float) * grad_bytes, ranks, bytes_per_s)
    if not overlap:
        return fwd + bwd + 2 * ag + rs
    return np.maximum(fwd, ag) + np.maximum(bwd, ag + rs)


def dp_bytes_per_s(tp: int, cp: int, dp: int, gpus_per_node: int, network_bytes_per_s: float,
                   nvlink_bytes_per_s: float) -> float:
    """Bus bandwidth of the d × cp data-parallel ring (``train_step.dp_ring_bytes_per_s``)."""
    return dp_ring_bytes_per_s(tp, dp * cp, gpus_per_node, network_bytes_per_s, nvlink_bytes_per_s)


def iteration_s(stage_s: np.ndarray, microbatches: int, virtual_stages: int) -> float:
    """The pipeline's forward + backward over ``microbatches`` (``train_step.pipeline_time_s``)."""
    return pipeline_time_s(stage_s, microbatches, virtual_stages)
