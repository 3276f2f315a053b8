"""One pipeline-planning case end to end: a model preset on a V100 cluster with K stages, planned by the
Rainbow-style DQN, the pre-trained agent or exact enumeration, and scored against the optimum. The
CLI (``archplace pipeline``) and ``bench/automap/pipeline.py`` both go through here.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from ...hardware.presets import V100, Cluster, v100_cluster
from ...simulators.pipeline import PipelineProfile, PipelineSetup, evaluate, profile_from_graph
from ..solvers.pipeline_exact import PipelinePlan, candidate_pivots, solve_exact

PRETRAINED_WEIGHTS = "pipeline_dqn_pretrained.npz"
RECOMPUTE_ABOVE_PARAMS = 1e9


def pretrained_weights_path() -> Path:
    """The pre-trained online-inference weights shipped with the package (bench/automap/pipeline.py
    --pretrain-steps writes them)."""
    return Path(str(resources.files("archplace.tune_configs").joinpath(PRETRAINED_WEIGHTS)))


def training_setup(model: str, params: float) -> PipelineSetup:
    """How each model trains (ours; the paper says nothing): T5s with Adafactor, their own optimizer
    (Raffel et al. 2020), the rest with Adam; activation recomputation above 1B parameters, as every
    framework does at that size."""
    from ...workloads.models import preset

    family = preset(model).family
    return PipelineSetup(optimizer="adafactor" if family == "t5" else "adam",
                         recompute=params > RECOMPUTE_ABOVE_PARAMS)


@functools.lru_cache(maxsize=8)
def model_profile(model: str) -> PipelineProfile:
    """The pipeline profile of a model preset at micro-batch 16 on V100."""
    from ...workloads.models import build_graph

    setup = PipelineSetup()
    g = build_graph(model, mbs=setup.micro_batch)
    fwd = ~g.nodes["is_backward"]
    params = float(g.nodes["weight_bytes"][fwd].sum()) / int(g.meta.get("bytes_per_element", 2))
    return profile_from_graph(g, V100, training_setup(model, params))


def cluster_of(name: str) -> Cluster:
    return v100_cluster(name)


def describe(prof: PipelineProfile, cluster: Cluster, cuts: np.ndarray | None) -> dict[str, Any]:
    """A plan as the user reads it: pivots, the ops and layers there, device cuts, L, memory."""
    if cuts is None:
        return {"cuts": None}
    cuts = np.asarray(cuts, dtype=np.int64)
    r = evaluate(prof, cluster, cuts[None, :])
    return {"cuts": cuts.tolist(), "cut_ops": [str(prof.op_names[c - 1]) for c in cuts],
            "cut_layers": [str(prof.op_layers[c - 1]) for c in cuts],
            "device_cuts": r.device_cuts[0].tolist(), "devices": r.devices[0].tolist(),
            "length_s": float(r.length_s[0]), "oom": bool(r.oom[0]),
            "memory_gib": (r.memory_bytes[0] / 2**30).round(2).tolist(),
            "stage_time_s": r.stage_time_s[0].tolist(), "transfer_s": r.transfer_s[0].tolist(),
            "allreduce_s": r.allreduce_s[0].tolist()}


def optimum(prof: PipelineProfile, cluster: Cluster, num_stages: int, radius: int = 3) -> PipelinePlan:
    return solve_exact(prof, cluster, candidate_pivots(prof, cluster, num_stages, radius))


def gap(length_s: float, opt_s: float) -> float:
    """Relative excess over the optimum (0.01 = 1% longer)."""
    return length_s / opt_s - 1.0
