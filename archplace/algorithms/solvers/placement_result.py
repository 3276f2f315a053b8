"""What the placement DP (``placement.py``) returns: a placement's stages, time and memory, and its
plain-JSON summary (every ``place``/``search`` result carries it)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

INF = math.inf


@dataclass
class Stage:
    first: int
    last: int  # inclusive
    devices: int
    load_s: float
    memory_bytes: float
    layers: tuple[str, ...] = ()
    sync_s: float = 0.0     # its data-parallel (and tied-weight) gradient AllReduce
    window_s: float = 0.0   # backward compute after its last backward that the sync can overlap
    exposed_s: float = 0.0  # what the placement's time charges for it
    weight_bytes: float = 0.0  # its weights on one device (bf16): the AllReduce moves their gradients


@dataclass
class Placement:
    feasible: bool
    time_per_batch_s: float = INF
    throughput: float = 0.0  # samples/s
    p: int = 0
    d: int = 0
    t: int = 0
    microbatch: int = 0
    recompute: bool = False
    hbm_bytes: float = 0.0
    max_load_s: float = INF
    stages: list[Stage] = field(default_factory=list)
    reason: str = ""
    sync_model: str = "exposed"
    exposed_sync_s: float = 0.0  # max over stages of exposed_s, part of time_per_batch_s
    grad_reduce_dtype: str = "bf16"

    def summary(self) -> dict[str, Any]:
        """Plain JSON: times that do not exist (an infeasible placement) are ``None``, with ``reason``."""
        def num(v: float) -> float | None:
            return v if math.isfinite(v) else None

        out = {"feasible": self.feasible, "time_per_batch_s": num(self.time_per_batch_s),
               "throughput": self.throughput, "p": self.p, "d": self.d, "t": self.t,
               "microbatch": self.microbatch, "recompute": self.recompute,
               "hbm_gb": self.hbm_bytes / 2**30, "max_load_s": num(self.max_load_s),
               "sync_model": self.sync_model, "exposed_sync_s": self.exposed_sync_s,
               "grad_reduce_dtype": self.grad_reduce_dtype,
               "allreduce": ("Phaze eq. 18: 4(d-1)/d * bytes / bw" if self.sync_model == "paper"
                             else "ring: 2(d-1)/d * bytes / bw"),
               "stages": [{"first": s.first, "last": s.last, "devices": s.devices, "load_s": s.load_s,
                           "memory_bytes": s.memory_bytes, "sync_s": s.sync_s, "window_s": s.window_s,
                           "exposed_s": s.exposed_s, "weight_bytes": s.weight_bytes,
                           "layers": [s.layers[0], s.layers[-1]] if s.layers else []}
                          for s in self.stages]}
        if not self.feasible:
            out["reason"] = self.reason
        return out
