"""One training step of a model on one GPU: forward + backward of each micro-batch from per-op times,
then the optimizer update.

One GPU runs a training step's kernels one after another on one stream (PyTorch eager, no CUDA graphs,
no overlap of independent kernels), so the step time is the sum of the op times that
``gpu_ops.gpu_op_times`` gives under the chosen op model. The per-layer rows sum the forward and
backward ops of each layer (``meta["layers"]``), so they add up to the step.

``SRAM_BYTES`` is the on-chip memory a fused attention kernel tiles for (the ``M`` of FlashAttention's
Algorithm 1, ``workloads/attention_fusion.py``): the shared memory one thread block may use on an SM.

The optimizer update is memory-bound, as ``simulators/train_step.py`` prices it: the bytes it reads and
writes per parameter (:func:`optimizer_update_bytes_per_param`) times the parameters, at the HBM
bandwidth. A step of ``G / mbs`` accumulated micro-batches is ``G / mbs`` micro-batch times plus one
update (:func:`accumulated_step_s`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..hardware.gpus import GPUSpec
from ..workloads.graph import OpGraph
from ..workloads.layers import MASTER_COPY_BYTES, optimizer_bytes_per_param
from ..workloads.ops import DTYPE_BYTES
from .gpu_ops import OpTimes, gpu_op_times

# Shared memory per thread block (bytes), from the architecture whitepapers:
# - Pascal GP100 (P100): 64 KB shared memory per SM, 48 KB per block ("NVIDIA Tesla P100" whitepaper, 2016);
# - Volta GV100 (V100): 128 KB L1/shared per SM, up to 96 KB shared per block ("NVIDIA Tesla V100 GPU
#   Architecture" whitepaper, 2017, §"Volta SM");
# - Ampere GA100 (A100): 192 KB L1/shared per SM, up to 164 KB shared, 163 KB per block ("NVIDIA A100
#   Tensor Core GPU Architecture" whitepaper, 2020, §"A100 SM Architecture");
# - Hopper GH100 (H100, H200): 256 KB L1/shared per SM, up to 228 KB shared, 227 KB per block ("NVIDIA
#   H100 Tensor Core GPU Architecture" whitepaper, 2022, §"H100 SM Architecture"; the H200 has the same SM).
# FlashAttention itself needs Ampere or newer; on Volta and Pascal PyTorch's SDPA runs its memory-efficient
# kernel, which tiles the same way (no N x N matrix in HBM), so the same IO count stands in for it.
SRAM_BYTES: dict[str, int] = {
    "p100-pcie": 48 * 1024,
    "v100-sxm2": 96 * 1024,
    "a100-40gb": 163 * 1024,
    "a100-80gb": 163 * 1024,
    "h100-sxm": 227 * 1024,
    "h200": 227 * 1024,
}


def sram_bytes(gpu: GPUSpec) -> int:
    """The SRAM size a fused attention kernel tiles for on ``gpu``; one line naming the presets that
    have one otherwise."""
    if gpu.sram_bytes_per_sm is not None:
        return gpu.sram_bytes_per_sm
    try:
        return SRAM_BYTES[gpu.name]
    except KeyError:
        raise ValueError(f"gpu {gpu.name!r} has no SRAM size for fused attention (a GPU file gives it as "
                         f"sram_bytes_per_sm); known: {sorted(SRAM_BYTES)}") from None


def bytes_per_element(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype is {dtype!r}; allowed: {list(DTYPE_BYTES)}") from None


@dataclass(frozen=True)
class GpuStep:
    """One training step on one GPU. Times in seconds; ``layers`` in ``meta["layers"]`` order, then
    ``(no layer)`` for the ops outside every layer (when there are any)."""

    step_time_s: float
    forward_s: float
    backward_s: float
    layers: list[dict[str, Any]]  # {name, time_s, forward_s, backward_s, ops}
    by_core_s: dict[str, float]
    by_kind_s: dict[str, float]
    flops: float
    moved_bytes: float
    op_times: OpTimes

    def to_dict(self) -> dict[str, Any]:
        return {"step_time_s": self.step_time_s, "forward_s": self.forward_s, "backward_s": self.backward_s,
                "achieved_flops_per_s": self.flops / self.step_time_s if self.step_time_s > 0 else None,
                "flops": self.flops, "moved_bytes": self.moved_bytes, "by_core_s": self.by_core_s,
                "by_kind_s": self.by_kind_s, "layers": self.layers}


def _sums(keys: np.ndarray, t: np.ndarray) -> dict[str, float]:
    uniq, inv = np.unique(keys.astype(str), return_inverse=True)
    return {str(k): float(v) for k, v in zip(uniq, np.bincount(inv, weights=t, minlength=len(uniq)))}


def training_step(graph: OpGraph, gpu: GPUSpec, *, dtype: str, op_model: str | None = None,
                  profile: Any = None) -> GpuStep:
    """The step of a training graph (forward and backward rows) on one GPU: each op timed by
    ``gpu_op_times``, the step their sum."""
    from ..workloads.ops import moved_bytes

    if not graph.nodes["is_backward"].any():
        raise ValueError("training_step needs a training graph (forward and backward ops); this one has "
                         "no backward ops")
    ot = gpu_op_times(graph, gpu, dtype=dtype, op_model=op_model, profile=profile)
    t = np.asarray(ot.time_s, dtype=np.float64)
    nd = graph.nodes
    bwd = nd["is_backward"]
    names = list(graph.meta.get("layers") or [])
    layer = nd["layer"].astype(np.int64)
    nl = len(names)
    idx = np.where(layer >= 0, layer, nl)
    per = np.bincount(idx, weights=t, minlength=nl + 1)
    per_f = np.bincount(idx[~bwd], weights=t[~bwd], minlength=nl + 1)
    per_b = np.bincount(idx[bwd], weights=t[bwd], minlength=nl + 1)
    count = np.bincount(idx, minlength=nl + 1)
    rows = [{"name": name, "time_s": float(per[i]), "forward_s": float(per_f[i]),
             "backward_s": float(per_b[i]), "ops": int(count[i])}
            for i, name in enumerate([*names, "(no layer)"]) if i < nl or count[i]]
    return GpuStep(step_time_s=float(t.sum()), forward_s=float(t[~bwd].sum()), backward_s=float(t[bwd].sum()),
                   layers=rows, by_core_s=_sums(nd["core"], t), by_kind_s=_sums(nd["kind"], t),
                   flops=float(nd["flops"].sum()), moved_bytes=float(moved_bytes(nd).sum()), op_times=ot)


# ------------------------------------------------------------------------------------- the optimizer

def optimizer_update_bytes_per_param(optimizer: str, bytes_per_element: int) -> float:
    """HBM bytes one optimizer update reads and writes per parameter, counted the way
    ``bench/gpu/gpu_validation.py`` counts Megatron's Adam (46 B at bf16) and generalised from the optimizer
    state that ``workloads.layers.optimizer_bytes_per_param`` keeps (``S``: fp32 master copy and moments).
    With a master copy (parameters narrower than fp32 and an optimizer that keeps one) the gradients are
    accumulated in fp32 (``g`` = 4 bytes), else in the parameters' precision (``g`` = bytes per element):

    - the update: read the gradient (``g``), read and write the state (``2 S``); without a master copy the
      parameter itself is read and written (``2 · bytes_per_element``);
    - gradient-norm clipping reads the gradient (``g``); mixed precision also reads it for the unscale /
      inf check (``g``);
    - with a master copy, the master is copied to the parameter (read 4, write ``bytes_per_element``);
    - the gradient buffer is zeroed for the next step (write ``g``).

    Adam: 46 B at bf16/fp16, 36 B at fp32; SGD (no state, the Phaze setting): 12 / 20 B; Adafactor
    (factored moments counted 0, as the memory model does): 30 / 20 B."""
    bpe = int(bytes_per_element)
    if bpe not in DTYPE_BYTES.values():
        raise ValueError(f"bytes_per_element is {bytes_per_element!r}; "
                         f"allowed: {sorted(set(DTYPE_BYTES.values()))}")
    state = optimizer_bytes_per_param(optimizer, bpe)  # ValueError naming the optimizers
    master = bpe < 4 and state >= MASTER_COPY_BYTES
    g = 4 if master else bpe
    update = g + 2 * state + (0 if master else 2 * bpe)
    clip = g + (g if bpe < 4 else 0)
    copy = (MASTER_COPY_BYTES + bpe) if master else 0
    return float(update + clip + copy + g)


def optimizer_step_s(params: float, bytes_per_param: float, hbm_bytes_per_s: float) -> float:
    """The memory-bound update: ``params · bytes_per_param / hbm_bytes_per_s`` (``train_step.step_time``'s
    ``optimizer_s``)."""
    if params < 0 or bytes_per_param < 0:
        raise ValueError(f"params and bytes_per_param must be >= 0, got {params!r}, {bytes_per_param!r}")
    if not hbm_bytes_per_s > 0:
        raise ValueError(f"hbm_bytes_per_s must be > 0, got {hbm_bytes_per_s!r}")
    return float(params) * float(bytes_per_param) / float(hbm_bytes_per_s)


@dataclass(frozen=True)
class OptimizerStep:
    """One optimizer update on one GPU: ``params`` parameters, ``bytes_per_param`` HBM traffic each."""

    optimizer: str
    params: int
    bytes_per_param: float
    hbm_bytes_per_s: float
    time_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer, "params": self.params, "bytes_per_param": self.bytes_per_param,
                "hbm_bytes_per_s": self.hbm_bytes_per_s, "time_s": self.time_s}


def optimizer_step(params: int, optimizer: str, gpu: GPUSpec, *, bytes_per_element: int) -> OptimizerStep:
    """The update of ``params`` parameters held at ``bytes_per_element`` under ``optimizer`` on ``gpu``,
    at its datasheet HBM bandwidth."""
    b = optimizer_update_bytes_per_param(optimizer, bytes_per_element)
    return OptimizerStep(optimizer, int(params), b, gpu.hbm_bytes_per_s,
                         optimizer_step_s(params, b, gpu.hbm_bytes_per_s))


def graph_params(graph: OpGraph) -> int:
    """Parameters of a graph: its forward rows' weight bytes over its bytes per element (what the memory
    model counts as weights)."""
    bpe = int(graph.meta.get("bytes_per_element", 2) or 2)
    return int(graph.nodes["weight_bytes"][~graph.nodes["is_backward"]].sum()) // bpe


def microbatch_count(global_batch: int, mbs: int) -> int:
    """``global_batch / mbs``; a global batch that is not a positive multiple of the micro-batch is a
    ValueError naming global_batch."""
    if mbs < 1 or global_batch < mbs or global_batch % mbs:
        raise ValueError(f"global_batch must be a positive multiple of the micro-batch {mbs}, "
                         f"got {global_batch!r}")
    return global_batch // mbs


def accumulated_step_s(microbatch_s: float, microbatches: int, optimizer_s: float) -> float:
    """Gradient accumulation on one GPU: the micro-batches run one after another (no overlap on one
    stream), then one optimizer update."""
    return microbatches * microbatch_s + optimizer_s
