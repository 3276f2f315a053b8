"""Rainbow-style DQN for pipeline cuts (Auto-MAP online training): build, search, greedy plan.

The thin Ray layer over :class:`~archplace.algorithms.rl.pipeline_env.PipelineCutEnv` and
:class:`~archplace.algorithms.rl.pivot_q_module.PivotQModule`: :func:`build_dqn` makes an RLlib
new-API-stack DQN ``Algorithm`` from ``tune_configs/pipeline_dqn.yaml`` (one in-process env runner
and learner, so one search is one Ray task); :func:`dqn_search` trains it for a budget of cost-model
evaluations and returns the best plan it evaluated and the greedy (ε = 0) plan of the final Q-network.

Budgets (issue 31): the features score the cost model at every open pivot of every step, so a search
that counted only its completed plans ("250 simulator calls") spent up to ~1.2 M evaluations. A budget
here is in cost-model evaluations, simulator calls of completed plans plus feature rows (see
:mod:`~archplace.algorithms.rl.pipeline_env`), and covers the final greedy rollout too: that rollout's
worst case (every window's features and one call) is set aside first, the environments get the rest
(split evenly over the env runners) and stop when it is spent, and the search ends when every
environment has stopped. The counts are read off the environments themselves, so they include an
episode still in flight. No wall clock decides anything; ``safety_wall_s`` is only an outer limit, and a
search it stops says so (``stopped``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
import yaml

from ...hardware.presets import Cluster
from ...simulators.pipeline import PipelineProfile
from .pipeline_env import PipelineCutEnv

CONFIG_FILE = "pipeline_dqn.yaml"


def load_config() -> dict[str, Any]:
    """``tune_configs/pipeline_dqn.yaml`` (sections env, dqn, model, search, sweep)."""
    return yaml.safe_load(resources.files("archplace.tune_configs").joinpath(CONFIG_FILE).read_text())


def build_dqn(env_config: dict[str, Any], **kw: Any):
    """:func:`dqn_config` built into an ``Algorithm``."""
    return dqn_config(env_config, **kw).build_algo()


NSTEP_BUFFER = "archplace.algorithms.rl.nstep_buffer.NStepPrioritizedEpisodeReplayBuffer"


def dqn_config(env_config: dict[str, Any], *, seed: int = 0, budget_steps: int | None = None,
               dqn: dict | None = None, model: dict | None = None, env_class=PipelineCutEnv,
               num_env_runners: int = 0, num_learners: int = 0):
    """A DQN ``Algorithm``; ``dqn`` / ``model`` override the YAML key by key. ``num_env_runners``
    remote EnvRunner actors sample (0: the driver's own runner); completed plans reach the driver
    through :class:`~archplace.algorithms.rl.callbacks.PipelinePlanLog` metrics either way."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from .callbacks import PipelinePlanLog
    from .pivot_q_module import PivotQModule

    cfg = load_config()
    d = {**cfg["dqn"], **(dqn or {})}
    steps = int(d.pop("epsilon_steps"))
    if budget_steps is not None:
        steps = max(1, min(steps, int(0.6 * budget_steps)))
    d["epsilon"] = [(0, float(d.pop("epsilon_start"))), (steps, float(d.pop("epsilon_end")))]
    d["replay_buffer_config"] = dict(d["replay_buffer_config"])
    n_step = d.get("n_step", 1)
    if isinstance(n_step, (bool, list, tuple)) or int(n_step) != n_step or n_step < 1:
        raise ValueError(f"n_step is {n_step!r}; allowed: an integer >= 1")
    # RLlib's buffers draw from an unseeded generator, and its prioritized one redraws every transition
    # with fewer than n steps left in its episode (a K-stage episode has K - 1): ours is seeded and
    # truncates the return at the episode's end. RLlib wants the type as a string.
    d["replay_buffer_config"].update(type=NSTEP_BUFFER, seed=int(seed))
    model_cfg = {**cfg["model"], **(model or {})}
    config = (
        DQNConfig()
        .environment(env_class, env_config={**env_config, "seed": seed})
        .framework("torch")
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1, rollout_fragment_length=8)
        .learners(num_learners=num_learners)
        .callbacks(PipelinePlanLog)
        .training(**d)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=PivotQModule, model_config=model_cfg))
        .reporting(min_sample_timesteps_per_iteration=64)
        .debugging(seed=seed)
    )
    return config


def default_budget(num_stages: int) -> int:
    """Environment steps for a search with K stages: ``steps_per_cut`` × (K − 1) (the YAML)."""
    return int(load_config()["search"]["steps_per_cut"]) * max(1, num_stages - 1)


def plan_cost(env: PipelineCutEnv) -> int:
    """The most evaluations one episode can cost: every cut's whole window of features and the final
    simulator call (the open pivots at a cut are a subset of its window)."""
    return int(env.window.sum()) + 1


def default_eval_budget(env: PipelineCutEnv) -> int:
    """Cost-model evaluations for a search: ``steps_per_cut`` plans at :func:`plan_cost` each, plus the
    greedy rollout's reserve, so that the default search completes at least the ``steps_per_cut`` ×
    (K − 1) environment steps it took before evaluations were counted."""
    return (int(load_config()["search"]["steps_per_cut"]) + 1) * plan_cost(env)


def default_search_budget(profile: PipelineProfile, cluster: Cluster, num_stages: int,
                          radius: int | None = 3) -> int:
    """:func:`default_eval_budget` of the case's environment (what ``archplace pipeline --algo rainbow``
    spends without ``--budget``)."""
    from ..solvers.pipeline_exact import candidate_pivots

    cand = candidate_pivots(profile, cluster, num_stages, radius)
    env = PipelineCutEnv({"profile": profile, "cluster": cluster, "num_stages": num_stages,
                          "candidates": cand})
    return default_eval_budget(env)


def env_counts(algo) -> dict[str, Any]:
    """Evaluations spent by the environments of every env runner (the driver's own when it samples):
    ``sim_calls``, ``feature_calls``, ``live_steps`` summed, ``exhausted`` (all envs out of budget)."""

    def read(runner) -> list[tuple[int, int, int, bool]]:
        vec = getattr(runner, "env", None)
        if vec is None:
            return []
        return [(e.unwrapped.sim_calls, e.unwrapped.feature_calls, e.unwrapped.live_steps,
                 e.unwrapped.exhausted) for e in vec.unwrapped.envs]

    remote = algo.env_runner_group.num_remote_env_runners() > 0
    rows = [r for part in algo.env_runner_group.foreach_env_runner(read, local_env_runner=not remote)
            for r in part]
    return {"sim_calls": sum(r[0] for r in rows), "feature_calls": sum(r[1] for r in rows),
            "live_steps": sum(r[2] for r in rows), "exhausted": bool(rows) and all(r[3] for r in rows),
            "envs": len(rows)}


def current_module(algo):
    """The Q-module with the learner's current weights, in this process, wherever the env runners and
    learners live (the local runner's copy, or one fetched from a remote runner)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = algo.get_module()
    module.set_state(algo.learner_group.get_weights()[DEFAULT_MODULE_ID])
    return module


def set_module_weights(algo, state: dict[str, Any]) -> None:
    """Load weights into the learners and every env runner."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo.learner_group.set_weights({DEFAULT_MODULE_ID: state})
    if algo.env_runner is not None:
        algo.env_runner.module.set_state(state)
    algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)


class PlanTracker:
    """Best plan, plan count and best-so-far history from the plans each iteration reports (the
    ``PipelinePlanLog`` metrics), so it works with any number of remote env runners."""

    def __init__(self) -> None:
        self.best_cuts: np.ndarray | None = None
        self.best_length_s = np.inf
        self.best_oom = True
        self.plans = 0
        self.history: list[float] = []

    def update(self, result: dict[str, Any]) -> None:
        from .callbacks import plans_of

        for length, oom, cuts in plans_of(result):
            self.plans += 1
            if (oom, length) < (self.best_oom, self.best_length_s):
                self.best_oom, self.best_length_s, self.best_cuts = oom, length, cuts
            self.history.append(self.best_length_s if not self.best_oom else np.inf)


def greedy_plan(algo, env: PipelineCutEnv) -> np.ndarray:
    """Roll out the argmax-Q policy (masked) once; the pivots it cuts at (``env`` counts what the rollout
    evaluates and keeps the plan's L in ``best_length_s``)."""
    import torch
    from ray.rllib.core.columns import Columns

    module = current_module(algo)
    obs, _ = env.reset()
    done = False
    while not done:
        batch = {Columns.OBS: {k: torch.as_tensor(v)[None] for k, v in obs.items()}}
        with torch.no_grad():
            a = int(module.forward_inference(batch)[Columns.ACTIONS][0])
        obs, _, done, trunc, _ = env.step(a)  # raises if the action is masked
        if trunc:
            raise RuntimeError("the greedy rollout ran out of its evaluation reserve")
    return np.asarray(env.cuts, dtype=np.int64)


@dataclass
class DQNSearch:
    """One online-training search on one (model, cluster, K) case."""

    best_cuts: np.ndarray | None
    best_length_s: float
    best_oom: bool
    greedy_cuts: np.ndarray
    greedy_length_s: float
    greedy_oom: bool
    env_steps: int
    plans: int
    wall_s: float
    history: np.ndarray  # best feasible L after each evaluated plan
    state: dict[str, Any] | None = field(default=None, repr=False)
    env_runner_nodes: list[str] = field(default_factory=list)   # Ray node of each remote env runner
    best_seen_length_s: float = np.inf   # the best plan the search evaluated (before the greedy one)
    best_seen_oom: bool = True
    budget: int | None = None        # cost-model evaluations (None: a budget of env steps)
    env_step_calls: int = 0          # completed plans scored by the simulator (the greedy one included)
    feature_calls: int = 0           # open pivots' feature rows scored (the greedy rollout's included)
    greedy_calls: int = 0            # of which the greedy rollout's
    budget_exhausted: bool = False   # every environment stopped at the budget
    stopped: str = "budget"          # budget | steps (budget_steps) | safety_wall_s
    learning: bool = True            # False: the control with no Q updates (an untrained Q-network)

    @property
    def simulator_calls(self) -> int:
        """Every cost-model evaluation the search made: simulator calls plus feature evaluations."""
        return self.env_step_calls + self.feature_calls


def dqn_search(profile: PipelineProfile, cluster: Cluster, num_stages: int, budget: int | None = None, *,
               budget_steps: int | None = None, seed: int = 0, radius: int | None = 3,
               dqn: dict | None = None, model: dict | None = None, keep_state: bool = False,
               num_env_runners: int = 0, num_learners: int = 0, env_options: dict | None = None,
               learning: bool = True, safety_wall_s: float | None = None) -> DQNSearch:
    """Train the DQN from scratch (online training, §9) for ``budget`` cost-model evaluations (see the
    module docstring), or, given ``budget_steps`` instead, for that many environment steps with the
    evaluations counted but not capped; on ``num_env_runners`` remote env runners (0: in this process)
    and ``num_learners`` learners. ``learning=False`` is the control: the same search and exploration
    schedule with no Q update (the network keeps its seeded initial weights). ``radius=None`` plans
    over every pivot (unpruned); ``env_options`` go to the env config as they are (``lookahead``,
    ``max_stages``)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from ..solvers.pipeline_exact import candidate_pivots

    if (budget is None) == (budget_steps is None):
        raise ValueError("give exactly one of budget (cost-model evaluations) and budget_steps")
    t0 = time.perf_counter()
    cand = candidate_pivots(profile, cluster, num_stages, radius)
    env_cfg = {"profile": profile, "cluster": cluster, "num_stages": num_stages, "radius": radius,
               "candidates": cand, **(env_options or {})}
    reserve = plan_cost(PipelineCutEnv(env_cfg))
    runners = max(1, num_env_runners)
    if budget is not None:
        if isinstance(budget, bool) or int(budget) != budget or budget < reserve + runners * reserve:
            raise ValueError(f"budget is {budget!r}; allowed: an integer >= {reserve + runners * reserve} "
                             f"cost-model evaluations (one plan per env runner and the greedy rollout, "
                             f"{reserve} each at most)")
        per_env = (int(budget) - reserve) // runners
        # the fewest steps the budget buys: every cut scoring its whole window (sets ε's schedule)
        steps_hint = max(1, per_env * runners // reserve * (num_stages - 1))
        train_cfg = {**env_cfg, "eval_budget": per_env}
    else:
        if budget_steps < 1:
            raise ValueError(f"budget_steps must be >= 1 environment steps, got {budget_steps}")
        steps_hint, train_cfg = int(budget_steps), env_cfg
    if not learning:   # the control: never start learning (the replay fills, no update is made)
        dqn = {**(dqn or {}), "num_steps_sampled_before_learning_starts": 2**62}
    algo = build_dqn(train_cfg, seed=seed, budget_steps=steps_hint, dqn=dqn, model=model,
                     num_env_runners=num_env_runners, num_learners=num_learners)
    track = PlanTracker()
    stopped = "budget" if budget is not None else "steps"
    try:
        steps = 0
        while True:
            counts = env_counts(algo)
            if budget is not None and counts["exhausted"]:
                break
            if budget is None and steps >= budget_steps:
                break
            if safety_wall_s is not None and time.perf_counter() - t0 > safety_wall_s:
                stopped = "safety_wall_s"
                break
            res = algo.train()
            track.update(res)
            steps = int(res["env_runners"]["num_env_steps_sampled_lifetime"])
        genv = PipelineCutEnv({**env_cfg, "eval_budget": reserve})
        g = greedy_plan(algo, genv)
        state = algo.learner_group.get_weights()[DEFAULT_MODULE_ID] if keep_state else None
        from .mcm_ppo import env_runner_nodes

        nodes = env_runner_nodes(algo)
    finally:
        algo.stop()
    g_len, g_oom = genv.best_length_s, genv.best_oom
    best_cuts, best_len, best_oom = track.best_cuts, track.best_length_s, track.best_oom
    seen_len, seen_oom = best_len, best_oom
    if (g_oom, g_len) < (best_oom, best_len):
        best_cuts, best_len, best_oom = g, g_len, g_oom
    return DQNSearch(best_cuts, float(best_len), bool(best_oom), g, float(g_len), bool(g_oom),
                     counts["live_steps"], track.plans, time.perf_counter() - t0, np.asarray(track.history),
                     state, nodes, float(seen_len), bool(seen_oom), None if budget is None else int(budget),
                     counts["sim_calls"] + genv.sim_calls, counts["feature_calls"] + genv.feature_calls,
                     genv.calls, bool(counts["exhausted"]), stopped, bool(learning))


# ---------------------------------------------------------------------- online inference (spec §10)
def coarse_env_config(profile: PipelineProfile, cluster: Cluster, num_stages: int,
                      granularity: int = 128) -> tuple[Any, dict[str, Any]]:
    """A real model as the pre-trained agent sees it: C, A, W (seconds) → 128-point transform →
    coarse profile; the env config that plans on it, and the :class:`CoarseProfile` that maps back."""
    from ...simulators.pipeline import coarse_pipeline_profile, profile_time_arrays
    from ...workloads.profiles import coarsen

    cp = coarsen(*profile_time_arrays(profile, cluster), granularity=granularity)
    cfg = {"profile": coarse_pipeline_profile(cp, cluster, profile.setup), "cluster": cluster,
           "num_stages": num_stages, "radius": None, "collapse": False, "raw_features": True,
           "ignore_memory": True, "full_action_set": True}
    return cp, cfg


def pretrain_synthetic(total_steps: int, *, seed: int = 0, clusters=("A", "B", "C"),
                       distributions=("uniform", "normal"), dqn: dict | None = None,
                       model: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pre-train the DQN on seeded synthetic profiles (§10.5: uniform + normal, a new profile every 50
    steps, stages = servers of a random cluster). Returns the module weights and a training record."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from .pipeline_env import SyntheticPipelineEnv

    t0 = time.perf_counter()
    env_cfg = {"clusters": tuple(clusters), "distributions": tuple(distributions)}
    algo = build_dqn(env_cfg, seed=seed, budget_steps=total_steps, dqn=dqn, model=model,
                     env_class=SyntheticPipelineEnv)
    curve: list[tuple[int, float]] = []
    try:
        steps = 0
        while steps < total_steps:
            res = algo.train()
            steps = int(res["env_runners"]["num_env_steps_sampled_lifetime"])
            ret = res["env_runners"].get("episode_return_mean")
            if ret is not None and np.isfinite(ret):
                curve.append((steps, float(ret)))
        state = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    return state, {"steps": steps, "wall_s": time.perf_counter() - t0, "return_curve": curve,
                   "clusters": list(clusters), "distributions": list(distributions), "seed": seed}


@dataclass
class PretrainedPlan:
    """The pre-trained agent's plan on a real model, zero-shot or after fine-tuning."""

    coarse_cuts: np.ndarray
    cuts: np.ndarray  # real pivots
    length_s: float
    oom: bool
    finetune_steps: int
    wall_s: float
    env_step_calls: int = 0   # plans scored by the simulator: fine-tuning's, the greedy one, the real one
    feature_calls: int = 0    # feature rows scored on the coarse profile (fine-tuning and greedy rollout)

    @property
    def simulator_calls(self) -> int:
        return self.env_step_calls + self.feature_calls


def pretrained_plan(state: dict[str, Any], profile: PipelineProfile, cluster: Cluster, num_stages: int,
                    *, finetune_steps: int = 0, seed: int = 0) -> PretrainedPlan:
    """Plan with pre-trained weights: the greedy plan on the model's coarse profile (zero-shot), after
    ``finetune_steps`` of further DQN training on it when > 0. Scored on the real profile."""

    from ...simulators.pipeline import coarse_to_real_pivots, evaluate

    t0 = time.perf_counter()
    cp, env_cfg = coarse_env_config(profile, cluster, num_stages)
    dqn = {"epsilon_start": 0.3} if finetune_steps else None
    algo = build_dqn(env_cfg, seed=seed, budget_steps=max(finetune_steps, 1), dqn=dqn)
    try:
        set_module_weights(algo, state)
        steps = 0
        while steps < finetune_steps:
            res = algo.train()
            steps = int(res["env_runners"]["num_env_steps_sampled_lifetime"])
        tuned = env_counts(algo) if finetune_steps else {"sim_calls": 0, "feature_calls": 0}
        genv = PipelineCutEnv(env_cfg)
        coarse = greedy_plan(algo, genv)
    finally:
        algo.stop()
    cuts = coarse_to_real_pivots(cp, coarse)
    r = evaluate(profile, cluster, cuts[None, :])
    return PretrainedPlan(coarse, cuts, float(r.length_s[0]), bool(r.oom[0]), steps,
                          time.perf_counter() - t0, tuned["sim_calls"] + genv.sim_calls + 1,
                          tuned["feature_calls"] + genv.feature_calls)


def save_state(path, state: dict[str, Any], **meta: Any) -> None:
    """Module weights (and JSON-able ``meta``) to ``.npz``."""
    from .mcm_ppo import save_state as _save

    _save(path, state, **meta)


def load_state(path) -> tuple[dict[str, Any], dict[str, Any]]:
    from .mcm_ppo import load_state as _load

    return _load(path)


def sweep(profile: PipelineProfile, cluster: Cluster, num_stages: int, budget_steps: int, *,
          grid: dict[str, list] | None = None, seed: int = 0, cpus_per_trial: float = 1.0) -> list[dict]:
    """A Ray Tune grid over DQN settings (default: the YAML's ``sweep`` section), one online-training
    search per trial, reporting the best L; rows sorted best first."""
    from ray import tune

    grid = grid if grid is not None else load_config()["sweep"]

    def trial(config: dict) -> None:
        r = dqn_search(profile, cluster, num_stages, budget_steps=budget_steps, seed=seed, dqn=dict(config))
        tune.report({"length_s": r.best_length_s if not r.best_oom else float("inf"),
                     "greedy_length_s": r.greedy_length_s, "env_steps": r.env_steps, "wall_s": r.wall_s})

    tuner = tune.Tuner(tune.with_resources(trial, {"cpu": cpus_per_trial}),
                       param_space={k: tune.grid_search(list(v)) for k, v in grid.items()},
                       tune_config=tune.TuneConfig(metric="length_s", mode="min"))
    results = tuner.fit()
    rows = [{**r.config, **{k: r.metrics.get(k) for k in ("length_s", "greedy_length_s", "env_steps",
                                                          "wall_s")}} for r in results]
    return sorted(rows, key=lambda x: (x["length_s"] is None, x["length_s"]))
