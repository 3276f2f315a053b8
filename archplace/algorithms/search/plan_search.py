"""The best way to train a transformer on N GPUs under archplace's step model: an exact enumeration of
tensor (tp), context (cp), pipeline (pp, interleaved v, uneven first/last stages), data (dp) parallel
sizes, micro-batch, recomputation, sequence parallelism, ZeRO stage and attention kernel.

Why enumeration: the space is a product of small integer sets (divisors of the GPU count, the heads,
the layers and the batch), and under a fixed configuration the time model is closed-form, so every
configuration can be priced; two bounds skip what cannot win or cannot fit, and each skip is counted:

- *memory*: with ZeRO stage z the weights, gradients and optimizer state of the lightest possible stage
  (the pipeline's parameters over pp) must fit the GPU before activations are counted; a (tp, cp, pp, z)
  that fails it is skipped for every micro-batch, recomputation, sequence-parallel and attention choice;
- *time*: a 1F1B pipeline takes at least ``(m - 1 + p) / p`` times the sum of its stage times (the
  heaviest stage is at least their mean), so a configuration whose bound is no better than the K-th best
  found so far is skipped before its splits are priced.

Within a configuration the split of the layers over the stages is exact too: every split Megatron-LM
can run (``simulators.parallel_step.candidate_splits``) is priced and the fastest whose every stage fits
is kept. The answer is deterministic: ties go to the configuration listed first in a fixed knob order.
The per-layer op times come from a callable (``costs``) so that this module never captures a model.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...simulators import parallel_step as ps
from ...simulators import train_memory as tm
from ...simulators.gpu_step import optimizer_update_bytes_per_param
from ...simulators.train_step import Links

KNOBS = ("tp", "pp", "dp", "cp", "vp", "mbs", "recompute", "sequence_parallel", "zero", "attention")


@dataclass(frozen=True)
class Cluster:
    """The GPUs a plan runs on: ``gpus`` of one kind, ``gpus_per_node`` per server on NVLink, each GPU's
    share of the server's network (bytes/s per direction), and the price per GPU-hour where known."""

    gpus: int
    gpus_per_node: int
    peak_flops_per_s: float          # dense bf16 peak of one GPU
    memory_bytes: int                # HBM of one GPU
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    network_bytes_per_s: float       # one GPU's share of its server's network
    usd_per_gpu_hour: float | None = None


@dataclass(frozen=True)
class Space:
    """The values each knob may take (a ``--fixed`` knob has one)."""

    tp: tuple[int, ...]
    pp: tuple[int, ...]
    cp: tuple[int, ...]
    mbs: tuple[int, ...]
    vp: tuple[int, ...]
    recompute: tuple[str, ...] = tm.RECOMPUTE
    sequence_parallel: tuple[bool, ...] = (False, True)
    zero: tuple[int, ...] = (0, 1, 3)
    attention: tuple[str, ...] = tm.ATTENTION
    dp: tuple[int, ...] | None = None     # None: whatever the GPUs leave


def powers_of_two(limit: int) -> tuple[int, ...]:
    return tuple(2 ** k for k in range(int(math.log2(max(limit, 1))) + 1))


def default_space(shape: tm.TransformerShape, *, gpus: int, gpus_per_node: int, seq: int,
                  global_batch: int, max_mbs: int = 8) -> Space:
    """Every knob value a run could use: tp up to a node dividing the query and KV heads; cp (powers of
    two) for long sequences, keeping at least 2,048 tokens per rank (``--fixed cp=N`` for others); pp up
    to the layers; micro-batches that are powers of two up to ``max_mbs``; v dividing the layers per
    stage, at most 8."""
    tp = tuple(t for t in powers_of_two(gpus_per_node) if shape.heads % t == 0 and shape.kv_heads % t == 0
               and t <= gpus)
    cp = tuple(c for c in powers_of_two(gpus) if c == 1 or (seq % (2 * c) == 0 and seq // c >= 2048))
    pp = tuple(p for p in range(1, shape.layers + 1) if gpus % p == 0)
    mbs = tuple(b for b in powers_of_two(max_mbs) if b <= global_batch)
    vp = tuple(v for v in range(1, shape.layers + 1) if shape.layers % v == 0 and v <= 8)
    return Space(tp=tp, pp=pp, cp=cp, mbs=mbs, vp=vp)


@dataclass
class Candidate:
    """One priced configuration: its knobs, the split, the iteration and its parts (s), memory (bytes)."""

    knobs: dict[str, Any]
    layers_per_stage: list[int]
    microbatches: int
    step_time_s: float
    parts_s: dict[str, float]
    memory: dict[str, float]          # the stage with the most bytes: StageMemory.to_dict()
    fits: bool

    def order(self) -> tuple:
        return (self.step_time_s, tuple(str(self.knobs[k]) for k in KNOBS), tuple(self.layers_per_stage))


@dataclass
class SearchResult:
    top: list[Candidate]
    evaluated: int                    # configurations priced (each with its best split)
    splits_priced: int
    pruned: dict[str, int]            # skipped by each bound: {"memory": n, "time": n}
    invalid: int                      # combinations no framework runs (a count that does not divide ...)
    least_memory: Candidate | None    # the configuration closest to fitting, when nothing fits
    captured: int                     # distinct (tp, mbs, seq / cp, attention) op timings asked for
    model_params: float = 0.0         # the whole model's parameters (tp 1), tied ones once
    notes: list[str] = field(default_factory=list)


def search(shape: tm.TransformerShape, costs: Callable[[int, int, int, str], ps.LayerTimes], cluster: Cluster,
           *, seq: int, global_batch: int, space: Space, optimizer: str = "adam", grad_bytes: int = 2,
           top_k: int = 5, overlap: bool = True) -> SearchResult:
    """The ``top_k`` fastest configurations that fit (module docstring). ``costs(tp, mbs, seq_per_rank,
    attention)`` gives the per-layer op times of one micro-batch on one GPU. ``overlap``: the backward
    tensor-parallel all-reduces run behind the weight-gradient GEMMs and the data-parallel collectives
    behind the compute (Megatron-LM's defaults since 2021-22, FSDP's prefetch); off, every collective is
    exposed (Megatron's 'local' DDP of Narayanan et al. 2021)."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k!r}")
    blocks = shape.layers
    opt_update = optimizer_update_bytes_per_param(optimizer, tm.WEIGHT_BYTES)
    heap: list[tuple] = []            # (-time, -tiebreak index, candidate): the K best so far
    counter = 0
    evaluated = splits_priced = invalid = 0
    pruned = {"memory": 0, "time": 0}
    least: Candidate | None = None
    asked: set = set()
    cache: dict = {}

    def lt_for(tp, mbs, s_rank, attention):
        key = (tp, mbs, s_rank, attention)
        if key not in cache:
            asked.add(key)
            cache[key] = costs(*key)
        return cache[key]

    def kth_best() -> float:
        return -heap[0][0] if len(heap) >= top_k else math.inf

    gpn = cluster.gpus_per_node
    net_bw, nvl_bw = cluster.network_bytes_per_s, cluster.nvlink_bytes_per_s
    one = lt_for(1, min(space.mbs), seq, space.attention[0])
    params_1, shared_1 = float(one.params.sum()), float(one.shared_params)
    for attention in space.attention:
        for tp in space.tp:
            if shape.heads % tp or shape.kv_heads % tp or tp > gpn:
                invalid += 1
                continue
            for cp in space.cp:
                if cp > 1 and (attention != "sdpa" or seq % (2 * cp)):
                    invalid += 1
                    continue
                for pp in space.pp:
                    if pp > blocks or cluster.gpus % (tp * cp * pp):
                        invalid += 1
                        continue
                    dp = cluster.gpus // (tp * cp * pp)
                    if space.dp is not None and dp not in space.dp:
                        invalid += 1
                        continue
                    links = Links(tp_bytes_per_s=cluster.nvlink_bytes_per_s,
                                  pp_bytes_per_s=(cluster.nvlink_bytes_per_s if cluster.gpus <= gpn
                                                  else cluster.network_bytes_per_s),
                                  dp_bytes_per_s=ps.dp_bytes_per_s(tp, cp, dp, gpn, net_bw, nvl_bw),
                                  hbm_bytes_per_s=cluster.hbm_bytes_per_s)
                    cp_bw = cluster.nvlink_bytes_per_s if tp * cp <= gpn else cluster.network_bytes_per_s
                    shards = dp * cp
                    for mbs in space.mbs:
                        if global_batch % (dp * mbs):
                            invalid += 1
                            continue
                        m = global_batch // (dp * mbs)
                        for zero in space.zero:
                            state = tm.state_bytes_per_param(zero=zero, shards=shards, grad_bytes=grad_bytes,
                                                             optimizer=optimizer)
                            for v in space.vp:
                                if v > 1 and (pp < 2 or m % pp or blocks % (pp * v)):
                                    invalid += 1
                                    continue
                                splits = ps.candidate_splits(blocks, pp, v)
                                if not splits:
                                    invalid += 1
                                    continue
                                key = (tp, mbs, seq // cp, attention)
                                twin = cache.get((tp, mbs, seq // cp, "sdpa")) \
                                    if attention == "eager" else None
                                # a lower bound on this GPU's parameters without timing the key: the model's
                                # over tp (tensor parallelism replicates some, never splits finer)
                                total_params = (params_1 - (shared_1 if pp == 1 else 0)) / tp
                                sps = [sp for sp in ((False, True) if tp > 1 else (False,))
                                       if sp in space.sequence_parallel]
                                if total_params / pp * state.total > cluster.memory_bytes:
                                    pruned["memory"] += len(sps) * len(space.recompute)
                                    continue
                                for sp in sps:
                                    for rec in space.recompute:
                                        kw = dict(seq=seq, global_batch=global_batch, tp=tp, cp=cp, pp=pp,
                                                  dp=dp, mbs=mbs, m=m, v=v, sp=sp, rec=rec, zero=zero,
                                                  attention=attention, splits=splits, grad_bytes=grad_bytes,
                                                  bound=kth_best(), overlap=overlap)
                                        if key not in cache and twin is not None:
                                            # eager attention, not timed yet: its layers without their
                                            # attention core (the sdpa twin's) bound it from below
                                            c, _ = _price(shape, _without_attention(twin), cluster, links,
                                                          cp_bw, state, opt_update, **kw, bound_only=True)
                                            if c is None:
                                                pruned["time"] += 1
                                                continue
                                        c, n_split = _price(shape, lt_for(*key), cluster, links, cp_bw, state,
                                                            opt_update, **kw)
                                        if c is None:
                                            pruned["time"] += 1
                                            continue
                                        evaluated += 1
                                        splits_priced += n_split
                                        if not c.fits:
                                            if least is None or (c.memory["total_bytes"], c.order()) < (
                                                    least.memory["total_bytes"], least.order()):
                                                least = c
                                            continue
                                        counter += 1
                                        item = (-c.step_time_s, -counter, c)
                                        if len(heap) < top_k:
                                            heapq.heappush(heap, item)
                                        elif c.step_time_s < -heap[0][0]:
                                            heapq.heapreplace(heap, item)
    top = sorted((it[2] for it in heap), key=Candidate.order)
    return SearchResult(top=top, evaluated=evaluated, splits_priced=splits_priced, pruned=pruned,
                        invalid=invalid, least_memory=least if not top else None, captured=len(asked),
                        model_params=params_1 - shared_1)


def _without_attention(lt: ps.LayerTimes) -> ps.LayerTimes:
    """``lt`` with its attention core taken out: a lower bound on the same layers with another attention
    kernel (everything else in the graph is the same ops)."""
    from dataclasses import replace

    zero = np.zeros_like(lt.attn_fwd_s)
    return replace(lt, fwd_s=lt.fwd_s - lt.attn_fwd_s, bwd_s=lt.bwd_s - lt.attn_bwd_s, attn_fwd_s=zero,
                   attn_bwd_s=zero)


def _price(shape, lt, cluster, links, cp_bw, state, opt_update, *, seq, global_batch, tp, cp, pp, dp, mbs, m,
           v, sp, rec, zero, attention, splits, grad_bytes, bound, overlap: bool = True,
           bound_only: bool = False
           ) -> tuple[Candidate | bool | None, int]:
    """The fastest split of one configuration that fits (or the one with the least memory when none
    does); ``(None, 0)`` when the time bound says it cannot beat ``bound``; with ``bound_only``,
    ``(True, 0)`` when it may."""
    knobs = ps.StepKnobs(tp=tp, cp=cp, sequence_parallel=sp, recompute=rec, tp_bwd_overlap=overlap)
    kv_bytes = 2 * mbs * (seq / cp) * shape.kv_hidden / tp * tm.ACT_BYTES
    per_layer = ps.layer_microbatch_s(lt, knobs, links, cp_bytes_per_s=cp_bw, kv_bytes=kv_bytes)
    blocks_idx = lt.block_index
    ends = {e: lt.end_sum(per_layer, e) for e in ("embed", "head")}
    end_params = {e: int(lt.end_sum(lt.params, e)) for e in ("embed", "head")}
    block_s = per_layer[blocks_idx]
    block_params = lt.params[blocks_idx].astype(float)
    if len(block_s) != shape.layers:
        raise ValueError(f"the graph has {len(block_s)} blocks, the model {shape.layers} layers")
    p2p = ps.p2p_stage_s(mbs * (seq / cp) * shape.hidden * tm.ACT_BYTES, knobs, links, v) if pp > 1 else 0.0
    total_stage = float(block_s.sum() + ends["embed"] + ends["head"] + pp * p2p)
    lower = ((m - 1 + pp) / pp if v == 1 else (m + (pp - 1) / v) / pp) * total_stage
    if lower >= bound:
        return None, 0
    if bound_only:
        return True, 0
    st = ps.stage_sums(block_s, splits) + p2p
    st[:, 0] += ends["embed"]
    st[:, -1] += ends["head"]
    params = ps.stage_sums(block_params, splits)
    params[:, 0] += end_params["embed"]
    params[:, -1] += end_params["head"]
    if pp == 1:
        params[:, 0] -= lt.shared_params
    n_layers = np.array([s.layers_per_stage() for s in splits], dtype=float)
    kw = dict(seq=seq, mbs=mbs, tp=tp, cp=cp)
    act = tm.layer_activation_bytes(shape, **kw, sequence_parallel=sp, recompute=rec, attention=attention)
    inflight = np.array([tm.in_flight_microbatches(k, pp, m, v) for k in range(pp)])
    embed_mask = tm.MASK_BYTES * (seq / cp) * mbs * shape.hidden / (tp if sp else 1) if shape.dropout else 0.0
    acts = n_layers * act * inflight
    acts[:, 0] += embed_mask * inflight[0]
    temp = np.zeros_like(acts)
    temp[:, -1] += tm.logits_bytes(shape, **kw)
    re_tmp = tm.layer_temporary_bytes(shape, **kw, sequence_parallel=sp, recompute=rec, attention=attention)
    temp = np.maximum(temp, re_tmp)
    if zero == 3:
        temp += 2 * float(block_params.max()) * tm.WEIGHT_BYTES
    w, g, o = params * state.weights, params * state.gradients, params * state.optimizer
    mem = w + g + o + acts + temp
    worst = mem.max(axis=1)
    shards = dp * cp
    # one micro-batch's forward per stage (the rest of the stage time is its backward)
    fwd_layer = ps.layer_forward_s(lt, knobs, links, cp_bytes_per_s=cp_bw, kv_bytes=kv_bytes)
    fwd_st = ps.stage_sums(fwd_layer[blocks_idx], splits) + p2p / 2
    fwd_st[:, 0] += lt.end_sum(fwd_layer, "embed")
    fwd_st[:, -1] += lt.end_sum(fwd_layer, "head")
    bwd_st = st - fwd_st
    if zero == 3:
        st = ps.zero3_stage_s(fwd_st, bwd_st, params, ranks=shards, grad_bytes=grad_bytes,
                              bytes_per_s=links.dp_bytes_per_s, overlap=overlap)
    busiest = params.max(axis=1)
    reduce, gather = ps.dp_sync_parts_s(params, zero=zero, ranks=shards, grad_bytes=grad_bytes,
                                        bytes_per_s=links.dp_bytes_per_s)
    if overlap:   # behind the stage's last backward, and the next forward
        sync = (np.maximum(reduce - bwd_st, 0.0) + np.maximum(gather - fwd_st, 0.0)).max(axis=1)
    else:
        sync = (reduce + gather).max(axis=1)
    opt = busiest * opt_update / (shards if zero >= 1 else 1) / cluster.hbm_bytes_per_s
    smax, ssum = st.max(axis=1), st.sum(axis=1)
    pipe = (m - 1) * smax + ssum if v == 1 else m * smax + (ssum - smax) / v
    total = pipe + sync + opt
    fits = worst <= cluster.memory_bytes
    if fits.any():
        i = int(np.argmin(np.where(fits, total, np.inf)))
    else:
        i = int(np.argmin(worst))
    k = int(np.argmax(mem[i]))
    memory = tm.StageMemory(weight_bytes=float(w[i, k]), gradient_bytes=float(g[i, k]),
                            optimizer_bytes=float(o[i, k]), activation_bytes=float(acts[i, k]),
                            temporary_bytes=float(temp[i, k])).to_dict()
    memory["stage"] = k
    parts = {"pipeline_s": float(pipe[i]), "bubble_s": max(float(pipe[i] - m * smax[i]), 0.0),
             "dp_sync_s": float(sync[i]), "dp_comm_s": float((reduce + gather)[i].max()),
             "optimizer_s": float(opt[i]),
             "stage_s": [float(x) for x in st[i]]}
    c = Candidate(knobs=dict(tp=tp, pp=pp, dp=dp, cp=cp, vp=v, mbs=mbs, recompute=rec, sequence_parallel=sp,
                             zero=zero, attention=attention),
                  layers_per_stage=splits[i].layers_per_stage(), microbatches=m, step_time_s=float(total[i]),
                  parts_s=parts, memory=memory, fits=bool(fits[i]))
    return c, len(splits)
