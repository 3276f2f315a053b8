"""A model's operators over the chiplets of a multi-chip module (``archplace partition``, MCM paper):
the greedy heuristic, random search, simulated annealing, or PPO with repaired actions (on Ray), each
optionally polished by CP-SAT large-neighbourhood search (``polish`` seconds, ``mcm_lns``)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ._common import (
    DetailsResult,
    InvalidRequest,
    ProgressFn,
    Request,
    Steps,
    check_bool,
    check_choice,
    check_int,
    check_model,
    check_optional_str,
    invalid,
    is_bundled_graph,
    is_int,
    require_ray,
)
from .graphs import load_graph

PARTITION_ALGOS = ("greedy", "random", "sa", "ppo", "ppo-lns")
# CP-SAT deterministic units per sub-solve of a deterministic polish: the value bench/mcm/mcm_large.py's
# greedy+LNS and learned-LNS runs use (mcm_lns_hint.DET_TIME; its docstring says why), so a user's polish
# and the bench's compare at the same sub-solve length
POLISH_DET_TIME = 0.25
POLISH_SAFETY_S = 3600.0  # outer wall-clock safety limit of a deterministic polish given no `polish` seconds


@dataclass(frozen=True)
class PartitionRequest(Request):
    model: str                      # preset name, dnn-partitioning .json or archplace .parquet
    chiplets: int = 36
    algo: str = "sa"                # greedy, random, sa, ppo, ppo-lns (the PPO ones need a running Ray)
    budget: int = 200               # samples (evaluated partitions)
    seed: int = 0
    seq: int | None = None
    mbs: int = 1
    pretrained: str | None = None   # ppo: start from these weights (.npz from bench/mcm/mcm_pretrain.py)
    zero_shot: bool = False         # ppo: sample the pre-trained policy, no updates
    env_runners: int = 0            # ppo: remote EnvRunner actors that sample (0: in this process)
    learners: int = 0               # ppo: remote Learner actors (0: in this process)
    config: str | None = None       # ppo: YAML overriding mcm_ppo.yaml's ppo/model/env keys (tune-rl's best)
    polish: float = 0.0             # seconds of CP-SAT neighbourhood search on the best partition (0: none);
                                    # ppo-lns: the seconds of its learned neighbourhood search (required)
    polish_subsolves: int | None = None  # deterministic polish: this many CP-SAT sub-solves of
                                    # POLISH_DET_TIME deterministic units each (polish: then only the outer
                                    # wall-clock safety limit, default POLISH_SAFETY_S); the same answer
                                    # under any machine load

    @property
    def needs_ray(self) -> bool:
        return self.algo in ("ppo", "ppo-lns")

    def validate(self) -> None:
        check_model(self.model, files=True)
        check_int("chiplets", self.chiplets, 1, 64)
        check_choice("algo", self.algo, PARTITION_ALGOS)
        if not (is_int(self.budget) and self.budget >= 1):
            raise invalid("budget", f"must be a positive number of samples, got {self.budget!r}")
        check_int("seed", self.seed, low=0)
        check_int("seq", self.seq, optional=True)
        check_int("mbs", self.mbs)
        check_optional_str("pretrained", self.pretrained)
        check_bool("zero_shot", self.zero_shot)
        check_int("env_runners", self.env_runners, low=0)
        check_int("learners", self.learners, low=0)
        check_optional_str("config", self.config)
        if isinstance(self.polish, bool) or not isinstance(self.polish, (int, float)) or \
                not 0 <= self.polish <= 86400:
            raise invalid("polish", f"must be seconds in [0, 86400], got {self.polish!r}")
        check_int("polish_subsolves", self.polish_subsolves, low=1, optional=True)
        if self.polish_subsolves is not None and self.algo == "ppo-lns":
            raise InvalidRequest("{polish_subsolves} applies to the CP-SAT polish, not {algo} ppo-lns (its "
                                 "reward is improvement per second: a wall-time method, budgeted by {polish} "
                                 "SECONDS)",
                                 "polish_subsolves", "algo", "polish")
        if self.config and not os.path.exists(self.config):
            raise invalid("config", f"{self.config} does not exist "
                                    "(archplace tune-rl mcm writes best_config.yaml)")
        if self.algo != "ppo" and (self.env_runners or self.learners or self.config):
            raise InvalidRequest("{env_runners}, {learners} and {config} apply to {algo} ppo, not "
                                 + self.algo, "env_runners", "learners", "config", "algo")
        if self.algo not in ("ppo", "ppo-lns") and (self.pretrained or self.zero_shot):
            raise InvalidRequest("{pretrained} and {zero_shot} apply to {algo} ppo or ppo-lns, not "
                                 + self.algo, "pretrained", "zero_shot", "algo")
        if self.algo == "ppo-lns" and not self.polish > 0:
            raise InvalidRequest("{algo} ppo-lns needs {polish} SECONDS > 0 (its wall-time budget)", "algo",
                                 "polish")
        if self.zero_shot and not self.pretrained:
            raise InvalidRequest("{zero_shot} needs {pretrained} PATH (the policy to sample)",
                                 "zero_shot", "pretrained")
        if self.pretrained and not os.path.exists(self.pretrained):
            raise invalid("pretrained", f"{self.pretrained} does not exist (bench/mcm/mcm_pretrain.py writes "
                                        "bench/mcm/results/mcm_pretrained.npz for ppo, "
                                        "bench/mcm/mcm_lns_pretrain.py "
                                        "bench/mcm/results/mcm_lns_pretrained.npz for ppo-lns)")


@dataclass
class PartitionResult(DetailsResult):
    model: str
    chiplets: int
    algo: str
    samples: int                    # partitions evaluated
    nodes: int
    edges: int
    valid: bool
    throughput: float               # 1 / the slowest chip's latency
    greedy_throughput: float        # the greedy heuristic's (always a candidate)
    improvement: float | None       # throughput / greedy_throughput
    chips_used: int
    chip_latency_s: list[float]
    assignment: dict[str, int]      # operator name -> chiplet
    reason: str | None = None       # why the partition is invalid (throughput 0); None when valid
    status: str = "ok"              # "ok" (valid), "invalid" (none found that fits, though one may), or
                                    # "infeasible" (the memory bound proves none fits: no search ran)
    memory_bound_bytes: float = 0.0  # every partition has a chip peaking at >= this (mcm.MemoryBound)
    details: dict[str, Any] = field(default_factory=dict)  # ppo: valid_samples, pretrained, mode, ...
    wall_s: float = 0.0


def partition(req: PartitionRequest, *, progress: ProgressFn | None = None,
              cancel: threading.Event | None = None) -> PartitionResult:
    """Partition a model over the chiplets of an MCM. Stages: ``graph``, ``greedy``, ``search`` (all
    algorithms but greedy), ``polish`` (when ``polish > 0`` or ``polish_subsolves``), ``done``.
    ``algo="ppo"`` raises RuntimeError unless Ray is running.

    Before any search the memory lower bound (``mcm.memory_lower_bound``: the largest op's own footprint,
    the weights spread evenly) is compared with the chiplet SRAM: above it no partition can fit, and the
    result says so at once (``status`` "infeasible", the bound in ``reason``). Otherwise every algorithm
    searches memory-aware (the greedy cuts and the repairs move ops off chips over SRAM); a
    search that still finds no partition that fits ends ``status`` "invalid"."""
    from ..algorithms.search.mcm_baselines import greedy, random_search, simulated_annealing
    from ..algorithms.solvers.mcm_repair import MCMRepairer
    from ..hardware.presets import mcm_package
    from ..simulators.mcm import MCMProblem, evaluate, memory_lower_bound

    req.validate()
    if req.needs_ray:
        require_ray("partition algo 'ppo'")
    steps = Steps("partition", progress, cancel)
    t0 = time.perf_counter()
    if req.model.endswith((".json", ".parquet")) or is_bundled_graph(req.model):
        g = load_graph(req.model, req.seq, req.mbs, 1, training=False)   # a file or a bundled graph's name
    else:  # the MCM chiplets are int8 edge TPUs: one byte per element
        from ..workloads.models import build_graph

        g = build_graph(req.model, seq=req.seq, mbs=req.mbs, training=False, bytes_per_element=1)
    problem = MCMProblem.from_graph(g, mcm_package(req.chiplets))
    bound = memory_lower_bound(problem)
    steps.stage("graph", nodes=problem.num_nodes, edges=problem.num_edges)
    if not bound.fits:
        res = PartitionResult(
            model=req.model, chiplets=req.chiplets, algo=req.algo, samples=0, nodes=problem.num_nodes,
            edges=problem.num_edges, valid=False, throughput=0.0, greedy_throughput=0.0, improvement=None,
            chips_used=0, chip_latency_s=[], assignment={},
            reason=f"infeasible: {bound.describe(problem)}; no partition fits, so no search ran",
            status="infeasible", memory_bound_bytes=bound.peak_bytes, wall_s=time.perf_counter() - t0)
        steps.done(throughput=0.0, improvement=None)
        return res
    rep = MCMRepairer(problem.num_chips, problem.src, problem.dst, num_nodes=problem.num_nodes)
    g_part, g_tp, g_rep = greedy(problem, seed=req.seed, repairer=rep, with_repair=True)
    steps.stage("greedy", throughput=g_tp)
    details: dict[str, Any] = {"greedy_repair_stage": g_rep.stage, "greedy_repair_changed": g_rep.changed}
    if req.algo in ("greedy", "ppo-lns"):
        part, samples = g_part, 1
    else:
        if req.algo == "ppo":  # PPO with FIX-repaired actions, optionally fine-tuned from pre-trained weights
            part, samples, ppo_details = _ppo(problem, req)
            details.update(ppo_details)
            best = None if part is None else float(evaluate(problem, part).throughput[0])
        else:
            run = random_search if req.algo == "random" else simulated_annealing
            trace = run(problem, req.budget, seed=req.seed, repairer=rep)
            part, samples, best = trace.best_partition, trace.samples, trace.best
            details.update({k: v for k, v in trace.extra.items() if k.startswith("repair")})
        if part is None or best < g_tp:  # the heuristic is always a candidate
            part = g_part
        steps.stage("search", samples=samples)
    ev = evaluate(problem, part)
    details["sampler_throughput"] = float(ev.throughput[0])
    if req.algo == "ppo-lns":
        from ..algorithms.rl.mcm_lns_ppo import env_settings, ppo_lns_search
        from ..algorithms.rl.mcm_ppo import load_state

        state, meta = load_state(req.pretrained) if req.pretrained else (None, None)
        run = ppo_lns_search(problem, float(req.polish), seed=req.seed, init_state=state,
                             train=not req.zero_shot, start_partition=part, env=env_settings(meta))
        part = run.partition
        mode = "zero-shot" if req.zero_shot else ("fine-tuned" if state else "from scratch")
        details.update({**run.summary(), "pretrained": req.pretrained, "mode": mode})
        steps.stage("polish", subsolves=run.subsolves, throughput=run.throughput)
    elif (req.polish > 0 or req.polish_subsolves) and not ev.valid[0]:
        details["polish_skipped"] = "no partition that fits to start from (the polish keeps its seed valid)"
    elif req.polish > 0 or req.polish_subsolves:
        from ..algorithms.solvers.mcm_lns import lns

        if req.polish_subsolves:  # deterministic: sub-solve count and CP-SAT deterministic time
            polished = lns(problem, part, time_limit_s=float(req.polish or POLISH_SAFETY_S), seed=req.seed,
                           max_subsolves=int(req.polish_subsolves), subsolve_det=POLISH_DET_TIME)
        else:
            polished = lns(problem, part, time_limit_s=float(req.polish), seed=req.seed)
        part = polished.partition
        details.update(polished.summary())
        steps.stage("polish", subsolves=polished.subsolves, improved=polished.improved,
                    throughput=polished.throughput)
    if req.algo == "ppo-lns" or req.polish > 0 or req.polish_subsolves:
        ev = evaluate(problem, part)
    names = problem.names or tuple(str(i) for i in range(problem.num_nodes))
    tp = float(ev.throughput[0])
    res = PartitionResult(
        model=req.model, chiplets=req.chiplets, algo=req.algo, samples=samples, nodes=problem.num_nodes,
        edges=problem.num_edges, valid=bool(ev.valid[0]), throughput=tp, greedy_throughput=g_tp,
        improvement=tp / g_tp if g_tp > 0 else None, chips_used=int(part.max()) + 1,
        chip_latency_s=ev.latency_s[0].tolist(), assignment={n: int(c) for n, c in zip(names, part)},
        memory_bound_bytes=bound.peak_bytes, details=details, wall_s=time.perf_counter() - t0)
    if not res.valid:
        from ..simulators.mcm import check

        why = check(problem, part)
        res.status = "invalid"
        res.reason = (f"the best partition found is invalid ({'; '.join(why) or 'no constraint named'}); "
                      f"an invalid partition scores 0; {bound.describe(problem)}, so one that fits may "
                      f"exist but the search found none")
    steps.done(throughput=tp, improvement=res.improvement)
    return res


def _ppo(problem, req: PartitionRequest) -> tuple[Any, int, dict[str, Any]]:
    from ..algorithms.rl.mcm_ppo import load_state, rl_search

    state, meta = load_state(req.pretrained) if req.pretrained else (None, {})
    from ..algorithms.rl.placer_config import load_placer_config

    cfg = load_placer_config(req.config, "ppo")
    run = rl_search(problem, req.budget, seed=req.seed, init_state=state, train=not req.zero_shot,
                    num_env_runners=req.env_runners, num_learners=req.learners, ppo=cfg.get("ppo"),
                    model=cfg.get("model"), env=cfg.get("env"))
    details = {"valid_samples": run.trace.valid_samples, "pretrained": req.pretrained,
               **{k: v for k, v in run.trace.extra.items() if k.startswith("repair")},
               "env_runners": req.env_runners, "config": req.config,
               "env_runner_nodes": run.trace.extra.get("env_runner_nodes", []),
               "pretrained_samples": meta.get("samples"), "mode": "zero-shot" if req.zero_shot else
               ("fine-tuned" if state is not None else "from scratch")}
    return run.trace.best_partition, run.trace.samples, details
