"""A model's training step on one GPU (``archplace estimate MODEL --gpu NAME``).

The accelerator estimate (``estimate --arch``, ``graphs.py``) times ops on an architecture being
searched; this one times them on a real GPU under an op model (``simulators/gpu_ops.py``: roofline,
calibrated on micro-benchmarks, or profiled) and with attention run eagerly (as captured) or fused
(``sdpa``: FlashAttention's IO-aware traffic, ``workloads/attention_fusion.py``).

The step is a whole training step: ``global_batch / mbs`` micro-batches of forward + backward
(gradient accumulation, one after another), then one optimizer update, memory-bound
(``simulators/gpu_step.py``). The op model defaults to ``calibrated`` on every GPU preset: measured on the
H200, scaled by peak ratios elsewhere (the note says which); the roofline, on request, carries its
measured bias (:data:`ROOFLINE_BIAS`). The training memory is compared with the GPU's HBM: ``fits`` and,
when it does not, a one-line ``reason``."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._common import (
    InvalidRequest,
    ProgressFn,
    Request,
    Result,
    Steps,
    check_capture_blocks,
    check_choice,
    check_int,
    check_model,
    check_optional_str,
    invalid,
)

GPU_DTYPES = ("bf16", "fp16", "fp32")
ATTENTION = ("eager", "sdpa")
DEFAULT_OP_MODEL = "calibrated"
# what the project's validation measured of the roofline op model (README, "Published runs" and
# "Measured on a real H200"): it runs the weight GEMMs at datasheet peak
ROOFLINE_BIAS = ("optimistic: under-predicts every one of 18 published Megatron-LM A100 runs by 22-32% "
                 "(bench/gpu/gpu_validation.py) and measured H200 steps by about 1.8x (median "
                 "predicted/measured "
                 "0.54, bench/gpu/gpu_measured_validation.py); calibrated is the default for that reason")


@dataclass(frozen=True)
class GpuEstimateRequest(Request):
    model: str                   # preset, hf:CONFIG.json or archplace .parquet graph
    gpu: str                     # GPU preset: v100-sxm2, p100-pcie, a100-40gb, a100-80gb, h100-sxm, h200
    mbs: int = 1
    seq: int | None = None
    dtype: str = "bf16"          # training precision: bf16, fp16, fp32
    attention: str = "eager"     # eager (as captured) or sdpa (fused, FlashAttention-style)
    op_model: str | None = None  # roofline, calibrated, profiled (None: calibrated where measured data exist)
    profile: str | None = None   # an op profile file (``archplace profile``); implies op_model profiled
    capture_blocks: int = 3
    optimizer: str = "adam"      # sgd, adam, adafactor: the optimizer state in ``memory`` and its update
    global_batch: int | None = None  # samples per optimizer step, a multiple of mbs (None: mbs)

    def validate(self) -> None:
        from ..hardware.gpus import gpu_spec
        from ..simulators.gpu_ops import OP_MODELS
        from ..workloads.layers import OPTIMIZERS

        check_model(self.model, files=True)
        if isinstance(self.model, str) and self.model.endswith(".json") and not self.model.startswith("hf:"):
            raise invalid("model", f"{self.model!r} is a dnn-partitioning file of measured latencies "
                                   "without shapes; a GPU estimate needs a preset, a transformers config "
                                   "or a .parquet graph")
        if not (isinstance(self.gpu, str) and self.gpu):
            raise invalid("gpu", f"must be a GPU preset name, got {self.gpu!r}")
        try:
            gpu_spec(self.gpu)
        except ValueError as e:
            raise invalid("gpu", str(e).removeprefix("gpu ")) from None
        check_int("mbs", self.mbs)
        check_int("global_batch", self.global_batch, optional=True)
        if self.global_batch is not None and self.global_batch % self.mbs:
            raise InvalidRequest("{global_batch} must be a multiple of {mbs} " + str(self.mbs) + ", got "
                                 + repr(self.global_batch), "global_batch", "mbs")
        check_int("seq", self.seq, optional=True)
        check_choice("dtype", self.dtype, GPU_DTYPES)
        check_choice("attention", self.attention, ATTENTION)
        if self.op_model is not None:
            check_choice("op_model", self.op_model, OP_MODELS)
        check_optional_str("profile", self.profile)
        if self.profile is not None:
            if self.op_model not in (None, "profiled"):
                raise InvalidRequest("{profile} implies {op_model} profiled, got " + repr(self.op_model),
                                     "profile", "op_model")
            if not Path(self.profile).exists():
                raise invalid("profile", f"{self.profile!r} does not exist")
            if self.attention == "sdpa":
                raise InvalidRequest("{profile} times the ops of the captured (eager) graph; "
                                     "{attention} sdpa fuses ops it has no time for", "profile", "attention")
        elif self.op_model == "profiled":
            raise InvalidRequest("{op_model} profiled needs {profile} FILE (written by archplace profile)",
                                 "op_model", "profile")
        check_capture_blocks(self.model, self.capture_blocks)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)


@dataclass
class GpuEstimateResult(Result):
    model: str | None
    gpu: dict[str, Any]            # name, label, source
    dtype: str
    mbs: int | None
    seq: int | None
    attention: str
    op_model: dict[str, Any]       # OpTimes.to_dict(): op_model, gpu, dtype, note; and bias (roofline)
    step_time_s: float             # the whole step: microbatches x microbatch_time_s + optimizer_s
    forward_s: float               # forward of one micro-batch
    backward_s: float              # backward of one micro-batch
    achieved_flops_per_s: float | None  # microbatches x flops / step_time_s
    flops: float                   # one micro-batch, forward + backward
    moved_bytes: float             # HBM bytes the ops of one micro-batch move (activations, weights read)
    by_core_s: dict[str, float]    # one micro-batch
    by_kind_s: dict[str, float]    # one micro-batch
    layers: list[dict[str, Any]]   # {name, time_s, forward_s, backward_s, ops}; sum = microbatch_time_s
    slowest_ops: list[dict[str, Any]]
    memory: dict[str, Any]         # weights, gradients, optimizer state, saved activations (bytes); gpu_bytes
    fused_attention: dict[str, Any] | None = None  # sdpa: ops fused, sram_bytes, chains left eager
    global_batch: int | None = None  # samples per optimizer step
    microbatches: int = 1          # global_batch / mbs, accumulated one after another
    microbatch_time_s: float = 0.0  # forward + backward of one micro-batch, every kernel in turn
    optimizer_s: float = 0.0       # the update, memory-bound (optimizer: how it is counted)
    optimizer: dict[str, Any] | None = None  # optimizer, params, bytes_per_param, hbm_bytes_per_s, time_s
    mfu: float | None = None       # achieved_flops_per_s / the GPU's dense peak at dtype
    fits: bool | None = None       # memory total_bytes <= the GPU's HBM
    reason: str | None = None      # why it does not fit (None when it fits)


def gpu_training_graph(model: str, *, seq: int | None, mbs: int, dtype: str, attention: str,
                       sram_bytes: int, capture_blocks: int = 3):
    """The training graph of ``model`` at ``dtype``'s bytes per element, attention ``eager`` or ``sdpa``
    (fused after capture, before the backward pass is derived)."""
    from ..simulators.gpu_step import bytes_per_element
    from ..workloads.backward import with_attention

    bpe = bytes_per_element(dtype)
    if model.endswith(".parquet") and not model.startswith("hf:"):
        from ..workloads import OpGraph

        g = OpGraph.from_parquet(model)
        have = int(g.meta.get("bytes_per_element", 2))
        if have != bpe:
            raise invalid("dtype", f"{dtype} needs {bpe} bytes per element; graph file {model!r} was built "
                                   f"with {have}")
        if attention == "eager" and g.nodes["is_backward"].any():
            return g
        return with_attention(g.forward(), attention, sram_bytes=sram_bytes)
    from ..workloads.models import build_graph

    fwd = build_graph(model, seq=seq, mbs=mbs, training=False, bytes_per_element=bpe,
                      capture_blocks=capture_blocks)
    return with_attention(fwd, attention, sram_bytes=sram_bytes)


def estimate_gpu(req: GpuEstimateRequest, *, progress: ProgressFn | None = None,
                 cancel: threading.Event | None = None) -> GpuEstimateResult:
    """One training step of a model on one GPU: stages ``graph``, ``estimate``, ``done``."""
    import numpy as np

    from ..hardware.gpus import gpu_spec
    from ..simulators.gpu_step import (
        accumulated_step_s,
        bytes_per_element,
        graph_params,
        microbatch_count,
        optimizer_step,
        sram_bytes,
        training_step,
    )
    from .graphs import _training_memory

    req.validate()
    steps = Steps("estimate", progress, cancel)
    gpu = gpu_spec(req.gpu)
    sram = sram_bytes(gpu)
    g = gpu_training_graph(req.model, seq=req.seq, mbs=req.mbs, dtype=req.dtype, attention=req.attention,
                           sram_bytes=sram, capture_blocks=req.capture_blocks)
    steps.stage("graph", ops=g.num_nodes)
    profile = None
    if req.profile is not None:
        from ..simulators.gpu_ops import load_profile

        profile = load_profile(req.profile)
    op_model = req.op_model or ("profiled" if profile is not None else DEFAULT_OP_MODEL)
    step = training_step(g, gpu, dtype=req.dtype, op_model=op_model, profile=profile)
    mbs = int(g.meta.get("mbs") or req.mbs)
    global_batch = req.global_batch if req.global_batch is not None else mbs
    try:
        micro = microbatch_count(global_batch, mbs)
    except ValueError:
        raise invalid("global_batch", f"must be a multiple of the graph's micro-batch {mbs}, got "
                                      f"{global_batch!r}") from None
    opt = optimizer_step(graph_params(g), req.optimizer, gpu, bytes_per_element=bytes_per_element(req.dtype))
    total_s = accumulated_step_s(step.step_time_s, micro, opt.time_s)
    steps.stage("estimate", op_model=step.op_times.op_model, step_time_s=total_s)
    nd = g.nodes
    t = np.asarray(step.op_times.time_s, dtype=np.float64)
    layers = g.meta.get("layers") or []
    top = np.argsort(-t, kind="stable")[:12]
    slowest = [{"name": nd["name"][i], "kind": nd["kind"][i], "core": nd["core"][i],
                "pass": "backward" if nd["is_backward"][i] else "forward",
                "layer": layers[nd["layer"][i]] if nd["layer"][i] >= 0 else None,
                "flops": float(nd["flops"][i]), "time_s": float(t[i])} for i in top]
    fa = g.meta.get("fused_attention")
    fused = None if fa is None else {"ops": len(fa["ops"]), "sram_bytes": fa["sram_bytes"],
                                     "left_eager": list(fa["left_eager"])}
    om = step.op_times.to_dict()
    if om["op_model"] == "roofline":
        om["bias"] = ROOFLINE_BIAS
    mem = _training_memory(g, req.optimizer)
    fits, reason = memory_fit(mem, gpu)
    mem["gpu_bytes"] = int(gpu.memory_bytes)
    whole = step.to_dict()
    fl = micro * step.flops / total_s if total_s > 0 else None
    whole.update(step_time_s=total_s, achieved_flops_per_s=fl)
    res = GpuEstimateResult(
        model=g.meta.get("model"), gpu={"name": gpu.name, "label": gpu.label, "source": gpu.source},
        dtype=req.dtype, mbs=g.meta.get("mbs"), seq=g.meta.get("seq"), attention=req.attention,
        op_model=om, **whole, slowest_ops=slowest, memory=mem, fused_attention=fused,
        global_batch=global_batch, microbatches=micro, microbatch_time_s=step.step_time_s,
        optimizer_s=opt.time_s, optimizer=opt.to_dict(),
        mfu=None if fl is None else fl / gpu.peak(req.dtype), fits=fits, reason=reason)
    steps.done(step_time_s=res.step_time_s)
    return res


def memory_fit(mem: dict[str, Any], gpu) -> tuple[bool, str | None]:
    """Whether one GPU holds the training state ``mem`` (``api.graphs._training_memory``: weights,
    gradients, optimizer state, one micro-batch's saved activations; gradient accumulation adds none) in
    its HBM, and a one-line reason when it does not. Nothing is counted for the CUDA context, workspaces
    or fragmentation, so ``fits`` is necessary, not sufficient."""
    total, cap = int(mem["total_bytes"]), int(gpu.memory_bytes)
    if total <= cap:
        return True, None
    gib = 1024 ** 3
    parts = sorted((("weights", mem["weight_bytes"]), ("gradients", mem["gradient_bytes"]),
                    (f"{mem['optimizer']} state", mem["optimizer_bytes"]),
                    ("saved activations", mem["activation_bytes"])), key=lambda kv: -kv[1])
    return False, (f"needs {total / gib:.1f} GiB of training state ("
                   + ", ".join(f"{k} {v / gib:.1f}" for k, v in parts)
                   + f" GiB) but the {gpu.label} has {cap / gib:.1f} GiB of HBM")
