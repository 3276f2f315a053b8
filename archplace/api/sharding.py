"""Operator sharding (OPP) and data-parallel dimensions (ADP) of a model (``archplace shard``, Auto-MAP).

The model's tensor-level graph (``workloads.sharding_models``: T5, GPT-2, BERT, and
``workloads.sharding_families``: Llama, OPT, from a preset or a transformers config file, or the in-tree
VGG-19) goes through the sharding-propagation engine; the
search picks, per trainable variable (OPP) or per data input (ADP), one dimension to split over all
``devices`` or none, minimising the predicted step time (``algorithms/search/sharding_cost.py``)
under per-device memory. OPP results are compared with Megatron-LM's known sharding, and the
variables where they differ are listed.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    ProgressFn,
    Request,
    Result,
    Steps,
    check_bool,
    check_choice,
    check_gpu,
    check_int,
    check_positive_number,
    invalid,
)

SHARD_ALGOS = ("ilp", "greedy", "megatron", "random", "exhaustive", "dqn")
SHARD_REWARDS = ("paper", "cost")
DQN_BUDGET = 20_000  # propagation calls of a DQN search without ``budget``
SHARD_FAMILIES = ("t5", "gpt2", "bert", "llama", "opt", "vgg19")
SHARD_DTYPES = ("bf16", "fp16", "tf32", "fp32")


@dataclass(frozen=True)
class ShardRequest(Request):
    model: str  # a preset of family t5, gpt2, bert, llama or opt, "vgg19", or hf:PATH (a config)
    devices: int = 8  # T: every split dimension is split over all of them
    algo: str = "ilp"  # ilp | greedy | megatron (OPP only) | random | exhaustive (ADP only)
    data_parallel: bool = False  # ADP: decide the data inputs (variables replicated) instead of OPP
    seq: int | None = None  # tokens (None: the preset's sequence length; vgg19: image side 224)
    batch: int = 8  # examples per step (every device sees the whole batch under OPP)
    gpu: str = "v100-sxm2"  # a GPU preset (hardware/gpus.py): peaks, HBM, NVLink, memory
    dtype: str = "fp16"  # GEMM dtype (Auto-MAP's mixed precision)
    budget: int | None = None  # random: propagation calls (None: as many as greedy spends); dqn: propagation
    #                            calls (None: DQN_BUDGET)
    reward: str = "paper"  # dqn: paper (+0.4 split, +0.1 replicate, -1 conflict) or cost (-Δ step time)
    max_deterministic_s: float = 10.0  # ilp: CP-SAT deterministic-time budget
    seed: int = 0

    @property
    def needs_ray(self) -> bool:
        return self.algo == "dqn"

    def validate(self) -> None:
        if not (isinstance(self.model, str) and self.model):
            raise invalid("model", f"must be a preset name, 'vgg19' or hf:PATH, got {self.model!r}")
        check_int("devices", self.devices, low=1)
        check_choice("algo", self.algo, SHARD_ALGOS)
        check_bool("data_parallel", self.data_parallel)
        check_int("seq", self.seq, low=1, optional=True)
        check_int("batch", self.batch, low=1)
        from ..hardware.gpus import GPUS

        check_gpu("gpu", self.gpu, sorted(GPUS))
        check_choice("dtype", self.dtype, SHARD_DTYPES)
        check_int("budget", self.budget, low=1, optional=True)
        check_positive_number("max_deterministic_s", self.max_deterministic_s)
        check_int("seed", self.seed, low=0)
        check_choice("reward", self.reward, SHARD_REWARDS)
        if self.algo == "megatron" and self.data_parallel:
            raise invalid(
                "algo",
                "megatron is an operator sharding; with data_parallel use ilp, exhaustive, greedy or random",
            )
        if self.algo == "exhaustive" and not self.data_parallel:
            raise invalid("algo", "exhaustive enumerates data inputs (data_parallel); for OPP use ilp")


def shard_graph(model: str, seq: int | None, batch: int):
    """The tensor-level graph of ``model`` (see the module docstring) and its family."""
    from ..workloads import sharding_models as sm

    if model == "vgg19":
        return sm.vgg19(batch=batch, image=seq or 224), "vgg19"
    if model.startswith("hf:"):
        from pathlib import Path

        from ..workloads.hf_config import read_config_file

        cfg = read_config_file(Path(model[3:].split("?")[0]))
        family = cfg.get("model_type")
        default_seq = 512
    else:
        from ..workloads.models import preset

        p = preset(model)
        cfg, family, default_seq = dict(p.config), p.family, p.seq_len
    seq = seq or default_seq
    if family == "t5":
        return sm.t5(cfg, seq=seq, batch=batch), family
    if family == "gpt2":
        return sm.gpt(
            layers=int(cfg["n_layer"]),
            hidden=int(cfg["n_embd"]),
            heads=int(cfg["n_head"]),
            ffn=cfg.get("n_inner"),
            vocab=int(cfg.get("vocab_size", 50257)),
            seq=seq,
            batch=batch,
            positions=int(cfg.get("n_positions", seq)),
        ), family
    if family == "bert":
        return sm.bert(cfg, seq=seq, batch=batch), family
    if family in ("llama", "opt"):
        from ..workloads import sharding_families as sf

        return getattr(sf, family)(cfg, seq=seq, batch=batch), family
    raise ValueError(
        f"model {model!r} is of family {family!r}; archplace shard builds {list(SHARD_FAMILIES)}"
    )


def table3(strategy: dict[str, int]) -> dict[str, Any]:
    """Auto-MAP's Table 3 form: the strategy with block numbers folded (``block.*``), each pattern
    mapped to its split dim (-1 replicated), or to the list of dims where the blocks disagree."""
    out: dict[str, Any] = {}
    for name, d in strategy.items():
        key = re.sub(r"(block|layers|layer|h)\.\d+/", r"\1.*/", name) if "/" in name else name
        out.setdefault(key, [])
        if d not in out[key]:
            out[key].append(d)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


@dataclass
class ShardResult(Result):
    model: str
    family: str
    mode: str  # opp | adp
    algo: str
    devices: int
    gpu: str
    dtype: str
    seq: int
    batch: int
    graph: dict[str, int]  # tensors, ops, parameters, decision variables, their dims, classes
    status: str
    strategy: dict[str, int]  # per decision variable: the dim split over all devices, -1 replicated
    table3: dict[str, Any]  # the same with block numbers folded (Auto-MAP Table 3 form)
    partitioned_variables: int
    step_s: float  # predicted training-step time: compute + communication, no overlap
    compute_s: float
    comm_s: float
    memory_bytes: int  # per device: parameters, gradients, optimizer state, activations
    fits: bool
    collectives: dict[str, Any]  # "phase kind" -> {count, bytes (per device, summed)}
    propagation_calls: int
    search_wall_s: float  # the search's wall clock (not part of the answer)
    notes: list[str] = field(default_factory=list)
    reference: dict[str, Any] | None = None  # OPP: Megatron's plan, its step time and where ours differs
    reason: str | None = None  # why the plan is infeasible or does not fit (None when it fits)
    wall_s: float = 0.0


def shard(
    req: ShardRequest, *, progress: ProgressFn | None = None, cancel: threading.Event | None = None
) -> ShardResult:
    """Stages: ``graph``, ``search``, ``reference`` (OPP), ``done``."""
    from ..algorithms.search import sharding_search as ss
    from ..algorithms.search.sharding_cost import ShardCost
    from ..hardware.gpus import gpu_spec

    req.validate()
    steps = Steps("shard", progress, cancel)
    t0 = time.perf_counter()
    g, family = shard_graph(req.model, req.seq, req.batch)
    mode = "adp" if req.data_parallel else "opp"
    if req.algo == "megatron" and family == "vgg19":
        raise invalid(
            "algo", "megatron: VGG-19 has no Megatron sharding (its meta holds Auto-MAP's Table 4; use ilp)"
        )
    pb = ss.ShardProblem(g, req.devices, mode, ShardCost(gpu_spec(req.gpu), req.dtype))
    steps.stage("graph", tensors=len(g.tensors), ops=len(g.ops))
    if req.algo == "ilp":
        res = ss.solve_exact(pb, max_deterministic_s=req.max_deterministic_s, seed=req.seed)
    elif req.algo == "greedy":
        res = ss.greedy(pb)
    elif req.algo == "megatron":
        res = ss.megatron(pb)
    elif req.algo == "exhaustive":
        res = ss.adp_exhaustive(pb)
    elif req.algo == "dqn":
        from ..algorithms.rl.sharding_dqn import dqn_search
        from ._common import require_ray

        require_ray("shard algo 'dqn'")
        budget = req.budget or DQN_BUDGET
        run = dqn_search(pb, budget, reward=req.reward, seed=req.seed)
        if run.best is None:
            raise ValueError(f"dqn: no episode completed in {budget} propagation calls; raise budget")
        res = run.best
        res.propagation_calls = run.propagation_calls
        res.notes = [
            *run.notes,
            f"{run.episodes} episodes; best-seen plan {run.best_partitioned_dims} dims split "
            f"(stage 1: {run.stage1_partitioned_dims}); greedy policy: "
            + (
                f"{run.greedy.partitioned} variables split, {run.greedy.cost.step_s:.6f} s"
                if run.greedy
                else "conflicts"
            ),
        ]
    else:
        budget = req.budget or ss.greedy(ss.ShardProblem(g, req.devices, mode, pb.cost)).propagation_calls
        res = ss.random_search(pb, budget, seed=req.seed)
    steps.stage("search", step_s=res.cost.step_s)
    reference = None
    if mode == "opp" and req.algo != "megatron" and g.meta.get("megatron") is not None and family != "vgg19":
        meg = ss.megatron(ss.ShardProblem(g, req.devices, mode, pb.cost))
        diff = ss.differences(res, meg) if res.status != "infeasible" else None
        reference = {
            "algo": "megatron",
            "step_s": meg.cost.step_s,
            "memory_bytes": meg.cost.memory_bytes,
            "partitioned_variables": meg.partitioned,
            "dropped": len(meg.notes),
            "differs": None if diff is None else len(diff),
            "differences": [] if diff is None else diff[:50],
            "speedup": meg.cost.step_s / res.cost.step_s if diff is not None and res.cost.step_s else None,
        }
        steps.stage("reference", step_s=meg.cost.step_s)
    dims = sum(len(g.tensors[t].shape) for t in pb.variables)
    reason = res.reason
    if reason is None and not res.cost.fits:
        reason = (
            f"the {req.algo} plan needs {res.cost.memory_bytes} B per device, more than {req.gpu}'s "
            f"{pb.cost.gpu.memory_bytes} B"
        )
    out = ShardResult(
        model=req.model,
        family=family,
        mode=mode,
        algo=req.algo,
        devices=req.devices,
        gpu=req.gpu,
        dtype=req.dtype,
        seq=int(g.meta.get("seq") or g.meta.get("image") or 0),
        batch=req.batch,
        graph={
            "tensors": len(g.tensors),
            "ops": len(g.ops),
            "parameters": g.num_params(),
            "decision_variables": len(pb.variables),
            "decision_dims": dims,
            "classes": g.classes.num,
        },
        status=res.status,
        strategy=res.choice,
        table3=table3(res.choice),
        partitioned_variables=res.partitioned,
        step_s=res.cost.step_s,
        compute_s=res.cost.compute_s,
        comm_s=res.cost.comm_s,
        memory_bytes=res.cost.memory_bytes,
        fits=res.cost.fits,
        collectives=res.cost.to_dict()["collectives"],
        propagation_calls=res.propagation_calls,
        search_wall_s=res.search_s,
        notes=res.notes,
        reference=reference,
        reason=reason,
        wall_s=time.perf_counter() - t0,
    )
    steps.done(step_s=out.step_s)
    return out
