"""Pipeline-parallel training on GPU servers (Auto-MAP's cost model, spec automap.md §9).

A model's forward operators, in the captured (topological) order, are cut at K − 1 *pivots* into K
stages; pivot p puts forward ops ``[.., p)`` before the cut and ``[p, ..)`` after it, and each
forward op's backward ops go with it. Devices are taken in their linear order (server after server)
and given to stages in proportion to stage compute (largest remainder, at least one each, spec
§9.1); a stage with d devices runs data-parallel inside the stage on 1/d of each micro-batch.

The paper gives no formula for the pipeline length (spec §9.6), so this is ours, DAPPLE-like
(1F1B schedule, M micro-batches of ``micro_batch`` samples):

    t_s  = C_s / d_s                      per-micro-batch forward + backward time of stage s
    a_j  = 2 · A_j / bw_j                 activation to stage j+1 and its gradient back
    AR_s = 2 (d_s − 1) / d_s · G_s / bw_s ring AllReduce of the stage's fp16 gradients
    L    = Σ_s t_s + Σ_j a_j + (M − 1) · max(max_s t_s, max_j a_j) + max_s AR_s

The first two sums are one micro-batch's trip through the pipeline (fill and drain); in the steady
state transfers overlap compute, so the slowest of stages and links sets the pace; the AllReduce of
the last stage to finish (bounded by the slowest) is exposed at the end. ``bw_j`` is NVLink when both
stages sit in one server and the 25 Gbps network otherwise; ``bw_s`` is the slowest link the stage
spans. Memory per device of stage s (1F1B keeps min(M, K − s) micro-batches in flight):

    mem_s = P_s · bytes_per_param + in_flight_s · S_s / d_s          (no recomputation)
    mem_s = P_s · bytes_per_param + in_flight_s · X_s / d_s + S_max / d_s   (recomputation)

with P_s the stage's parameters, S_s its saved activations per micro-batch, X_s its layer-input
checkpoints and S_max the largest layer's saved activations (rebuilt one layer at a time). Compute
per op is a V100 roofline: max(GEMM flops / tensor peak + vector flops / vector peak,
bytes / HBM bandwidth), forward + backward (+ forward again when recomputing), or the times of another op
model of ``simulators/gpu_ops.py`` (calibrated, profiled) on any GPU preset.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..hardware.presets import GPU, Cluster
from ..workloads.graph import OpGraph
from . import collectives
from .gpu_ops import roofline_time_s

# Optimizer-state bytes per parameter under fp16 mixed precision: fp16 weights (2) + fp16 gradients
# (2) + fp32 master weights (4), plus Adam's two fp32 moments (8) or Adafactor's factored second
# moment without momentum (≈ 0; T5's optimizer, Raffel et al. 2020 §3.1.2).
BYTES_PER_PARAM = {"adam": 16.0, "adafactor": 8.0}


@dataclass(frozen=True)
class PipelineSetup:
    """How the model is trained: micro-batches per iteration, optimizer, recomputation."""

    micro_batch: int = 16  # samples per micro-batch (Auto-MAP §5.1)
    num_micro_batches: int = 16  # M; the paper gives none, global batch = 256
    optimizer: str = "adam"
    recompute: bool = False  # activation checkpointing at layer inputs

    def __post_init__(self) -> None:
        if self.optimizer not in BYTES_PER_PARAM:
            raise ValueError(f"pipeline field 'optimizer' is {self.optimizer!r}; "
                             f"allowed: {sorted(BYTES_PER_PARAM)}")
        for name in ("micro_batch", "num_micro_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"pipeline field {name!r} must be a positive integer, got {v!r}")


@dataclass(frozen=True)
class PipelineProfile:
    """Prefix sums over the forward ops of one model, the only input the cost model needs.

    Arrays ``*_prefix`` have length n + 1 (index p = the first p forward ops); ``cross_bytes[p]`` is
    what crosses a cut at pivot p (each producer's output once, however many consumers it has beyond
    the cut). Units: seconds and bytes for one micro-batch on one device.
    """

    model: str
    op_names: np.ndarray  # (n,) object
    op_layers: np.ndarray  # (n,) object: the layer each op belongs to ("" if none)
    compute_s_prefix: np.ndarray
    param_bytes_prefix: np.ndarray  # fp16 parameter bytes
    saved_bytes_prefix: np.ndarray
    ckpt_bytes_prefix: np.ndarray  # layer-input activations kept under recomputation
    trainable_prefix: np.ndarray  # count of ops that own parameters
    cross_bytes: np.ndarray
    max_layer_saved_bytes: float
    bytes_per_element: int = 2
    setup: PipelineSetup = field(default_factory=PipelineSetup)

    @property
    def num_ops(self) -> int:
        return len(self.op_names)


def gpu_op_time_s(nodes: dict[str, np.ndarray], gpu: GPU) -> np.ndarray:
    """Roofline time of each op: tensor-core GEMM flops, CUDA-core vector flops, HBM bytes."""
    return roofline_time_s(nodes, gpu.peak_tensor_flops, gpu.peak_vector_flops, gpu.hbm_bw)


def profile_from_graph(g: OpGraph, gpu: GPU, setup: PipelineSetup | None = None,
                       op_times: np.ndarray | None = None) -> PipelineProfile:
    """Training graph (forward + backward, built at ``setup.micro_batch``) → pipeline profile.
    ``op_times``: seconds per graph row from another op model (``simulators/gpu_ops.py``); default the
    roofline of ``gpu``."""
    setup = setup or PipelineSetup()
    nd = g.nodes
    fwd = ~nd["is_backward"]
    n = int(fwd.sum())
    if n < 2:
        raise ValueError("a pipeline needs a forward graph of at least 2 ops")
    if not fwd[:n].all():
        raise ValueError("forward ops must come first in the graph (build it with derive_backward)")
    if int(g.meta.get("mbs", setup.micro_batch)) != setup.micro_batch:
        raise ValueError(f"graph built at micro-batch {g.meta.get('mbs')}, setup says {setup.micro_batch}")
    if op_times is None:
        t = gpu_op_time_s(nd, gpu)
    else:
        t = np.asarray(op_times, float)
        if t.shape != (g.num_nodes,):
            raise ValueError(f"op_times has shape {t.shape}, expected ({g.num_nodes},)")
    per_op = t[:n].copy() * (2.0 if setup.recompute else 1.0)
    row_of_id = {int(i): r for r, i in enumerate(nd["id"][:n])}
    bwd_rows = np.flatnonzero(~fwd)
    owners = np.array([row_of_id.get(int(i), -1) for i in nd["fwd_id"][bwd_rows]], dtype=np.int64)
    ok = owners >= 0
    np.add.at(per_op, owners[ok], t[bwd_rows[ok]])
    # the backward ops of no forward op (gradient seeds) go with the last stage
    per_op[n - 1] += t[bwd_rows[~ok]].sum()

    def prefix(x: np.ndarray) -> np.ndarray:
        return np.concatenate([[0.0], np.cumsum(x, dtype=float)])

    src, dst = g.edge_pos
    keep = (src < n) & (dst < n)
    src, dst = src[keep], dst[keep]
    last_use = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_use, src, dst)
    out = nd["output_bytes"][:n].astype(float)
    diff = np.zeros(n + 2)
    has = last_use > np.arange(n)
    u = np.flatnonzero(has)
    np.add.at(diff, u + 1, out[u])  # crosses pivots u+1 .. last_use(u)
    np.add.at(diff, last_use[u] + 1, -out[u])
    cross = np.cumsum(diff)[: n + 1]
    layer_idx = nd["layer"][:n]
    names = g.meta.get("layers", [])
    op_layers = np.array([names[i] if 0 <= i < len(names) else "" for i in layer_idx], dtype=object)
    first_of_layer = np.r_[True, layer_idx[1:] != layer_idx[:-1]] & (layer_idx >= 0)
    ckpt = np.where(first_of_layer, cross[:n], 0.0)
    saved = nd["saved_bytes"][:n].astype(float)
    per_layer = np.bincount(layer_idx[layer_idx >= 0], weights=saved[layer_idx >= 0]) if (
        layer_idx >= 0).any() else np.array([saved.sum()])
    return PipelineProfile(
        model=str(g.meta.get("model", "")), op_names=np.asarray(nd["name"][:n], dtype=object),
        op_layers=op_layers, compute_s_prefix=prefix(per_op),
        param_bytes_prefix=prefix(nd["weight_bytes"][:n].astype(float)),
        saved_bytes_prefix=prefix(saved), ckpt_bytes_prefix=prefix(ckpt),
        trainable_prefix=prefix((nd["weight_bytes"][:n] > 0).astype(float)), cross_bytes=cross,
        max_layer_saved_bytes=float(per_layer.max()),
        bytes_per_element=int(g.meta.get("bytes_per_element", 2)), setup=setup)


def allocate_devices(stage_compute: np.ndarray, num_devices: int) -> np.ndarray:
    """Devices per stage ∝ compute: largest remainder, at least one each. (B, K) → (B, K) ints."""
    c = np.atleast_2d(np.asarray(stage_compute, dtype=float))
    b, k = c.shape
    if k > num_devices:
        raise ValueError(f"{k} stages need at least {k} devices, the cluster has {num_devices}")
    total = c.sum(axis=1, keepdims=True)
    raw = num_devices * np.divide(c, total, out=np.full_like(c, 1.0 / k), where=total > 0)
    d = np.maximum(np.floor(raw), 1).astype(np.int64)
    rows = np.arange(b)
    for _ in range(num_devices + k):
        short = d.sum(axis=1) - num_devices
        if not short.any():
            break
        add = short < 0
        if add.any():
            j = np.argmax((raw - d)[add], axis=1)
            d[rows[add], j] += 1
        sub = short > 0
        if sub.any():
            j = np.argmax(np.where(d[sub] > 1, d[sub] - raw[sub], -np.inf), axis=1)
            d[rows[sub], j] -= 1
    return d


@dataclass
class PipelineResult:
    """One row per evaluated cut set."""

    length_s: np.ndarray  # (B,) L, seconds per iteration
    oom: np.ndarray  # (B,) any device over its memory
    devices: np.ndarray  # (B, K) devices per stage
    stage_time_s: np.ndarray  # (B, K) t_s
    transfer_s: np.ndarray  # (B, K-1) a_j
    allreduce_s: np.ndarray  # (B, K) AR_s
    memory_bytes: np.ndarray  # (B, K) per device
    trainable_ops: np.ndarray  # (B, K) ops with parameters in each stage

    @property
    def device_cuts(self) -> np.ndarray:
        return np.cumsum(self.devices, axis=1)[:, :-1]


def _bounds(prof: PipelineProfile, cuts: np.ndarray) -> np.ndarray:
    cuts = np.atleast_2d(np.asarray(cuts, dtype=np.int64))
    n = prof.num_ops
    if cuts.shape[1] and ((cuts < 1).any() or (cuts > n - 1).any()):
        raise ValueError(f"pivots must lie in [1, {n - 1}]")
    if cuts.shape[1] > 1 and (np.diff(cuts, axis=1) <= 0).any():
        raise ValueError("pivots must be strictly increasing (each stage needs at least one op)")
    b = cuts.shape[0]
    return np.concatenate([np.zeros((b, 1), np.int64), cuts, np.full((b, 1), n, np.int64)], axis=1)


def evaluate(prof: PipelineProfile, cluster: Cluster, cuts: np.ndarray) -> PipelineResult:
    """L, memory and the parts of L for a batch of cut sets ``cuts`` (B, K − 1) of pivots."""
    if cluster.topology != "servers" and cluster.topology != "flat":
        raise ValueError(f"pipeline needs a 'servers' or 'flat' cluster, got {cluster.topology!r}")
    if not isinstance(cluster.device, GPU):
        raise ValueError(f"pipeline needs a GPU cluster, {cluster.name} holds {cluster.device.name}")
    s = prof.setup
    bnd = _bounds(prof, cuts)

    def seg(prefix: np.ndarray) -> np.ndarray:  # per-stage sums: one gather, then differences
        at = prefix[bnd]
        return at[:, 1:] - at[:, :-1]

    comp = seg(prof.compute_s_prefix)
    d = allocate_devices(comp, cluster.num_devices)
    k = d.shape[1]
    end = np.cumsum(d, axis=1)
    start = end - d
    per = cluster.devices_per_server or cluster.num_devices
    spans = (start // per) != ((end - 1) // per)
    inter = cluster.inter_server_bw if cluster.topology == "servers" else cluster.link_bw
    stage_bw = np.where(spans, inter, cluster.link_bw)
    t = comp / d
    grads = seg(prof.param_bytes_prefix)
    ar = collectives.allreduce_s(grads, np.maximum(d, 1), stage_bw)
    if k > 1:
        same = (start[:, :-1] // per) == ((end[:, 1:] - 1) // per)
        link_bw = np.where(same, cluster.link_bw, inter)
        # the activation forward and its gradient backward: two point-to-point sends
        a = 2.0 * collectives.p2p_s(prof.cross_bytes[bnd[:, 1:-1]], link_bw)
        slowest = np.maximum(t.max(axis=1), a.max(axis=1))
        fill = t.sum(axis=1) + a.sum(axis=1)
    else:
        a = np.zeros((len(d), 0))
        slowest = t.max(axis=1)
        fill = t.sum(axis=1)
    length = fill + (s.num_micro_batches - 1) * slowest + ar.max(axis=1)
    in_flight = np.minimum(s.num_micro_batches, k - np.arange(k))[None, :]
    params = seg(prof.param_bytes_prefix) / prof.bytes_per_element
    if s.recompute:
        act = in_flight * seg(prof.ckpt_bytes_prefix) / d + prof.max_layer_saved_bytes / d
    else:
        act = in_flight * seg(prof.saved_bytes_prefix) / d
    mem = params * BYTES_PER_PARAM[s.optimizer] + act
    oom = (mem > cluster.device.hbm_gb * 2**30).any(axis=1)
    return PipelineResult(length, oom, d, t, a, ar, mem, seg(prof.trainable_prefix).astype(np.int64))


def pipeline_length_s(prof: PipelineProfile, cluster: Cluster, cuts) -> float:
    """L of one cut set (``inf`` never: OOM is reported by :func:`evaluate`)."""
    return float(evaluate(prof, cluster, np.asarray(cuts, dtype=np.int64)[None, :]).length_s[0])


# ---------------------------------------------------------------------- online inference (spec §10)
def _inter_bw(cluster: Cluster) -> float:
    return cluster.inter_server_bw if cluster.topology == "servers" else cluster.link_bw


def profile_time_arrays(prof: PipelineProfile, cluster: Cluster) -> tuple[np.ndarray, ...]:
    """The paper's C, A, W per forward op, all in seconds so one shared scale is meaningful: compute
    time, the time to send the activation cut after the op over the inter-server link, and the time
    to send the op's parameters over it."""
    bw = _inter_bw(cluster)
    c = np.diff(prof.compute_s_prefix)
    a = prof.cross_bytes[1:] / bw
    w = np.diff(prof.param_bytes_prefix) / bw
    return c, a, w


def coarse_pipeline_profile(cp, cluster: Cluster, setup: PipelineSetup | None = None) -> PipelineProfile:
    """A :class:`~archplace.workloads.profiles.CoarseProfile` (C*, A*, W* in units of its shared MAX)
    as a G-op profile the cost model can score: coarse op k holds the ops up to ``source_index[k]``,
    coarse pivot q cuts after coarse op q − 1. No memory information survives the transform."""
    bw = _inter_bw(cluster)
    g = cp.granularity
    cross = np.zeros(g + 1)
    cross[1:g] = cp.activation[:-1] * bw
    names = np.array([f"coarse{k}" for k in range(g)], dtype=object)
    w = np.r_[0.0, cp.params]
    return PipelineProfile(
        model="coarse", op_names=names, op_layers=names, compute_s_prefix=np.r_[0.0, cp.compute],
        param_bytes_prefix=w * bw, saved_bytes_prefix=np.zeros(g + 1), ckpt_bytes_prefix=np.zeros(g + 1),
        trainable_prefix=np.r_[0.0, np.cumsum(np.diff(w) > 0)], cross_bytes=cross,
        max_layer_saved_bytes=0.0, setup=setup or PipelineSetup())


def coarse_to_real_pivots(cp, coarse_cuts: np.ndarray) -> np.ndarray:
    """Coarse pivot q (after coarse point q − 1) → the real pivot after op ``source_index[q − 1]``."""
    return cp.source_index[np.asarray(coarse_cuts, dtype=np.int64) - 1] + 1
