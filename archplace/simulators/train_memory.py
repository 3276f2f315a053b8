"""Memory per GPU of one data/tensor/pipeline/context-parallel training run: what ``archplace plan`` checks
against the GPU before it times a configuration.

Why closed forms and not the captured graph's saved tensors: the activation counts of Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models", §4) are what Megatron-LM's
memory planning, and the users who read it, reason in; each term below names the tensor it is, so a
hand count can check it (tests/test_plan_memory.py). Bytes per element 2 (bf16/fp16) for activations,
1 for dropout masks.

One transformer layer of hidden size ``h``, ``a`` query heads, key/value width ``h_kv`` (GQA: kv heads ×
head dim), feed-forward width ``f``, sequence ``s`` and micro-batch ``b`` saves for its backward:

- *replicated* under tensor parallelism (Korthikanti's ``10 s b h``): the two layer-norm inputs
  (``4 s b h``), the QKV GEMMs' input (``2 s b h``), the MLP's input (``2 s b h``) and the two dropout
  masks after the attention and MLP blocks (``2 s b h``, none without dropout);
- *sharded* over the t tensor-parallel ranks (``24 s b h`` for a GPT): Q and K (``2 s b h + 2 s b h_kv``),
  V (``2 s b h_kv``), the output projection's input (``2 s b h``) and the MLP: the activation's input and
  the second GEMM's input (``4 s b f``), or for a gated MLP (SwiGLU) the gate and up outputs, the
  activation's output and the product (``8 s b f``);
- the attention core (eager attention, ``5 a s² b`` with dropout): the softmax output (``2 a s² b``), the
  dropout mask (``a s² b``) and its output (``2 a s² b``); ``2 a s² b`` without attention dropout.
  Fused attention (FlashAttention) keeps only the output, already counted, and the row log-sum-exp
  (fp32, ``4 a s b``); selective recomputation drops the core (it is recomputed).

Sequence parallelism divides the replicated part by t; context parallelism divides ``s`` by ``cp`` (the
core keeps ``s / cp`` queries against all ``s`` keys); full recomputation keeps only the layer's input
(``2 s b h``, over t with sequence parallelism) and rebuilds one layer's activations at a time.

Model state per parameter, with ``g`` bytes per gradient (``--grad-reduce-dtype``) and Adam's fp32
master copy and two moments (12 B; ``workloads.layers.optimizer_bytes_per_param``): weights 2, gradients
``g``, optimizer state 12. ZeRO (Rajbhandari et al. 2020) shards them over the ``n`` data-parallel ranks
(data × context parallel: those ranks hold the same parameters): stage 1 (Megatron's distributed
optimizer) the optimizer state, stage 2 also the gradients, stage 3 (FSDP) also the weights, which it
gathers one layer at a time (two layers' full weights in flight: the one computing and the prefetched).

The 1F1B schedule keeps ``min(p - k, m)`` micro-batches in flight on stage k; the interleaved schedule
with ``v`` chunks per GPU keeps ``p + (p - 1) / v`` micro-batches' worth of a stage's layers on the first
stage (Korthikanti §4.2.3: ``1 + (p - 1) / (p v)`` times the p of plain 1F1B). The last stage also holds
the fp32 logits of one micro-batch for the loss (``4 s b V / t``), the largest temporary of a GPT step.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..workloads.layers import optimizer_bytes_per_param

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("sdpa", "eager")
ZERO_STAGES = (0, 1, 2, 3)
WEIGHT_BYTES = 2          # bf16 / fp16 parameters
ACT_BYTES = 2             # bf16 / fp16 activations
MASK_BYTES = 1            # a dropout mask
LSE_BYTES = 4             # FlashAttention's fp32 log-sum-exp per row
LOGIT_BYTES = 4           # the loss's fp32 logits


@dataclass(frozen=True)
class TransformerShape:
    """The sizes of a decoder stack that its memory depends on (from the model's config)."""

    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    layers: int
    vocab: int
    gated_mlp: bool = False       # SwiGLU-style: gate and up projections
    dropout: bool = True          # attention and residual dropout (GPT-2/3: yes; Llama: no)

    @property
    def kv_hidden(self) -> int:
        """The key/value width: kv heads × head dim."""
        return self.kv_heads * (self.hidden // self.heads)

    def to_dict(self) -> dict:
        return asdict(self)


def layer_activation_bytes(shape: TransformerShape, *, seq: int, mbs: int, tp: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           attention: str = "eager") -> float:
    """Bytes one layer saves for its backward per micro-batch on one GPU (module docstring's terms)."""
    _check(recompute, RECOMPUTE, "recompute")
    _check(attention, ATTENTION, "attention")
    s, b, h, f, hk = seq / cp, mbs, shape.hidden, shape.ffn_hidden, shape.kv_hidden
    sp_div = tp if sequence_parallel else 1
    if recompute == "full":
        return ACT_BYTES * s * b * h / sp_div
    masks = 2 * MASK_BYTES * s * b * h if shape.dropout else 0.0
    replicated = ACT_BYTES * s * b * (2 * h + h + h) + masks            # 2 norms, QKV input, MLP input
    mlp = (4 * ACT_BYTES if shape.gated_mlp else 2 * ACT_BYTES) * s * b * f
    sharded = ACT_BYTES * s * b * (h + hk + hk + h) + mlp                 # Q, K, V, out-proj input, MLP
    return replicated / sp_div + sharded / tp + attention_core_bytes(
        shape, seq=seq, mbs=mbs, tp=tp, cp=cp, recompute=recompute, attention=attention)


def attention_core_bytes(shape: TransformerShape, *, seq: int, mbs: int, tp: int = 1, cp: int = 1,
                         recompute: str = "none", attention: str = "eager") -> float:
    """The attention core's saved bytes per micro-batch and GPU (0 under selective recomputation)."""
    if recompute != "none":
        return 0.0
    a, b = shape.heads, mbs
    q = seq / cp                                   # this rank's queries (context parallel), all keys
    if attention == "sdpa":
        return LSE_BYTES * a * q * b / tp
    per_score = (2 * ACT_BYTES + MASK_BYTES) if shape.dropout else ACT_BYTES
    return per_score * a * q * seq * b / tp


def layer_temporary_bytes(shape: TransformerShape, *, seq: int, mbs: int, tp: int = 1, cp: int = 1,
                          sequence_parallel: bool = False, recompute: str = "none",
                          attention: str = "eager") -> float:
    """What full recomputation rebuilds at a time: one layer's activations without recomputation (0 for
    the other modes, whose saved bytes are already counted)."""
    if recompute != "full":
        return 0.0
    return layer_activation_bytes(shape, seq=seq, mbs=mbs, tp=tp, cp=cp, sequence_parallel=sequence_parallel,
                                  recompute="none", attention=attention)


def logits_bytes(shape: TransformerShape, *, seq: int, mbs: int, tp: int = 1, cp: int = 1) -> float:
    """The loss's fp32 logits of one micro-batch on one GPU of the last stage (vocabulary split over t)."""
    return LOGIT_BYTES * (seq / cp) * mbs * shape.vocab / tp


def in_flight_microbatches(stage: int, pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak: 1F1B keeps ``min(p - k, m)``;
    the interleaved schedule ``p + (p - 1) / v`` on the first stage (Korthikanti §4.2.3), which bounds
    every stage."""
    if virtual_stages > 1:
        return float(min(pp + (pp - 1) / virtual_stages, microbatches * virtual_stages))
    return float(min(pp - stage, microbatches))


@dataclass(frozen=True)
class StateBytes:
    """Bytes per parameter this GPU keeps of weights, gradients and optimizer state under a ZeRO stage."""

    weights: float
    gradients: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer


def state_bytes_per_param(*, zero: int, shards: int, grad_bytes: int, optimizer: str = "adam",
                          param_bytes: int = WEIGHT_BYTES) -> StateBytes:
    """Weights, gradients and optimizer state per parameter with ZeRO stage ``zero`` over ``shards``
    data-parallel ranks (module docstring)."""
    if zero not in ZERO_STAGES:
        raise ValueError(f"zero must be one of {list(ZERO_STAGES)}, got {zero!r}")
    if not (isinstance(shards, int) and shards >= 1):
        raise ValueError(f"shards must be an integer >= 1, got {shards!r}")
    opt = optimizer_bytes_per_param(optimizer, param_bytes)
    return StateBytes(weights=param_bytes / (shards if zero >= 3 else 1),
                      gradients=grad_bytes / (shards if zero >= 2 else 1),
                      optimizer=opt / (shards if zero >= 1 else 1))


@dataclass(frozen=True)
class StageMemory:
    """One GPU of one pipeline stage at its peak (bytes)."""

    weight_bytes: float
    gradient_bytes: float
    optimizer_bytes: float
    activation_bytes: float        # saved activations of the in-flight micro-batches
    temporary_bytes: float         # the largest buffer alive at once beyond them (logits, recomputed
                                   # layer, ZeRO-3's gathered weights)

    @property
    def total_bytes(self) -> float:
        return (self.weight_bytes + self.gradient_bytes + self.optimizer_bytes + self.activation_bytes
                + self.temporary_bytes)

    def to_dict(self) -> dict:
        return {**asdict(self), "total_bytes": self.total_bytes}


def _check(v, allowed, name: str) -> None:
    if v not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {v!r}")
