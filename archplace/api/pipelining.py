"""Pipeline cuts of a model on V100 servers (``archplace pipeline``, Auto-MAP): the exact optimum over
every contiguous cut set by dynamic programming (the default), or, over the pruned candidate pivots, the
Rainbow-style DQN or the pre-trained agent (both on Ray) or exact enumeration, each scored against the
pruned optimum."""

from __future__ import annotations

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
    check_int,
    check_model,
    check_optional_str,
    invalid,
    is_int,
    require_ray,
)

PIPELINE_ALGOS = ("dp", "rainbow", "pretrained", "exact")
CLUSTERS = ("A", "B", "C")      # 2, 3 or 4 servers of 8 V100


@dataclass(frozen=True)
class PipelineRequest(Request):
    model: str                      # preset name, e.g. bert-48, t5-3b
    cluster: str = "C"              # A, B or C: 2, 3 or 4 servers of 8 V100
    stages: int | None = None       # K (None: the number of servers)
    algo: str = "dp"                # dp (unpruned), rainbow, pretrained (both need a running Ray), exact
    budget: int | None = None       # rainbow: environment steps (None: 1300 per cut)
    seed: int = 0
    finetune: int = 0               # pretrained: fine-tuning steps (0: zero-shot)
    radius: int = 3                 # rainbow, pretrained, exact: pruning radius (devices) around server
    #                                 boundaries (dp ranges over every cut set)
    pretrained: str | None = None   # pretrained: weights .npz (None: the package's)
    env_runners: int = 0            # rainbow: remote EnvRunner actors that sample (0: in this process)
    learners: int = 0               # rainbow: remote Learner actors (0: in this process)

    @property
    def needs_ray(self) -> bool:
        return self.algo in ("rainbow", "pretrained")

    @property
    def num_stages(self) -> int:
        """K: ``stages``, or one stage per server."""
        from ..hardware.presets import v100_cluster

        return self.stages if self.stages is not None else v100_cluster(self.cluster).num_servers

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
            raise invalid("budget", f"must be a positive number of environment steps, got {self.budget!r}")
        check_int("seed", self.seed, low=0)
        if not (is_int(self.finetune) and self.finetune >= 0):
            raise invalid("finetune", f"must be >= 0 environment steps, got {self.finetune!r}")
        if not (is_int(self.radius) and self.radius >= 0):
            raise invalid("radius", f"must be >= 0 devices, got {self.radius!r}")
        check_optional_str("pretrained", self.pretrained)
        check_int("env_runners", self.env_runners, low=0)
        check_int("learners", self.learners, low=0)
        if self.algo != "rainbow" and (self.env_runners or self.learners):
            raise InvalidRequest("{env_runners} and {learners} apply to {algo} rainbow, not " + self.algo,
                                 "env_runners", "learners", "algo")
        if self.algo == "pretrained" and not os.path.exists(self.weights()):
            raise invalid("pretrained", f"{self.weights()} does not exist "
                                        "(bench/pipeline.py --pretrain-steps N writes it)")


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
    cl = cluster_of(req.cluster)
    k = req.num_stages
    t0 = time.perf_counter()
    prof = model_profile(req.model)
    steps.stage("profile", forward_ops=prof.num_ops)
    if req.algo == "dp":
        from ..algorithms.solvers.pipeline_dp import solve_dp

        opt = solve_dp(prof, cl, k)
    else:
        opt = optimum(prof, cl, k, req.radius)
    steps.stage("optimum", length_s=opt.length_s, evaluated=opt.evaluated)
    space = {"space": "all contiguous cut sets (unpruned)" if req.algo == "dp"
             else f"pruned candidates (radius {req.radius})"}
    if req.algo == "dp":
        cuts = opt.cuts
        space.update(subproblems=opt.subproblems, boxes=opt.boxes, proven_optimal=opt.optimal)
        details = {"dp_wall_s": opt.wall_s, "dp_states": opt.evaluated}
    elif req.algo == "exact":
        cuts, details = opt.cuts, {"evaluated": opt.evaluated}
    else:
        from ..algorithms.rl.pipeline_dqn import default_budget, dqn_search, load_state, pretrained_plan

        if req.algo == "rainbow":
            run = dqn_search(prof, cl, k, req.budget or default_budget(k), seed=req.seed, radius=req.radius,
                             num_env_runners=req.env_runners, num_learners=req.learners)
            cuts = run.best_cuts
            details = {"env_steps": run.env_steps, "plans_evaluated": run.plans,
                       "env_runners": req.env_runners, "env_runner_nodes": run.env_runner_nodes,
                       "greedy": describe(prof, cl, run.greedy_cuts)}
        else:
            state, meta = load_state(req.weights())
            zs = pretrained_plan(state, prof, cl, k, finetune_steps=req.finetune, seed=req.seed)
            cuts = zs.cuts
            details = {"pretrained": req.weights(), "pretrained_steps": meta.get("steps"),
                       "finetune_steps": zs.finetune_steps, "coarse_cuts": zs.coarse_cuts.tolist()}
        steps.stage("search", cuts=cuts)
    plan = describe(prof, cl, cuts)
    best = describe(prof, cl, opt.cuts)
    res = PipelineResult(
        model=req.model, cluster=req.cluster, gpus=cl.num_devices, stages=k, algo=req.algo,
        forward_ops=prof.num_ops, optimizer=prof.setup.optimizer, recompute=prof.setup.recompute,
        optimum={**best, "evaluated": opt.evaluated, "wall_s": opt.wall_s, **space},
        plan=plan, details=details, optimal_length_s=best["length_s"],
        feasible=not plan["oom"], gap=gap(plan["length_s"], opt.length_s) if not opt.oom else None,
        wall_s=time.perf_counter() - t0)
    steps.done(length_s=res.length_s, gap=res.gap)
    return res
