"""Every operator of a model's training step on one of the GPUs of one machine (``archplace place-ops``,
GDP): fast placers (METIS, Baechi's m-TOPO / m-ETF / m-SCT, human-expert-like, random), the exact
CP-SAT placement for small graphs, the GDP policy (PPO, on Ray; ``gdp`` warm-starts it by behaviour
cloning of the best fast placer and answers with the best of the policy's greedy placement, its best
sample and that warm start: ``algorithms/rl/gdp_warmstart.py``), and two local searches with the
simulator started from the best fast placer (simulated annealing, neighbourhood search: ``sa``, ``lns``;
``algorithms/search/placement_local_search.py``). ``gdp``, ``gdp-pretrained``, ``sa`` and ``lns`` count
their budget in simulator calls (wall time is only an outer safety limit for ``gdp*``). Every placement
is scored by the event-driven simulator (``simulators/gpu_placement.py``); an invalid one says why.
``machine`` is one of the GDP-era machines or any GPU preset of ``hardware/gpus.py`` (N of them on
NVLink); ``op_model`` / ``dtype`` / ``profile`` choose how each op is timed (``simulators/gpu_ops.py``;
default: the GPU's default op model in fp32, which for the P100 / V100 machines is the roofline they
always had)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._common import (
    DetailsResult,
    InvalidRequest,
    ProgressFn,
    Request,
    Steps,
    check_bool,
    check_choice,
    check_gpu,
    check_int,
    check_optional_str,
    invalid,
    require_ray,
)

PLACE_OPS_ALGOS = ("metis", "m-topo", "m-etf", "m-sct", "human", "random", "single", "exact", "gdp",
                   "gdp-pretrained", "sa", "lns")
# sa / lns start from the fastest valid placement of these (each one simulated once, counted in the budget);
# gdp_baselines.FAST_PLACERS, named here so that importing the API does not load the placers (numba)
LOCAL_SEARCH_STARTS = ("human", "metis", "m-topo", "m-etf", "m-sct")
LOCAL_SEARCH_ALGOS = ("sa", "lns")
GDP_ALGOS = ("gdp", "gdp-pretrained")
# algos whose budget is simulator calls, and the fewest each needs: sa / lns one per start candidate; gdp
# one per fast placer (its warm start) and one for the greedy placement; gdp-pretrained the greedy placement
CALL_BUDGET_MIN = {"sa": len(LOCAL_SEARCH_STARTS), "lns": len(LOCAL_SEARCH_STARTS),
                   "gdp": len(LOCAL_SEARCH_STARTS) + 1, "gdp-pretrained": 1}
DEFAULT_BUDGET_S = 30.0
DEFAULT_BUDGET_CALLS = 2000
MAX_BUDGET_CALLS = 10_000_000
MACHINES = ("a100-40gb", "a100-80gb", "h100-sxm", "h200", "p100-pcie", "v100-nvlink", "v100-sxm2")


@dataclass(frozen=True)
class PlaceOpsRequest(Request):
    model: str                      # a GDP preset (rnnlm-2, gnmt-4, txl-8, inception-v3, wavenet-2x18, ...)
    devices: int | None = None      # GPUs (default: the preset's device count from the paper's Table 1)
    algo: str = "m-etf"
    machine: str = "p100-pcie"
    batch: int | None = None        # the preset's batch size by default
    seed: int = 0
    # exact: the CP-SAT time limit in seconds (None: 30); sa, lns, gdp, gdp-pretrained: simulator calls, the
    # start candidates' / warm start's included (None: 2000)
    budget: float | None = None
    pretrained: str | None = None   # gdp-pretrained: weights from bench/gdp/gdp_pretrain.py (.npz)
    zero_shot: bool = False         # gdp-pretrained: the pre-trained policy's placement, no updates
    op_model: str | None = None     # roofline | calibrated | profiled (None: the machine GPU's default)
    dtype: str | None = None        # bf16 | fp16 | tf32 | fp32 (None: fp32, GDP's TensorFlow graphs)
    profile: str | None = None      # an op profile JSON (archplace profile); implies op_model profiled

    @property
    def custom_ops(self) -> bool:
        """Whether the op times or the machine are new (the JSON then says which op model ran)."""
        return self.machine not in ("p100-pcie", "v100-nvlink") or \
            any(x is not None for x in (self.op_model, self.dtype, self.profile))

    @property
    def budget_value(self) -> float:
        """``budget``, or its default for ``algo`` (seconds, or simulator calls for sa / lns / gdp*)."""
        if self.budget is not None:
            return float(self.budget)
        return float(DEFAULT_BUDGET_CALLS if self.algo in CALL_BUDGET_MIN else DEFAULT_BUDGET_S)

    @property
    def needs_ray(self) -> bool:
        return self.algo in GDP_ALGOS

    def validate(self) -> None:
        from ..workloads.gdp_models import GDP_PRESETS

        if self.model not in GDP_PRESETS:
            raise invalid("model", f"is {self.model!r}; allowed: {sorted(GDP_PRESETS)}")
        check_int("devices", self.devices, 1, 64, optional=True)
        check_choice("algo", self.algo, PLACE_OPS_ALGOS)
        from .pipelining import check_gpu_fields

        check_gpu("machine", self.machine, MACHINES)   # a file: N of the user's GPU on NVLink

        check_gpu_fields(None, self.op_model, self.dtype, self.profile)
        check_int("batch", self.batch, optional=True)
        check_int("seed", self.seed, low=0)
        b = self.budget
        if self.algo in CALL_BUDGET_MIN:
            low = CALL_BUDGET_MIN[self.algo]
            why = {"gdp": f"the {low - 1} fast placers of the warm start and the greedy placement count",
                   "gdp-pretrained": "the greedy placement's evaluation counts"}.get(
                self.algo, f"the {low} fast placers' start evaluations count")
            if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or
                                  not float(b).is_integer() or not low <= b <= MAX_BUDGET_CALLS):
                raise invalid("budget", f"for algo {self.algo} is simulator calls: a whole number in [{low}, "
                                        f"{MAX_BUDGET_CALLS}] ({why}), got {b!r}")
        elif b is not None and (isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 < b <= 86400):
            raise invalid("budget", f"must be seconds in (0, 86400], got {b!r}")
        check_optional_str("pretrained", self.pretrained)
        check_bool("zero_shot", self.zero_shot)
        if (self.algo == "gdp-pretrained") != (self.pretrained is not None):
            raise InvalidRequest("{algo} gdp-pretrained needs {pretrained} PATH, and only it takes one",
                                 "algo", "pretrained")
        if self.zero_shot and self.algo != "gdp-pretrained":
            raise InvalidRequest("{zero_shot} applies to {algo} gdp-pretrained", "zero_shot", "algo")
        if self.pretrained and not os.path.exists(self.pretrained):
            raise invalid("pretrained", f"{self.pretrained} does not exist")


@dataclass
class PlaceOpsResult(DetailsResult):
    model: str
    devices: int
    algo: str
    machine: str
    nodes: int
    edges: int
    valid: bool
    reason: str                     # why the placement is invalid ("" when valid)
    step_time_s: float              # simulated training step time (reported for invalid placements too)
    single_device_step_time_s: float  # everything on GPU 0 (may itself be out of memory)
    speedup_over_single: float | None
    peak_memory_bytes: list[float]  # per GPU: weights + gradients + optimizer state + live activations
    memory_bytes: float             # per GPU
    compute_busy_s: list[float]     # per GPU
    transfer_bytes: float
    placement: dict[str, int]       # operator name -> GPU
    details: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


def place_ops(req: PlaceOpsRequest, *, progress: ProgressFn | None = None,
              cancel: threading.Event | None = None) -> PlaceOpsResult:
    """Place a model's training graph on ``devices`` GPUs. Stages: ``graph``, ``place``, ``simulate``,
    ``done``."""
    from ..algorithms.search import gdp_baselines
    from ..hardware.gpu_machines import gpu_machine
    from ..simulators.gpu_ops import gpu_op_times, load_profile
    from ..simulators.gpu_placement import PlacementProblem, simulate
    from ..workloads.gdp_models import GDP_PRESETS, gdp_graph

    req.validate()
    if req.needs_ray:
        require_ray(f"place-ops algo {req.algo!r}")
    steps = Steps("place-ops", progress, cancel)
    t0 = time.perf_counter()
    devices = req.devices or GDP_PRESETS[req.model].devices
    g = gdp_graph(req.model, batch=req.batch)
    machine = gpu_machine(req.machine, devices, req.dtype)
    details: dict[str, Any] = {}
    if req.custom_ops:
        times = gpu_op_times(g, machine.spec, dtype=machine.dtype, op_model=req.op_model,
                             profile=load_profile(req.profile) if req.profile else None,
                             launch_s=machine.kernel_launch_s, zero_inputs=True)
        problem = PlacementProblem.from_graph(g, machine, profiled_compute_s=times.time_s)
        details["op_model"] = times.to_dict()
    else:
        problem = PlacementProblem.from_graph(g, machine)
    steps.stage("graph", nodes=problem.num_nodes, edges=problem.num_edges)
    t_place = time.perf_counter()
    if req.algo == "exact":
        from ..algorithms.solvers.gdp_exact import exact_placement

        ex = exact_placement(problem, time_limit_s=req.budget_value, seed=req.seed)
        placement = ex.placement
        details.update({"solver_status": ex.status, "gap": ex.gap, "lower_bound_s": ex.lower_bound_s,
                        "model_step_time_s": ex.model_step_time_s})
    elif req.algo == "human":
        placement = gdp_baselines.human_from_graph(g, problem)
    elif req.algo == "gdp":
        placement = _gdp_warm(req, g, problem, details)
    elif req.algo == "gdp-pretrained":
        placement = _gdp_pretrained(req, g, problem, details)
    elif req.algo in LOCAL_SEARCH_ALGOS:
        placement = _local_search(req, g, problem, details)
    else:
        placement = gdp_baselines.BASELINES[req.algo](problem, seed=req.seed)
    details["placement_wall_s"] = time.perf_counter() - t_place
    steps.stage("place", algo=req.algo)
    r = simulate(problem, placement)
    single = simulate(problem, np.zeros(problem.num_nodes, np.int64))
    steps.stage("simulate", step_time_s=r.step_time_s, valid=r.valid)
    names = problem.names or tuple(str(i) for i in range(problem.num_nodes))
    res = PlaceOpsResult(
        model=req.model, devices=devices, algo=req.algo, machine=req.machine, nodes=problem.num_nodes,
        edges=problem.num_edges, valid=r.valid, reason=r.reason, step_time_s=r.step_time_s,
        single_device_step_time_s=single.step_time_s,
        speedup_over_single=single.step_time_s / r.step_time_s if r.step_time_s > 0 else None,
        peak_memory_bytes=r.peak_memory_bytes.tolist(), memory_bytes=problem.memory_bytes,
        compute_busy_s=r.compute_busy_s.tolist(), transfer_bytes=r.transfer_bytes,
        placement={n: int(c) for n, c in zip(names, placement)}, details=details,
        wall_s=time.perf_counter() - t0)
    steps.done(step_time_s=r.step_time_s, valid=r.valid)
    return res


def _local_search(req: PlaceOpsRequest, g, problem, details: dict[str, Any]) -> np.ndarray:
    """``sa`` / ``lns``: the fast placers' placements as starts, the search, and what it reports. The
    answer's own simulation below (and the one-GPU reference every algo reports) is not a search call."""
    from ..algorithms.search import gdp_baselines
    from ..algorithms.search.placement_local_search import SEARCHES

    starts = gdp_baselines.fast_placements(g, problem, seed=req.seed, algos=LOCAL_SEARCH_STARTS)
    run = SEARCHES[req.algo](problem, starts, int(req.budget_value), seed=req.seed)
    details.update({
        "start_algo": run.start_algo, "start_step_time_s": run.start_step_time_s,
        "start_valid": run.start_valid, "start_step_times_s": run.start_step_times_s,
        "speedup_over_start": run.speedup_over_start, "simulator_calls": run.simulator_calls,
        "budget_calls": run.budget, "search_steps": run.steps, "accepted_moves": run.accepted_moves,
        "improvements": run.improvements,
        "best_trace": [[c, t] for c, t in run.best_trace]})
    return run.placement


def _gdp_warm(req: PlaceOpsRequest, g, problem, details: dict[str, Any]) -> np.ndarray:
    """``gdp``: warm start (the best fast placer, cloned into the policy), PPO within the budget, and the
    best of the policy's greedy placement, its best sample and the warm start (``gdp_warmstart``)."""
    from ..algorithms.rl.gdp_env import GDPGraph
    from ..algorithms.rl.gdp_warmstart import gdp_warm
    from ..workloads.gdp_models import node_features

    run = gdp_warm(g, GDPGraph(problem, node_features(g)[0], req.model), int(req.budget_value), seed=req.seed)
    w = run.warm
    details.update({
        "answer_source": run.answer_source,
        "greedy_step_time_s": run.greedy_step_time_s, "greedy_valid": run.greedy_valid,
        "best_sample_step_time_s": run.best_sample_step_time_s,
        "best_sample_valid": run.best_sample_placement is not None,
        "warm_start_step_time_s": w.step_time_s, "warm_start_valid": w.valid, "warm_start_algo": w.algo,
        "warm_start_step_times_s": w.step_times_s, "bc_steps": w.bc_steps, "bc_steps_max": w.bc_steps_max,
        "bc_best_step": w.bc_best_step,
        "bc_agreement": w.agreement, "bc_target_prob_mean": w.target_prob_mean,
        "samples": run.samples, "ppo_iterations": run.ppo_iterations,
        "ppo_iterations_planned": run.ppo_iterations_planned, "simulator_calls": run.simulator_calls,
        "budget_calls": run.budget, "stopped_by": run.stopped_by,
        "warm_start_wall_s": w.placers_wall_s, "bc_wall_s": w.bc_wall_s, "ppo_wall_s": run.ppo_wall_s})
    return run.placement


def _gdp_pretrained(req: PlaceOpsRequest, g, problem, details: dict[str, Any]) -> np.ndarray:
    """``gdp-pretrained``: PPO fine-tuning from the given weights within the budget (simulator calls: the
    samples and the greedy placement's evaluation), or (zero-shot) the pre-trained greedy placement."""
    from ..algorithms.rl.gdp_env import GDPGraph
    from ..algorithms.rl.gdp_ppo import PPO_DEFAULTS, gdp_train
    from ..algorithms.rl.gdp_warmstart import SAFETY_LIMIT_S
    from ..algorithms.rl.mcm_ppo import load_state
    from ..workloads.gdp_models import node_features

    budget = int(req.budget_value)
    planned = 0 if req.zero_shot else (budget - 1) // int(PPO_DEFAULTS["train_batch_size_per_learner"])
    run = gdp_train([GDPGraph(problem, node_features(g)[0], req.model)], seed=req.seed,
                    init_state=load_state(req.pretrained)[0], time_limit_s=SAFETY_LIMIT_S, iterations=planned)
    # the answer is the faster valid one of the best sampled placement (GDP's, spec §9) and the greedy
    # policy's argmax placement (both simulated); zero-shot has only the latter. Both are reported.
    use_best = run.best_placement[0] is not None and not req.zero_shot and \
        (not run.greedy_valid[0] or run.best_step_time_s[0] <= run.greedy_step_time_s[0])
    details.update({"samples": run.samples, "ppo_iterations": run.iterations,
                    "greedy_policy_step_time_s": run.greedy_step_time_s[0],
                    "greedy_policy_valid": run.greedy_valid[0],
                    "best_seen_step_time_s": run.best_step_time_s[0],
                    "result_is": "best seen" if use_best else "greedy policy",
                    "mode": "zero-shot" if req.zero_shot else "fine-tuned",
                    "simulator_calls": run.samples + 1, "budget_calls": budget,
                    "stopped_by": "budget" if run.iterations >= planned else "time limit"})
    return run.best_placement[0] if use_best else run.greedy_placement[0]
