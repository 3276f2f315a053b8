"""Pipeline cuts of a model on V100 servers (``archplace pipeline``, Auto-MAP): the exact optimum over
every contiguous cut set by dynamic programming (the default), or, over the pruned candidate pivots, the
Rainbow-style DQN or the pre-trained agent (both on Ray) or exact enumeration, each scored against the
pruned optimum. ``gpu`` puts the same number of 8-GPU servers of another GPU preset on its NVLink and
InfiniBand; ``op_model`` / ``dtype`` / ``profile`` choose how each op is timed (``simulators/gpu_ops.py``).
Without them the answer is Auto-MAP's V100 roofline, as it always was."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    InvalidRequest,
    ProgressFn,
    Request,
    Result,
    Steps,
    check_choice,
    check_gpu,
    check_int,
    check_model,
    check_optional_str,
    invalid,
    is_int,
    require_ray,
)

PIPELINE_ALGOS = ("dp", "rainbow", "pretrained", "exact")
CLUSTERS = ("A", "B", "C")      # 2, 3 or 4 servers of 8 V100
OP_MODELS = ("roofline", "calibrated", "profiled")  # simulators/gpu_ops.OP_MODELS (this module stays light)


@dataclass(frozen=True)
class PipelineRequest(Request):
    model: str                      # preset name, e.g. bert-48, t5-3b
    cluster: str = "C"              # A, B or C: 2, 3 or 4 servers of 8 V100
    stages: int | None = None       # K (None: the number of servers)
    algo: str = "dp"                # dp (unpruned), rainbow, pretrained (both need a running Ray), exact
    budget: int | None = None       # rainbow: cost-model evaluations, simulator calls + feature rows
    #                                 (None: 1300 plans' worth, pipeline_dqn.default_eval_budget)
    seed: int = 0
    finetune: int = 0               # pretrained: fine-tuning steps (0: zero-shot)
    radius: int = 3                 # rainbow, pretrained, exact: pruning radius (devices) around server
    #                                 boundaries (dp ranges over every cut set)
    pretrained: str | None = None   # pretrained: weights .npz (None: the package's)
    env_runners: int = 0            # rainbow: remote EnvRunner actors that sample (0: in this process)
    learners: int = 0               # rainbow: remote Learner actors (0: in this process)
    gpu: str | None = None          # a GPU preset (hardware/gpus.py); None: Auto-MAP's V100 cluster
    op_model: str | None = None     # roofline | calibrated | profiled (None: the GPU's default)
    dtype: str | None = None        # bf16 | fp16 | tf32 | fp32 of the GEMMs (None: fp16, Auto-MAP's)
    profile: str | None = None      # an op profile JSON (archplace profile); implies op_model profiled
    attention: str = "eager"        # eager (as captured) or sdpa (fused, workloads/attention_fusion.py)

    @property
    def needs_ray(self) -> bool:
        return self.algo in ("rainbow", "pretrained")

    @property
    def num_stages(self) -> int:
        """K: ``stages``, or one stage per server."""
        from ..hardware.presets import v100_cluster

        return self.stages if self.stages is not None else v100_cluster(self.cluster).num_servers

    @property
    def custom_ops(self) -> bool:
        """Whether a GPU or op-model flag was given (else the V100 roofline of Auto-MAP, unchanged)."""
        return any(x is not None for x in (self.gpu, self.op_model, self.dtype, self.profile)) or \
            self.attention != "eager"

    def weights(self) -> str:
        """The pre-trained agent's weights file."""
        from ..algorithms.rl.pipeline_plan import pretrained_weights_path

        return self.pretrained or str(pretrained_weights_path())

    def validate(self) -> None:
        check_model(self.model, files=False)
        check_choice("cluster", self.cluster, CLUSTERS)
        k = self.num_stages
        if not (is_int(k) and 2 <= k <= 8):
            raise invalid("stages", f"must be in [2, 8], got {k!r}")
        check_choice("algo", self.algo, PIPELINE_ALGOS)
        if self.budget is not None and not (is_int(self.budget) and self.budget >= 1):
            raise invalid("budget", f"must be a positive number of cost-model evaluations, "
                                    f"got {self.budget!r}")
        check_int("seed", self.seed, low=0)
        if not (is_int(self.finetune) and self.finetune >= 0):
            raise invalid("finetune", f"must be >= 0 environment steps, got {self.finetune!r}")
        if not (is_int(self.radius) and self.radius >= 0):
            raise invalid("radius", f"must be >= 0 devices, got {self.radius!r}")
        check_optional_str("pretrained", self.pretrained)
        check_int("env_runners", self.env_runners, low=0)
        check_int("learners", self.learners, low=0)
        # a pipeline server is 8 GPUs on NVLink: the P100 PCIe has none
        check_gpu_fields(self.gpu, self.op_model, self.dtype, self.profile, nvlink=True)
        check_choice("attention", self.attention, ("eager", "sdpa"))
        if self.attention == "sdpa" and self.profile is not None:
            raise InvalidRequest("{profile} times the ops of the captured (eager) graph; {attention} sdpa "
                                 "fuses ops it has no time for", "profile", "attention")
        if self.algo != "rainbow" and (self.env_runners or self.learners):
            raise InvalidRequest("{env_runners} and {learners} apply to {algo} rainbow, not " + self.algo,
                                 "env_runners", "learners", "algo")
        if self.algo == "pretrained" and not os.path.exists(self.weights()):
            raise invalid("pretrained", f"{self.weights()} does not exist "
                                        "(bench/automap/pipeline.py --pretrain-steps N writes it)")


def check_gpu_fields(gpu, op_model, dtype, profile, gpu_field: str = "gpu", gpus=None, nvlink: bool = False
                     ) -> None:
    """The GPU (preset or .json file), op model, dtype and profile fields shared by ``pipeline`` and
    ``place-ops``; ``gpus`` restricts the presets (a file is checked by its fields)."""
    from ..hardware.gpus import DTYPES, GPUS
    if gpu is not None:
        presets = gpus or sorted(n for n, g in GPUS.items() if g.nvlink_bytes_per_s > 0 or not nvlink)
        check_gpu(gpu_field, gpu, presets, nvlink=nvlink)
    if op_model is not None:
        check_choice("op_model", op_model, OP_MODELS)
    if dtype is not None:
        check_choice("dtype", dtype, DTYPES)
    check_optional_str("profile", profile)
    if profile is not None and op_model not in (None, "profiled"):
        raise InvalidRequest("{profile} implies {op_model} profiled, got " + repr(op_model), "profile",
                             "op_model")
    if op_model == "profiled" and profile is None:
        raise InvalidRequest("{op_model} profiled needs {profile} FILE", "op_model", "profile")
    if profile is not None and not os.path.exists(profile):
        raise invalid("profile", f"{profile} does not exist")


def pipeline_model(req: PipelineRequest):
    """(cluster, pipeline profile, op times) for a request with GPU / op-model fields."""
    from ..algorithms.rl.pipeline_plan import training_setup
    from ..hardware.gpus import gpu_spec
    from ..hardware.presets import GPU, V100, gpu_servers, v100_cluster
    from ..simulators.gpu_ops import gpu_op_times, load_profile
    from ..simulators.gpu_step import sram_bytes
    from ..simulators.pipeline import PipelineSetup, profile_from_graph
    from ..workloads.backward import with_attention
    from ..workloads.models import build_graph

    dtype = req.dtype or "fp16"
    base = v100_cluster(req.cluster)
    if req.gpu is None:  # Auto-MAP's V100 cluster (25 Gbps between servers), another op model
        spec = V100.spec
        cl = dataclasses.replace(base, device=GPU.from_spec(spec, dtype, V100.name))
    else:
        spec = gpu_spec(req.gpu)
        cl = gpu_servers(req.gpu, base.num_servers, dtype)
    g = with_attention(build_graph(req.model, mbs=PipelineSetup().micro_batch, training=False), req.attention,
                       sram_bytes=sram_bytes(spec))
    fwd = ~g.nodes["is_backward"]
    params = float(g.nodes["weight_bytes"][fwd].sum()) / int(g.meta.get("bytes_per_element", 2))
    times = gpu_op_times(g, spec, dtype=dtype, op_model=req.op_model,
                         profile=load_profile(req.profile) if req.profile else None)
    return cl, profile_from_graph(g, cl.device, training_setup(req.model, params), times.time_s), times


@dataclass
class PipelineResult(Result):
    model: str
    cluster: str
    gpus: int
    stages: int
    algo: str
    forward_ops: int
    optimizer: str
    recompute: bool
    optimum: dict[str, Any]         # the exact optimum's plan, with evaluated and wall_s (dp: over every
    #                                 contiguous cut set, evaluated = DP states; else: over the pruned
    #                                 candidates, evaluated = plans enumerated)
    plan: dict[str, Any]            # the chosen plan: cuts, cut_ops, cut_layers, device_cuts, devices,
    #                                 length_s, oom, memory_gib, stage_time_s, transfer_s, allreduce_s
    details: dict[str, Any] = field(default_factory=dict)  # per algo: env_steps, greedy, pretrained, ...
    optimal_length_s: float = 0.0
    feasible: bool = False
    gap: float | None = None        # relative excess of length_s over the optimum
    wall_s: float = 0.0
    op_model: dict[str, Any] | None = None  # OpTimes.to_dict() when a GPU / op-model field was given
    attention: str | None = None    # "sdpa" when attention ran fused (absent: eager, as captured)

    @property
    def cuts(self) -> list[int] | None:
        return self.plan.get("cuts")

    @property
    def length_s(self) -> float:
        """L: seconds per training iteration of the chosen plan."""
        return self.plan["length_s"]

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        head = {k: d.pop(k) for k in ("model", "cluster", "gpus", "stages", "algo", "forward_ops",
                                      "optimizer", "recompute", "optimum")}
        plan, details = d.pop("plan"), d.pop("details")
        for key in ("op_model", "attention"):
            if d.get(key) is None:
                d.pop(key, None)
        return {**head, **plan, **details, **d}


def pipeline(req: PipelineRequest, *, progress: ProgressFn | None = None,
             cancel: threading.Event | None = None) -> PipelineResult:
    """Pipeline cuts of a model on V100 servers. Stages: ``profile``, ``optimum``, ``search`` (rainbow and
    pretrained), ``done``. The DQN algorithms raise RuntimeError unless Ray is running. ``dp`` returns the
    optimum over every contiguous cut set (no pruning): its plan is its optimum, gap 0."""
    from ..algorithms.rl.pipeline_plan import cluster_of, describe, gap, model_profile, optimum

    req.validate()
    if req.needs_ray:
        require_ray(f"pipeline algo {req.algo!r}")
    steps = Steps("pipeline", progress, cancel)
    k = req.num_stages
    t0 = time.perf_counter()
    times = None
    if req.custom_ops:
        cl, prof, times = pipeline_model(req)
    else:
        cl, prof = cluster_of(req.cluster), model_profile(req.model)
    steps.stage("profile", forward_ops=prof.num_ops)
    if req.algo == "dp":
        from ..algorithms.solvers.pipeline_dp import solve_dp

        opt = solve_dp(prof, cl, k)
    else:
        opt = optimum(prof, cl, k, req.radius)
    steps.stage("optimum", length_s=opt.length_s, evaluated=opt.evaluated)
    space = {"space": "all contiguous cut sets (unpruned)" if req.algo == "dp"
             else f"pruned candidates (radius {req.radius})"}
    # Every algo reports what it spent in cost-model evaluations: ``simulator_calls`` counts
    # complete plans scored by the simulator plus, for the agents, the feature rows (one per open pivot
    # per step, the lookahead estimate); dp_states are the DP's per-stage costs, reported apart.
    if req.algo == "dp":
        cuts = opt.cuts
        space.update(subproblems=opt.subproblems, boxes=opt.boxes, proven_optimal=opt.optimal)
        details = {"dp_wall_s": opt.wall_s, "dp_states": opt.evaluated,
                   "simulator_calls": opt.plan_evaluations}
    elif req.algo == "exact":
        cuts, details = opt.cuts, {"evaluated": opt.evaluated, "simulator_calls": opt.evaluated + 1}
    else:
        from ..algorithms.rl.pipeline_dqn import (
            default_search_budget,
            dqn_search,
            load_state,
            pretrained_plan,
        )

        if req.algo == "rainbow":
            budget = req.budget or default_search_budget(prof, cl, k, req.radius)
            run = dqn_search(prof, cl, k, budget, seed=req.seed, radius=req.radius,
                             num_env_runners=req.env_runners, num_learners=req.learners)
            cuts = run.best_cuts
            details = {"env_steps": run.env_steps, "plans_evaluated": run.plans,
                       "budget": budget, "simulator_calls": run.simulator_calls,
                       "env_step_calls": run.env_step_calls, "feature_calls": run.feature_calls,
                       "greedy_calls": run.greedy_calls, "budget_exhausted": run.budget_exhausted,
                       "stopped": run.stopped,
                       "best_seen_length_s": None if run.best_seen_oom else run.best_seen_length_s,
                       "env_runners": req.env_runners, "env_runner_nodes": run.env_runner_nodes,
                       "greedy": describe(prof, cl, run.greedy_cuts)}
        else:
            state, meta = load_state(req.weights())
            zs = pretrained_plan(state, prof, cl, k, finetune_steps=req.finetune, seed=req.seed)
            cuts = zs.cuts
            details = {"pretrained": req.weights(), "pretrained_steps": meta.get("steps"),
                       "finetune_steps": zs.finetune_steps, "coarse_cuts": zs.coarse_cuts.tolist(),
                       "simulator_calls": zs.simulator_calls, "env_step_calls": zs.env_step_calls,
                       "feature_calls": zs.feature_calls}
        steps.stage("search", cuts=cuts)
    plan = describe(prof, cl, cuts)
    best = describe(prof, cl, opt.cuts)
    res = PipelineResult(
        model=req.model, cluster=req.cluster, gpus=cl.num_devices, stages=k, algo=req.algo,
        forward_ops=prof.num_ops, optimizer=prof.setup.optimizer, recompute=prof.setup.recompute,
        optimum={**best, "evaluated": opt.evaluated, "wall_s": opt.wall_s, **space},
        plan=plan, details=details, optimal_length_s=best["length_s"],
        feasible=not plan["oom"], gap=gap(plan["length_s"], opt.length_s) if not opt.oom else None,
        wall_s=time.perf_counter() - t0, op_model=times.to_dict() if times is not None else None,
        attention="sdpa" if req.attention == "sdpa" else None)
    steps.done(length_s=res.length_s, gap=res.gap)
    return res
