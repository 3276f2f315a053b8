"""The time of one Megatron-style training iteration under tensor (t), pipeline (p) and data (d)
parallelism, built from one transformer layer's op times on one GPU of its tensor-parallel group.

Why per layer: the layers of a GPT are identical, so one captured layer (``build_graph(..., tmp=t)``
with a few blocks) times ``layers / p`` is exactly a pipeline stage's work; a 1T-parameter model never
has to be captured in full. The op times come from any op model (``simulators.gpu_ops``); this module
adds what happens between the ops:

- tensor-parallel collectives (the graph's ``allreduce`` rows) as ring all-reduces over NVLink,
  ``2 (t - 1) / t · bytes / bandwidth`` each, on the critical path (or, for the backward collectives of
  the column-parallel GEMMs, hidden behind their weight-gradient GEMMs where the run overlapped them);
- activation recomputation: ``full`` repeats each layer's forward (its collectives included) before
  its backward, ``selective`` repeats only the attention core (QKᵀ, mask, softmax, dropout, ·V:
  Korthikanti et al. 2022, §5);
- sequence parallelism (Korthikanti et al. 2022, §4.2.2): the layer norms, dropouts and residual adds
  that tensor parallelism replicates run on 1/t of the tokens; its all-gather + reduce-scatter pairs move
  the bytes of the all-reduces they replace;
- the pipeline: 1F1B (PipeDream-Flush) over p stages and m micro-batches, iteration
  ``(m - 1) · max_k T_k + Σ_k T_k`` for stage times ``T_k`` (``(m + p - 1) · T`` for equal stages;
  exact against ``pipeline_1f1b.simulate_1f1b`` when the heaviest stage is the last, an upper bound
  otherwise), and with ``v`` interleaved chunks per GPU ``m · max_k T_k + (Σ_k T_k - max_k T_k) / v``,
  whose bubble is Narayanan et al. 2021's ``(p - 1) / (v · m)`` of the ideal time (§2.2.2);
- point-to-point sends between stages, ``2 v`` per micro-batch and stage (activation forward, gradient
  backward), each ``bytes / t`` over the stage's InfiniBand link (the scatter/gather of Narayanan
  et al. 2021, §4.1) plus an NVLink all-gather;
- the data-parallel gradient all-reduce of the heaviest stage's parameters, a ring over d ranks, after
  the pipeline flush (or hidden, where the run overlapped it);
- the optimizer step, memory-bound: ``optimizer_bytes_per_param`` per parameter at HBM bandwidth.

Everything is in seconds and bytes; nothing here is fitted to a published number.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from . import collectives

RECOMPUTE = ("none", "full", "selective")


def ring_allreduce_s(nbytes: float, ranks: int, bytes_per_s: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``ranks`` ranks (``collectives.allreduce_s``, the one price
    every command uses): ``2 (ranks - 1) / ranks · nbytes`` at ``bytes_per_s`` per direction."""
    _check_ranks(ranks, "ranks")
    return float(collectives.allreduce_s(nbytes, ranks, bytes_per_s))


def ring_allgather_s(nbytes: float, ranks: int, bytes_per_s: float) -> float:
    """A ring all-gather whose gathered result is ``nbytes`` (``collectives.allgather_s``):
    ``(ranks - 1) / ranks · nbytes`` per rank (half an all-reduce; a reduce-scatter costs the same)."""
    _check_ranks(ranks, "ranks")
    return float(collectives.allgather_s(nbytes, ranks, bytes_per_s))


def bubble_fraction(p: int, m: int, v: int = 1) -> float:
    """Pipeline bubble over the ideal time, ``(p - 1) / (v · m)`` (Narayanan et al. 2021, §2.2.1 for
    v = 1, §2.2.2 for the interleaved schedule with v chunks per GPU)."""
    _check_ranks(p, "p")
    _check_ranks(m, "m")
    _check_ranks(v, "v")
    return (p - 1) / (v * m)


def pipeline_time_s(stage_s, microbatches: int, virtual_stages: int = 1) -> float:
    """One iteration's forward + backward through the pipeline whose stage ``k`` takes ``stage_s[k]``
    (forward + backward of one micro-batch), 1F1B order; see the module docstring for the forms."""
    t = np.asarray(stage_s, dtype=float)
    if t.ndim != 1 or len(t) == 0 or not np.all(np.isfinite(t)) or np.any(t < 0):
        raise ValueError("stage_s must be a non-empty 1-d array of finite times >= 0")
    _check_ranks(microbatches, "microbatches")
    _check_ranks(virtual_stages, "virtual_stages")
    if virtual_stages == 1:
        return float((microbatches - 1) * t.max() + t.sum())
    return float(microbatches * t.max() + (t.sum() - t.max()) / virtual_stages)


@dataclass(frozen=True)
class LayerCost:
    """One layer's work for one micro-batch on one GPU of its tensor-parallel group (seconds, bytes).

    ``*_compute_s`` exclude communication rows; ``replicated_*_s`` is the part of them that tensor
    parallelism leaves replicated (vector ops with no Megatron role: layer norms, dropouts, residual
    adds), which sequence parallelism divides by t; ``col_wgrad_s`` is the weight-gradient GEMMs of the
    column-parallel layers, behind which Megatron's asynchronous all-reduce hides the backward
    collectives."""
    fwd_compute_s: float
    bwd_compute_s: float
    attn_core_fwd_s: float
    replicated_fwd_s: float
    replicated_bwd_s: float
    col_wgrad_s: float
    fwd_collective_bytes: tuple[int, ...]
    bwd_collective_bytes: tuple[int, ...]
    params: int                 # parameters this GPU holds for the layer

    def to_dict(self) -> dict:
        return asdict(self)


def layer_cost(graph, time_s, layer: int | str) -> LayerCost:
    """The :class:`LayerCost` of layer ``layer`` (index into ``graph.meta["layers"]`` or its name) of a
    training graph, with per-row op times ``time_s`` (``OpTimes.time_s``; the rows of communication ops
    are ignored: collectives are timed here, from their bytes)."""
    nd = graph.nodes
    names = list(graph.meta.get("layers") or [])
    if isinstance(layer, str):
        if layer not in names:
            raise ValueError(f"layer {layer!r} is not in the graph; its layers: {names[:6]}"
                             f"{' ...' if len(names) > 6 else ''}")
        layer = names.index(layer)
    if not 0 <= int(layer) < len(names):
        raise ValueError(f"layer must be in [0, {len(names)}), got {layer!r}")
    ts = np.asarray(time_s, dtype=float)
    if ts.shape != (graph.num_nodes,):
        raise ValueError(f"time_s has shape {ts.shape}, the graph has {graph.num_nodes} rows")
    rows = nd["layer"] == int(layer)
    bwd = nd["is_backward"].astype(bool)
    comm = (nd["core"] == "comm") | (nd["kind"] == "allreduce")
    work = rows & ~comm & (nd["core"] != "none")
    role = nd["tp_role"]
    replicated = work & (role == "") & (nd["core"] == "vector")
    attn = work & ~bwd & (role == "shard")
    wgrad = work & bwd & (role == "col") & np.array([str(n).endswith("/wgrad") for n in nd["name"]])
    coll = rows & (nd["kind"] == "allreduce")
    bpe = int(graph.meta.get("bytes_per_element", 2))
    return LayerCost(
        fwd_compute_s=float(ts[work & ~bwd].sum()), bwd_compute_s=float(ts[work & bwd].sum()),
        attn_core_fwd_s=float(ts[attn].sum()),
        replicated_fwd_s=float(ts[replicated & ~bwd].sum()),
        replicated_bwd_s=float(ts[replicated & bwd].sum()),
        col_wgrad_s=float(ts[wgrad].sum()),
        fwd_collective_bytes=tuple(int(b) for b in nd["input_bytes"][coll & ~bwd]),
        bwd_collective_bytes=tuple(int(b) for b in nd["input_bytes"][coll & bwd]),
        params=int(nd["weight_bytes"][rows & ~bwd].sum()) // bpe)


@dataclass(frozen=True)
class TrainSetup:
    """How a run was parallelised and what it recomputed (Narayanan et al. 2021's t, p, d, b, B, v)."""
    tp: int
    pp: int
    dp: int
    micro_batch: int
    global_batch: int
    virtual_stages: int = 1
    recompute: str = "full"
    sequence_parallel: bool = False
    tp_bwd_overlap: bool = False     # backward collectives of column GEMMs behind their wgrad GEMMs
    dp_overlap: bool = False         # gradient all-reduce hidden behind the backward

    def __post_init__(self):
        for f in ("tp", "pp", "dp", "micro_batch", "global_batch", "virtual_stages"):
            _check_ranks(getattr(self, f), f)
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute is {self.recompute!r}; allowed: {list(RECOMPUTE)}")
        if self.global_batch % (self.dp * self.micro_batch):
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of dp x micro_batch = "
                             f"{self.dp * self.micro_batch}")

    @property
    def microbatches(self) -> int:
        """m = B / (d · b), micro-batches per pipeline per iteration."""
        return self.global_batch // (self.dp * self.micro_batch)


@dataclass(frozen=True)
class Links:
    """Bandwidths per GPU per direction (bytes/s): NVLink inside the tensor-parallel group, the
    InfiniBand link between pipeline stages, the bus bandwidth of the data-parallel ring, and HBM."""
    tp_bytes_per_s: float
    pp_bytes_per_s: float
    dp_bytes_per_s: float
    hbm_bytes_per_s: float

    def __post_init__(self):
        for f in ("tp_bytes_per_s", "pp_bytes_per_s", "dp_bytes_per_s", "hbm_bytes_per_s"):
            _check_positive(getattr(self, f), f)


@dataclass(frozen=True)
class MicrobatchTime:
    """One layer's forward + backward of one micro-batch, split by cause (seconds)."""
    compute_s: float        # forward + backward ops
    recompute_s: float      # the repeated forward (full) or attention core (selective)
    tp_comm_s: float        # collectives on the critical path (recomputed ones included)
    tp_hidden_s: float      # collectives hidden behind weight-gradient GEMMs

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_comm_s


def microbatch_time(cost: LayerCost, setup: TrainSetup, links: Links) -> MicrobatchTime:
    """Forward + backward of one micro-batch through one layer under ``setup``."""
    t = setup.tp
    shrink = (1.0 - 1.0 / t) if setup.sequence_parallel else 0.0
    fwd = cost.fwd_compute_s - shrink * cost.replicated_fwd_s
    bwd = cost.bwd_compute_s - shrink * cost.replicated_bwd_s
    coll_f = sum(ring_allreduce_s(b, t, links.tp_bytes_per_s) for b in cost.fwd_collective_bytes)
    coll_b = sum(ring_allreduce_s(b, t, links.tp_bytes_per_s) for b in cost.bwd_collective_bytes)
    hidden = min(coll_b, cost.col_wgrad_s) if setup.tp_bwd_overlap else 0.0
    if setup.recompute == "full":
        re_s, re_comm = fwd, coll_f
    elif setup.recompute == "selective":
        re_s, re_comm = cost.attn_core_fwd_s, 0.0
    else:
        re_s, re_comm = 0.0, 0.0
    return MicrobatchTime(compute_s=fwd + bwd, recompute_s=re_s, tp_comm_s=coll_f + coll_b - hidden + re_comm,
                          tp_hidden_s=hidden)


@dataclass(frozen=True)
class StepTime:
    """One iteration and where its time goes (seconds). ``stage_s``: each stage's forward + backward
    of one micro-batch; ``compute_s`` .. ``p2p_s``: the heaviest stage's totals over the m micro-batches;
    ``bubble_s``: the pipeline time beyond m times the heaviest stage."""
    iteration_s: float
    pipeline_s: float
    bubble_s: float
    compute_s: float
    recompute_s: float
    tp_comm_s: float
    p2p_s: float
    dp_allreduce_s: float
    dp_exposed_s: float
    optimizer_s: float
    microbatches: int
    stage_s: tuple[float, ...]
    params_per_gpu: int

    def to_dict(self) -> dict:
        return asdict(self)


def step_time(layer: LayerCost, num_layers: int, setup: TrainSetup, links: Links, *,
              activation_bytes: int, embed: LayerCost | None = None, head: LayerCost | None = None,
              grad_bytes_per_param: int = 2, optimizer_bytes_per_param: int = 0,
              shared_params: int = 0) -> StepTime:
    """One training iteration of a GPT of ``num_layers`` identical layers ``layer`` split evenly into
    ``setup.pp`` stages; the first stage also runs ``embed``, the last ``head`` (LM head and loss).
    ``activation_bytes``: one micro-batch's activation between stages (b · s · h · bytes per element).
    ``shared_params``: parameters ``embed`` and ``head`` both count (tied input and output embeddings); with
    one stage they are one tensor, counted once (with several, the first and last stage each hold a copy,
    as Megatron-LM keeps them)."""
    _check_ranks(num_layers, "num_layers")
    p, v = setup.pp, setup.virtual_stages
    if num_layers % (p * v):
        raise ValueError(f"num_layers {num_layers} is not a multiple of pp x virtual_stages = {p * v}")
    per_stage = num_layers // p
    m = setup.microbatches
    lt = microbatch_time(layer, setup, links)
    ends = [embed, head]
    plain = replace(setup, recompute="none")   # Megatron checkpoints transformer layers only
    et = [microbatch_time(c, plain, links) if c is not None else None for c in ends]
    p2p = 0.0
    if p > 1:
        shard = activation_bytes / setup.tp   # scatter/gather: each GPU sends 1/t over its own link
        gather = ring_allgather_s(activation_bytes, setup.tp, links.tp_bytes_per_s)
        one = shard / links.pp_bytes_per_s + gather
        p2p = 2 * v * one
    stage = np.full(p, per_stage * lt.total_s + p2p)
    parts = {k: np.full(p, per_stage * getattr(lt, k)) for k in ("compute_s", "recompute_s", "tp_comm_s")}
    params = np.full(p, per_stage * layer.params, dtype=np.int64)
    for idx, (c, t_c) in zip((0, p - 1), zip(ends, et)):
        if c is None:
            continue
        stage[idx] += t_c.total_s
        for k in parts:
            parts[k][idx] += getattr(t_c, k)
        params[idx] += c.params
    if p == 1 and embed is not None and head is not None:
        params[0] -= int(shared_params)
    pipe = pipeline_time_s(stage, m, v)
    k = int(np.argmax(stage))
    busiest = int(params.max())
    dp_s = ring_allreduce_s(busiest * grad_bytes_per_param, setup.dp, links.dp_bytes_per_s)
    dp_exposed = 0.0 if setup.dp_overlap else dp_s
    opt_s = busiest * optimizer_bytes_per_param / links.hbm_bytes_per_s
    busy = {key: m * float(val[k]) for key, val in parts.items()}
    return StepTime(iteration_s=pipe + dp_exposed + opt_s, pipeline_s=pipe,
                    bubble_s=pipe - m * float(stage[k]), **busy, p2p_s=m * p2p, dp_allreduce_s=dp_s,
                    dp_exposed_s=dp_exposed, optimizer_s=opt_s, microbatches=m,
                    stage_s=tuple(float(x) for x in stage), params_per_gpu=busiest)


def dp_ring_bytes_per_s(tp: int, dp: int, gpus_per_node: int, ib_bytes_per_s: float,
                        nvlink_bytes_per_s: float) -> float:
    """Bus bandwidth of a data-parallel ring under Megatron's rank order (tensor-parallel ranks
    adjacent, then data-parallel): ``k = min(d, gpus_per_node / t)`` ranks of the ring share a node and
    each drives its own NIC, so the ring moves ``k · ib`` per step across nodes; a ring inside one node
    runs over NVLink."""
    for name, val in (("tp", tp), ("dp", dp), ("gpus_per_node", gpus_per_node)):
        _check_ranks(val, name)
    per_node = max(1, gpus_per_node // tp)
    if dp <= per_node:
        return nvlink_bytes_per_s
    return min(per_node * ib_bytes_per_s, nvlink_bytes_per_s)


def _check_ranks(x, name: str) -> None:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {x!r}")


def _check_positive(x, name: str) -> None:
    if not isinstance(x, (int, float, np.floating, np.integer)) or not np.isfinite(x) or x <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {x!r}")
