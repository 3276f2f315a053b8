"""PPO that learns where CP-SAT should re-solve next (``partition --algo ppo-lns``; issue 17).

The thin Ray layer over :class:`~archplace.algorithms.rl.mcm_lns_env.MCMLNSEnv`:

* :func:`lns_ppo_config` is an RLlib new-API-stack PPO whose module is RLlib's action-masking PPO module
  (``log(mask)`` added to the logits; the env's Dict observation carries the mask) over an MLP of the
  chip-load features. The MCM sampler's GraphSAGE encoder is *not* reused: the action here is a chip
  window relative to the slowest chip, which the per-chip loads describe directly and which keeps the
  policy independent of the graph and the chip count;
* :func:`ppo_lns_search` is one search on one graph for a fixed wall time: every episode starts from the
  best partition found so far, PPO updates between rollouts (or none: ``train=False``, the pre-trained
  policy as it is), optionally from pre-trained weights;
* :func:`pretrain_lns` trains one policy on many graphs for a fixed number of sub-solves.

The wall-time budget is enforced inside the env (``deadline``): a step after it solves nothing and ends
the episode, so a search never overruns its budget by more than one sub-solve.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...simulators.mcm import MCMProblem, evaluate
from ..solvers.mcm_lns import SUBSOLVE_S
from .mcm_lns_env import MCMLNSEnv

PPO_DEFAULTS = {"lr": 3e-4, "gamma": 0.9, "lambda_": 0.95, "entropy_coeff": 0.01, "num_epochs": 4,
                "train_batch_size_per_learner": 32, "minibatch_size": 16, "vf_loss_coeff": 0.5}
MODEL_DEFAULTS = {"fcnet_hiddens": [64, 64], "vf_share_layers": False}
# the env's reward mode (``mcm_lns_env`` module doc). "budget" makes the return the log improvement a
# fixed wall budget buys; it did not make pre-training pay on the validation graphs
# (bench/mcm/results/mcm_lns_validation_budget.json), so "rate" stays the default. Pre-trained weights record
# theirs (``env`` in their meta) and a search that loads them uses it
ENV_DEFAULTS = {"reward": "rate"}
GAMMA = {"rate": 0.9, "budget": 0.99}


def env_settings(meta: dict | None = None) -> dict[str, Any]:
    """The env settings of weights with ``meta`` (from ``load_state``): theirs when recorded, "rate" for
    weights that predate the setting, :data:`ENV_DEFAULTS` without weights."""
    if meta is None:
        return dict(ENV_DEFAULTS)
    return dict(meta.get("env") or {"reward": "rate"})


def lns_log_callback():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class MCMLNSLog(RLlibCallback):
        """Logs ``[graph, unix time, max latency, *partition]`` whenever a runner's env improves its best
        partition of a graph, and ``[graph, subsolve wall]`` per step, so the driver sees both from any
        runner."""

        def on_episode_step(self, *, episode, metrics_logger=None, **kwargs: Any) -> None:
            info = episode.get_infos(-1)
            if metrics_logger is None or not isinstance(info, dict) or "max_latency_s" not in info:
                return
            if info.get("subsolve_wall_s") is not None:
                row = [float(info["graph_index"]), float(info["subsolve_wall_s"])]
                metrics_logger.log_value(LNS_STEPS_KEY, row, reduce="item_series")
            if info.get("best_partition") is not None:
                metrics_logger.log_value(LNS_BEST_KEY, [float(info["graph_index"]), time.time(),
                                                        float(info["max_latency_s"]),
                                                        *(float(c) for c in info["best_partition"])],
                                         reduce="item_series")

    return MCMLNSLog


LNS_BEST_KEY = "mcm_lns_best"
LNS_STEPS_KEY = "mcm_lns_steps"


def lns_ppo_config(problems: list[MCMProblem], *, seed: int = 0, init: str = "greedy",
                   subsolve_s: float = SUBSOLVE_S, deadline: float | None = None, start_partitions=None,
                   ppo: dict | None = None, model: dict | None = None, num_env_runners: int = 0,
                   env: dict | None = None):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

    env_set = dict(ENV_DEFAULTS if env is None else env)
    env_cfg = {"problems": list(problems), "seed": seed, "init": init, "subsolve_s": subsolve_s,
               "deadline": deadline, "start_partitions": start_partitions, **env_set}
    ppo_cfg = {**PPO_DEFAULTS, "gamma": GAMMA[env_set.get("reward", "rate")], **(ppo or {})}
    batch = int(ppo_cfg["train_batch_size_per_learner"])
    config = (
        PPOConfig()
        .environment(MCMLNSEnv, env_config=env_cfg)
        .framework("torch")
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=1,
                     rollout_fragment_length=max(1, batch // max(1, num_env_runners)))
        .training(**ppo_cfg)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule,
                                               model_config={**MODEL_DEFAULTS, **(model or {})}))
        .debugging(seed=seed)
    )
    return config.callbacks(lns_log_callback())


@dataclass
class LNSRun:
    """A learned-LNS search: best partition and max latency, the best-so-far curve over wall time
    (``trace_t_s``, ``trace_max_latency_s``), sub-solves, PPO iterations and the final module state."""

    partition: np.ndarray
    max_latency_s: float
    throughput: float
    seed_throughput: float
    subsolves: int
    iterations: int
    wall_s: float
    trace_t_s: list[float] = field(default_factory=list)
    trace_max_latency_s: list[float] = field(default_factory=list)
    state: dict | None = None

    def summary(self) -> dict[str, Any]:
        return {"lns_subsolves": self.subsolves, "ppo_iterations": self.iterations, "lns_wall_s": self.wall_s,
                "lns_seed_throughput": self.seed_throughput}


def _rows(result: dict, key: str) -> list[list[float]]:
    from .callbacks import _items

    return _items(result.get("env_runners", {}).get(key))


def ppo_lns_search(problem: MCMProblem, time_limit_s: float, *, seed: int = 0, init_state: dict | None = None,
                   train: bool = True, start_partition=None, subsolve_s: float = SUBSOLVE_S,
                   ppo: dict | None = None, keep_state: bool = False, env: dict | None = None) -> LNSRun:
    """Learned LNS on one graph for ``time_limit_s`` seconds from ``start_partition`` (default: greedy after
    repair); every episode restarts from the best partition so far. Counts the algorithm build in the
    budget. The result is never worse than the start. ``env``: the env settings (:func:`env_settings` of
    the weights in ``init_state``)."""
    import torch

    if not time_limit_s > 0:
        raise ValueError(f"time_limit_s is {time_limit_s}, must be > 0")
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    deadline = time.time() + time_limit_s
    starts = None if start_partition is None else [np.asarray(start_partition, dtype=np.int64)]
    algo = lns_ppo_config([problem], seed=seed, init="best", subsolve_s=subsolve_s, deadline=deadline,
                          start_partitions=starts, ppo=ppo, env=env).build_algo()
    from .mcm_ppo import load_module_state, module_state

    try:
        if init_state is not None:
            load_module_state(algo, init_state)
        env = algo.env_runner.env.unwrapped.envs[0].unwrapped if algo.env_runner is not None else None
        start = (starts[0] if starts else env.start_partition(0)) if env is not None else starts[0]
        ev = evaluate(problem, start)
        best_L, best_f = float(ev.max_latency_s[0]), np.asarray(start).copy()
        seed_tp = float(ev.throughput[0])
        trace_t, trace_L = [time.perf_counter() - t0], [best_L]
        iters = subsolves = 0
        batch = int(algo.config.train_batch_size_per_learner)
        last_s = 0.0  # an iteration that would end past the deadline is not started (train_samples)
        while time.time() + last_s < deadline:
            t_it = time.time()
            if train:
                res = algo.train()
            else:
                algo.env_runner.sample(num_timesteps=batch, explore=True)
                res = {"env_runners": {k: (v.peek() if hasattr(v, "peek") else v)
                                       for k, v in algo.env_runner.get_metrics().items()}}
            iters += 1
            subsolves += len(_rows(res, LNS_STEPS_KEY))
            for row in sorted(_rows(res, LNS_BEST_KEY), key=lambda r: r[1]):
                if row[2] < best_L:
                    best_L, best_f = float(row[2]), np.asarray(row[3:], dtype=np.int64)
                    trace_t.append(row[1] - (deadline - time_limit_s))
                    trace_L.append(best_L)
            last_s = time.time() - t_it
        state = module_state(algo) if keep_state else None
    finally:
        algo.stop()
    tp = 1.0 / best_L if best_L > 0 else float("inf")
    return LNSRun(best_f, best_L, tp, seed_tp, subsolves, iters, time.perf_counter() - t0, trace_t, trace_L,
                  state)


def _train_until(algo, subsolves: int, log, label: str, digits: int, t0: float) -> tuple[list[float], int]:
    """PPO iterations until ``subsolves`` env steps (one sub-solve each) have been sampled: the mean
    episode return of each iteration (nan where no episode ended) and the sub-solves sampled."""
    returns: list[float] = []
    done = 0
    while done < subsolves:
        res = algo.train()
        done = int(res["env_runners"]["num_env_steps_sampled_lifetime"])
        r = res["env_runners"].get("episode_return_mean")
        returns.append(float(r) if r is not None else float("nan"))
        if log:
            log(f"{label} {done}/{subsolves} sub-solves, mean episode return {returns[-1]:.{digits}f}, "
                f"{time.perf_counter() - t0:.0f} s")
    return returns, done


def pretrain_lns(problems: list[MCMProblem], subsolves: int, *, seed: int = 0, subsolve_s: float = SUBSOLVE_S,
                 ppo: dict | None = None, log=None, env: dict | None = None) -> tuple[dict, dict[str, Any]]:
    """One policy trained on ``problems`` (a random graph per episode, each episode from the greedy
    partition) for ``subsolves`` environment steps; returns the final module state and a summary
    (iterations, mean reward per iteration, wall)."""
    import torch

    from .mcm_ppo import module_state

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    algo = lns_ppo_config(problems, seed=seed, init="greedy", subsolve_s=subsolve_s, ppo=ppo,
                          env=env).build_algo()
    try:
        rewards, done = _train_until(algo, subsolves, log, "pretrain-lns", 3, t0)
        state = module_state(algo)
    finally:
        algo.stop()
    return state, {"iterations": len(rewards), "episode_return_mean": rewards, "subsolves": done,
                   "env": dict(ENV_DEFAULTS if env is None else env),
                   "wall_s": time.perf_counter() - t0}


# ================================================================== budgeted learned LNS (issue 31)
HINT_PPO_DEFAULTS = {"lr": 1e-3, "gamma": 0.99, "lambda_": 0.95, "entropy_coeff": 0.01, "num_epochs": 4,
                     "train_batch_size_per_learner": 64, "minibatch_size": 32, "vf_loss_coeff": 0.5}


def hint_ppo_config(problems: list[MCMProblem], *, starts=None, seed: int = 0, det_time: float | None = None,
                    episode_steps: int | None = None, ppo: dict | None = None, model: dict | None = None):
    """RLlib new-API-stack PPO on :class:`~archplace.algorithms.rl.mcm_lns_hint.MCMHintEnv` (the
    action-masking module over an MLP, as :func:`lns_ppo_config`), sampling in the driver."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

    from .mcm_lns_hint import DET_TIME, EPISODE_STEPS, MCMHintEnv

    env_cfg = {"problems": list(problems), "starts": starts, "seed": seed,
               "det_time": DET_TIME if det_time is None else det_time,
               "episode_steps": EPISODE_STEPS if episode_steps is None else episode_steps}
    ppo_cfg = {**HINT_PPO_DEFAULTS, **(ppo or {})}
    batch = int(ppo_cfg["train_batch_size_per_learner"])
    return (
        PPOConfig()
        .environment(MCMHintEnv, env_config=env_cfg)
        .framework("torch")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=batch)
        .training(**ppo_cfg)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule,
                                               model_config={**MODEL_DEFAULTS, **(model or {})}))
        .debugging(seed=seed)
    )


def train_hint_policy(problems: list[MCMProblem], subsolves: int, *, starts=None, seed: int = 0,
                      det_time: float | None = None, episode_steps: int | None = None,
                      ppo: dict | None = None, log=None) -> tuple[dict, dict, dict[str, Any]]:
    """PPO on ``problems`` (a random graph per episode, each from its ``starts`` partition) for at least
    ``subsolves`` sub-solves. Returns the *initial* module state (the untrained control: the same weights
    before any update), the final state and a summary (iterations, mean episode return per iteration,
    sub-solves, CP-SAT deterministic time, wall). ``ppo={"lr": 0.0}`` switches learning off."""
    import torch

    from .mcm_ppo import module_state

    torch.manual_seed(seed)
    t0 = time.perf_counter()
    algo = hint_ppo_config(problems, starts=starts, seed=seed, det_time=det_time, episode_steps=episode_steps,
                           ppo=ppo).build_algo()
    try:
        init = module_state(algo)
        returns, done = _train_until(algo, subsolves, log, "train-hint", 4, t0)
        final = module_state(algo)
        env = algo.env_runner.env.unwrapped.envs[0].unwrapped
        det = float(env.det_used)
    finally:
        algo.stop()
    return init, final, {"iterations": len(returns), "episode_return_mean": returns, "subsolves": done,
                         "det_time": det, "wall_s": time.perf_counter() - t0}


class PolicyChooser:
    """A policy's choice, ``obs, rng -> action``, from module weights (trained or untrained), for
    :func:`~archplace.algorithms.rl.mcm_lns_hint.search` outside RLlib: the same module class and
    config, built without a Ray runtime; the action is sampled from the masked softmax with ``rng``
    (``greedy=True``: the argmax)."""

    def __init__(self, state: dict, model: dict | None = None, greedy: bool = False):
        import gymnasium as gym
        import torch
        from ray.rllib.core.rl_module.rl_module import RLModuleSpec
        from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

        from .mcm_lns_hint import ACTIONS, OBS_SIZE

        obs_space = gym.spaces.Dict({
            "observations": gym.spaces.Box(-10.0, 10.0, (OBS_SIZE,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32)})
        spec = RLModuleSpec(module_class=ActionMaskingTorchRLModule, observation_space=obs_space,
                            action_space=gym.spaces.Discrete(ACTIONS),
                            model_config={**MODEL_DEFAULTS, **(model or {})}, inference_only=False)
        self.module = spec.build()
        self.module.set_state({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})
        self.module.eval()
        self.greedy = bool(greedy)

    def probs(self, obs: dict) -> np.ndarray:
        import torch

        with torch.no_grad():
            out = self.module.forward_inference({"obs": {
                "observations": torch.as_tensor(obs["observations"][None], dtype=torch.float32),
                "action_mask": torch.as_tensor(obs["action_mask"][None], dtype=torch.float32)}})
            logits = out["action_dist_inputs"][0].double()
        p = torch.softmax(logits, -1).numpy()
        p = p * (np.asarray(obs["action_mask"]) > 0)
        return p / p.sum()

    def __call__(self, obs: dict, rng: np.random.Generator) -> int:
        p = self.probs(obs)
        return int(np.argmax(p)) if self.greedy else int(rng.choice(p.size, p=p))
