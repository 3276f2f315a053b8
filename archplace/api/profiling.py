"""Measured op times of a model's training step (``archplace profile``): the step runs on the local
device (the CPU, or CUDA where there is one) and its measured time is mapped back to the nodes of the
model's archplace graph (:mod:`archplace.workloads.op_profiler`). The written profile is what
``--op-model profiled --profile FILE`` reads."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    ProgressFn,
    Request,
    Result,
    Steps,
    check_choice,
    check_int,
    check_model,
    invalid,
    is_int,
)

PROFILE_DEVICES = ("cpu", "cuda")
PROFILE_DTYPES = ("fp32", "bf16", "fp16")
PROFILE_METHODS = ("timer", "profiler")


@dataclass(frozen=True)
class ProfileRequest(Request):
    model: str                      # transformers preset, hf:PATH (--hf-config) or GDP preset (txl-2, ...)
    out: str                        # where the profile's JSON goes
    device: str = "cpu"             # cpu | cuda
    dtype: str = "fp32"             # fp32 | bf16 | fp16 (GDP presets: fp32)
    mbs: int = 1                    # micro-batch (a GDP preset's batch)
    seq: int | None = None          # tokens (None: the preset's; GDP presets fix their own)
    capture_blocks: int | None = None  # leading blocks captured per stack (None: the graph builders')
    method: str | None = None       # timer (CPU default) | profiler (CUDA's only one)
    steps: int = 5                  # measured rounds after the warm-up
    warmup: int = 2
    threads: int | None = 1         # CPU intra-op threads (None: torch's default)
    seed: int = 0

    def validate(self) -> None:
        from ..workloads.gdp_models import GDP_PRESETS

        if self.model not in GDP_PRESETS:
            check_model(self.model, files=False)
        if not (isinstance(self.out, str) and self.out):
            raise invalid("out", f"must be a file path, got {self.out!r}")
        check_choice("device", self.device, PROFILE_DEVICES)
        check_choice("dtype", self.dtype, PROFILE_DTYPES)
        check_int("mbs", self.mbs)
        check_int("seq", self.seq, optional=True)
        check_int("capture_blocks", self.capture_blocks, low=3, optional=True)
        if self.method is not None:
            check_choice("method", self.method, PROFILE_METHODS)
        check_int("steps", self.steps, 1, 1000)
        check_int("warmup", self.warmup, 0, 1000)
        check_int("threads", self.threads, optional=True)
        if not (is_int(self.seed) and self.seed >= 0):
            raise invalid("seed", f"must be an integer >= 0, got {self.seed!r}")


@dataclass
class ProfileResult(Result):
    model: str
    device: str
    device_name: str
    dtype: str
    mbs: int
    seq: int | None
    nodes: int
    measured_step_s: float          # the eager step without instruments (median)
    profiled_step_s: float          # sum of the node times + unmapped
    profiled_over_measured: float | None
    unmapped_s: float
    coverage: float                 # mapped / (mapped + unmapped)
    top_ops: list[dict[str, Any]]   # [{name, time_s, share}] slowest first
    out: str                        # where the profile was written
    software: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


def profile(req: ProfileRequest, *, progress: ProgressFn | None = None,
            cancel: threading.Event | None = None) -> ProfileResult:
    """Profile ``req.model``'s training step per graph node and write it to ``req.out``. Stages:
    ``profile``, ``done``."""
    from ..workloads.op_profiler import profile_model

    req.validate()
    steps = Steps("profile", progress, cancel)
    t0 = time.perf_counter()
    p = profile_model(req.model, device=req.device, dtype=req.dtype, mbs=req.mbs, seq=req.seq,
                      capture_blocks=req.capture_blocks, method=req.method, steps=req.steps,
                      warmup=req.warmup, threads=req.threads, seed=req.seed)
    path = p.save(req.out)
    steps.stage("profile", coverage=p.coverage, measured_step_s=p.measured_step_s)
    res = ProfileResult(
        model=p.model, device=p.device, device_name=p.device_name, dtype=p.dtype, mbs=p.mbs, seq=p.seq,
        nodes=len(p.names), measured_step_s=p.measured_step_s, profiled_step_s=p.profiled_step_s,
        profiled_over_measured=p.profiled_step_s / p.measured_step_s if p.measured_step_s > 0 else None,
        unmapped_s=p.unmapped_s, coverage=p.coverage, top_ops=p.top(10), out=str(path),
        software=dict(p.software), details=dict(p.details), wall_s=time.perf_counter() - t0)
    steps.done(coverage=p.coverage)
    return res
