"""Data-parallel gradient synchronisation of a 1F1B pipeline, and how much of it the schedule hides.

Each of the ``d`` data-parallel copies of a pipeline stage holds the stage's weights; after the step's
last backward of that stage, its gradients are AllReduced over the ``d`` copies: a ring,
``2(d−1)/d · gradient bytes / bandwidth`` (``simulators/collectives.py``, the one price every command
uses), the gradient in ``grad_reduce_dtype`` (bf16 by default, the parameters' dtype).
Weights tied between two stages (a GPT-2 embedding read again by
the LM head) also AllReduce their gradient between those two stages (Megatron's embedding group).

Under PipeDream-Flush (1F1B) a stage's sync starts when its last backward ends and can overlap only
what the pipeline still does after that: the last microbatch's backward in the stages before it. So

    window_k  = backward compute of the layers before stage k   (0 for the first stage)
    exposed_k = max(0, sync_k − window_k)
    F         = (ceil(B/d) + s − 1) · max-load + max_k exposed_k

The window counts compute only; transfers and waits in the real schedule only lengthen it, so
``exposed_k`` is an upper bound on what the schedule leaves uncovered (tests check this against an
event simulation of the schedule, ``simulators/pipeline_1f1b.py``).

``sync_model="paper"`` keeps the Phaze paper's eq. 18 in full: its AllReduce formula,
``4(d−1)/d · bytes / bandwidth`` (twice the ring: the paper's C++ folds the bytes per element in
twice), and only the first stage's sync, fully exposed, nothing for the other stages (a DP under it
prefers a first stage holding only the embedding, which hides most of the sync; use it only to
reproduce the paper's numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...simulators.collectives import (
    PHAZE_EQ18_FACTOR,
    RING_ALLREDUCE_FACTOR,
    grad_reduce_bytes_per_param,
)

SYNC_MODELS = ("exposed", "paper")
PARAM_BYTES = 2  # the placement's weight bytes are bf16 parameters (``workloads/layers.py``)


def grad_bytes_ratio(grad_reduce_dtype: str = "bf16") -> float:
    """Gradient bytes per weight byte: 1 for bf16 gradients of bf16 weights, 2 for fp32 ones (what the
    memory model stores and what the AllReduce moves)."""
    return grad_reduce_bytes_per_param(grad_reduce_dtype) / PARAM_BYTES


def sync_factor(sync_model: str = "exposed", grad_reduce_dtype: str = "bf16") -> float:
    """The ``c`` of ``c · (d−1)/d · weight bytes / bandwidth``: a ring's 2 times the gradient's bytes per
    weight byte, or the paper's eq. 18 (4) under ``sync_model="paper"``."""
    check_sync_model(sync_model)
    base = PHAZE_EQ18_FACTOR if sync_model == "paper" else RING_ALLREDUCE_FACTOR
    return base * grad_bytes_ratio(grad_reduce_dtype)


def allreduce_s(num_bytes, copies, bandwidth: float, factor: float = RING_ALLREDUCE_FACTOR):
    """The gradient AllReduce of ``num_bytes`` of weights over ``copies`` devices (0 for one copy):
    ``factor · (copies−1)/copies · num_bytes / bandwidth``, ``factor`` from :func:`sync_factor` (the default,
    2, is ``collectives.allreduce_s`` of bf16 gradients; written out here in the operation order the
    compiled DP, ``placement_kernel``, repeats bit for bit)."""
    copies = np.asarray(copies, dtype=float)
    return factor * (copies - 1.0) / copies * np.asarray(num_bytes, dtype=float) / bandwidth


def check_sync_model(sync_model: str) -> None:
    if sync_model not in SYNC_MODELS:
        raise ValueError(f"sync_model must be one of {list(SYNC_MODELS)}, got {sync_model!r}")


@dataclass(frozen=True)
class StageSync:
    """Per stage, first to last: the gradient sync, the time the schedule can hide it behind, and
    what stays exposed (seconds)."""

    sync_s: np.ndarray
    window_s: np.ndarray
    exposed_s: np.ndarray

    @property
    def exposed_total_s(self) -> float:
        return float(self.exposed_s.max()) if len(self.exposed_s) else 0.0


def stage_sync(weight_bytes, tied_bytes, backward_before_s, d: int, bandwidth: float,
               sync_model: str = "exposed", grad_reduce_dtype: str = "bf16") -> StageSync:
    """The sync of each stage of one pipeline (arrays over stages, first to last):
    ``weight_bytes`` the stage's weights, ``tied_bytes`` its weights tied with another stage,
    ``backward_before_s`` the backward compute of all layers before the stage."""
    c = sync_factor(sync_model, grad_reduce_dtype)
    w = np.asarray(weight_bytes, dtype=float)
    s = len(w)
    tied = np.asarray(tied_bytes, dtype=float) if s > 1 else np.zeros(s)
    sync = allreduce_s(w, d, bandwidth, c) + allreduce_s(tied, 2, bandwidth, c)
    window = np.asarray(backward_before_s, dtype=float).copy()
    window[:1] = 0.0
    if sync_model == "paper":  # eq. 18: the first stage's data-parallel sync only
        exposed = np.zeros(s)
        exposed[:1] = allreduce_s(w[:1], d, bandwidth, c)
    else:
        exposed = np.maximum(0.0, sync - window)
    return StageSync(sync, window, exposed)
