"""The per-layer op times ``archplace plan`` prices its configurations with: one micro-batch of a model
on one GPU of its tensor-parallel group, per (tp, micro-batch, tokens per rank, attention).

Why a module of its own: ``api.plan`` and the GPU-cluster co-design trial (``platform/
gpu_cluster_trial.py``, ``planner: plan``) time layers the same way; each asks for a callable and hands it
to ``algorithms.search.plan_search.search``, which never captures a model itself.

The graph is the preset's captured forward graph (``workloads.models.build_graph``, read from the capture
cache) sliced for tensor parallelism, cut back to its captured blocks (``workloads.stack_truncate``: every
copied block takes the times of the captured block it repeats, the same ops), with fused or eager attention
(``workloads.backward.with_attention``), timed by the op model (``simulators.gpu_ops``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ..hardware.gpus import GPUSpec
from .parallel_step import LayerTimes, layer_times

PER_LAYER = ("fwd_s", "bwd_s", "attn_fwd_s", "attn_bwd_s", "replicated_fwd_s", "replicated_bwd_s",
             "col_wgrad_s", "fwd_collective_bytes", "bwd_collective_bytes", "params")


def model_layer_costs(model: str, spec: GPUSpec, op_model: str = "calibrated",
                      dtype: str = "bf16") -> Callable[[int, int, int, str], LayerTimes]:
    """``costs(tp, mbs, seq, attention) -> LayerTimes`` of ``model`` on GPU ``spec``, every layer of the
    full-depth model in order."""
    from ..workloads.backward import with_attention
    from ..workloads.models import build_graph
    from ..workloads.stack_truncate import truncate_to_captured
    from .gpu_ops import gpu_op_times
    from .gpu_step import sram_bytes

    sram = sram_bytes(spec)

    def costs(tp: int, mbs: int, seq: int, attention: str) -> LayerTimes:
        full = build_graph(model, seq=seq, mbs=mbs, tmp=tp, training=False)
        fwd, rep = truncate_to_captured(full)
        g = with_attention(fwd, attention, sram_bytes=sram)
        lt = layer_times(g, gpu_op_times(g, spec, dtype=dtype, op_model=op_model).time_s)
        names = list(full.meta["layers"])
        idx = np.array([lt.names.index(rep[n]) for n in names])
        return replace(lt, names=tuple(names), **{f: getattr(lt, f)[idx] for f in PER_LAYER})

    return costs
