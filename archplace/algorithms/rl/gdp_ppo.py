"""PPO for GDP (issue 18, spec §4-5): the thin Ray layer over :mod:`gdp_env` and the GDP RLModule.

* Advantage (spec §4): GDP has no critic; "the average reward of all the previous trials" is the
  baseline. :class:`PerGraphMeanBaseline`, a Learner ConnectorV2 piece, replaces RLlib's GAE: for each
  sampled placement, ``advantage = reward - mean of the earlier rewards of the same graph`` (per graph,
  the spec's documented inference: step times of different graphs differ by more than the gains
  sought); a graph's first batch uses its own batch mean. Advantages are then standardised per batch
  (RLlib's PPO practice; the paper is silent). ``use_critic=False``, so PPO has no value loss.
* :class:`GDPPPOLearner` is RLlib's torch PPO learner with that connector in place of GAE and without
  the artificial bootstrap timestep (every episode is one step).
* :func:`gdp_train` runs GDP-one (one graph), GDP-batch (several graphs in one policy) or fine-tuning
  (from pre-trained weights) for a number of PPO iterations or a wall-time budget, and reports per graph
  the best placement any sample reached (best-seen) and the greedy policy's placement (the argmax of
  every op's logits) separately: a best-seen result is not the policy's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...simulators.gpu_placement import simulate_batch
from .gdp_env import GDPEnv, GDPGraph

# entropy_coeff 0: the distribution's entropy is a sum over every op (1,000 nats on a 1,600-op graph), so
# any bonus the size of PPO's usual 0.01 outweighs the standardised surrogate and keeps the policy uniform
# num_epochs 2 over one 16-placement minibatch: the learner's passes over whole graphs, not the simulator,
# are the cost of an iteration (about 5 s for 16 placements of a 1,600-op graph with 4 epochs of 2)
PPO_DEFAULTS = {"lr": 1e-3, "gamma": 1.0, "lambda_": 1.0, "entropy_coeff": 0.0, "num_epochs": 2,
                "train_batch_size_per_learner": 16, "minibatch_size": 16, "clip_param": 0.2,
                "use_critic": False, "vf_loss_coeff": 0.0, "grad_clip": 1.0}
# ops per learner minibatch: 16 placements of gnmt-8 (25k ops) took 8.5-12.9 GB in one learner pass and
# Ray's memory monitor killed the run; 100k ops keep a pass near 3 GB
NODES_PER_MINIBATCH = 100_000
GDP_STEP_KEY = "gdp_step"
GDP_BEST_KEY = "gdp_best"


def baseline_connector():
    from ray.rllib.connectors.connector_v2 import ConnectorV2
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing
    from ray.rllib.utils.numpy import convert_to_numpy

    class PerGraphMeanBaseline(ConnectorV2):
        """``advantage = reward - mean(previous rewards of the graph)`` (module doc)."""

        def __init__(self, input_observation_space=None, input_action_space=None, **kwargs):
            super().__init__(input_observation_space, input_action_space, **kwargs)
            self.reward_sum: dict[int, float] = {}
            self.reward_count: dict[int, int] = {}

        def __call__(self, *, rl_module, batch, episodes, **kwargs):
            import torch

            for mb in batch.values():
                r = convert_to_numpy(mb[Columns.REWARDS]).astype(np.float64).reshape(-1)
                g = convert_to_numpy(mb[Columns.OBS]["graph"]).reshape(-1).astype(np.int64)
                adv = np.empty_like(r)
                for gi in np.unique(g):
                    m = g == gi
                    c = self.reward_count.get(int(gi), 0)
                    base = self.reward_sum[int(gi)] / c if c else float(r[m].mean())
                    adv[m] = r[m] - base
                    self.reward_sum[int(gi)] = self.reward_sum.get(int(gi), 0.0) + float(r[m].sum())
                    self.reward_count[int(gi)] = c + int(m.sum())
                adv = (adv - adv.mean()) / max(1e-4, float(adv.std()))
                device = mb[Columns.REWARDS].device if hasattr(mb[Columns.REWARDS], "device") else "cpu"
                mb[Postprocessing.ADVANTAGES] = torch.as_tensor(adv, dtype=torch.float32, device=device)
                mb[Postprocessing.VALUE_TARGETS] = torch.as_tensor(r, dtype=torch.float32, device=device)
            return batch

        def get_state(self, *args, **kwargs) -> dict[str, Any]:
            return {"reward_sum": dict(self.reward_sum), "reward_count": dict(self.reward_count)}

        def set_state(self, state: dict[str, Any]) -> None:
            self.reward_sum = {int(k): float(v) for k, v in state.get("reward_sum", {}).items()}
            self.reward_count = {int(k): int(v) for k, v in state.get("reward_count", {}).items()}

    return PerGraphMeanBaseline


def gdp_learner_class():
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.connectors.learner.add_one_ts_to_episodes_and_truncate import (
        AddOneTsToEpisodesAndTruncate,
    )
    from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation

    baseline = baseline_connector()

    class GDPPPOLearner(PPOTorchLearner):
        """PPO with the per-graph running-mean baseline in place of GAE (module doc)."""

        def build(self) -> None:
            super().build()
            if self._learner_connector is not None:
                self._learner_connector.remove(GeneralAdvantageEstimation)
                self._learner_connector.remove(AddOneTsToEpisodesAndTruncate)
                self._learner_connector.append(baseline())

    return GDPPPOLearner


def gdp_callback():
    from ray.rllib.callbacks.callbacks import RLlibCallback

    class GDPLog(RLlibCallback):
        """Logs ``[graph, step time, valid]`` per sampled placement and ``[graph, step time, *placement]``
        whenever a runner's env finds a better valid placement, so the driver sees both from any runner."""

        def on_episode_step(self, *, episode, metrics_logger=None, **kwargs: Any) -> None:
            info = episode.get_infos(-1)
            if metrics_logger is None or not isinstance(info, dict) or "step_time_s" not in info:
                return
            metrics_logger.log_value(GDP_STEP_KEY, [float(info["graph_index"]), float(info["step_time_s"]),
                                                    float(info["valid"])], reduce="item_series")
            if info.get("best_placement") is not None:
                row = [float(info["graph_index"]), float(info["step_time_s"]),
                       *(float(c) for c in info["best_placement"])]
                metrics_logger.log_value(GDP_BEST_KEY, row, reduce="item_series")

    return GDPLog


def gdp_ppo_config(graphs: list[GDPGraph], *, seed: int = 0, policy: dict | None = None,
                   ppo: dict | None = None, max_devices: int = 8, num_env_runners: int = 0):
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from .gdp_module import GDPRLModule

    ppo_cfg = {**PPO_DEFAULTS, **(ppo or {})}
    batch = int(ppo_cfg["train_batch_size_per_learner"])
    if "minibatch_size" not in (ppo or {}):  # a learner pass holds every op's activations: cap the ops
        biggest = max(g.problem.num_nodes for g in graphs)
        cap = NODES_PER_MINIBATCH // biggest
        ppo_cfg["minibatch_size"] = max(1, min(int(ppo_cfg["minibatch_size"]), cap))
    envs = max(1, batch // max(1, num_env_runners))
    config = (
        PPOConfig()
        .environment(GDPEnv, env_config={"graphs": list(graphs), "max_devices": max_devices, "seed": seed})
        .framework("torch")
        # all of a batch's placements come from one batched forward pass per runner (one-step episodes)
        .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=envs,
                     rollout_fragment_length=1)
        .training(**ppo_cfg, learner_class=gdp_learner_class())
        .rl_module(rl_module_spec=RLModuleSpec(module_class=GDPRLModule,
                                               model_config={"max_devices": max_devices, **(policy or {})}))
        .debugging(seed=seed)
        .callbacks(gdp_callback())
    )
    return config


@dataclass
class GDPRun:
    """A GDP training run: per graph the best sampled placement (``best_*``: best-seen) and the greedy
    policy's placement at the end (``greedy_*``: what the policy itself proposes), the best-so-far step
    time after each iteration, and totals."""

    graph_names: list[str]
    best_step_time_s: list[float]
    best_placement: list[np.ndarray | None]
    greedy_step_time_s: list[float]
    greedy_valid: list[bool]
    greedy_placement: list[np.ndarray]
    iterations: int
    samples: int
    wall_s: float
    curve: list[list[float]] = field(default_factory=list)  # per iteration: [wall s, *best per graph]
    sampled_mean_step_time_s: list[list[float]] = field(default_factory=list)  # per iteration, per graph
    state: dict | None = None


def _rows(result: dict, key: str) -> list[list[float]]:
    from .callbacks import _items

    return _items(result.get("env_runners", {}).get(key))


def greedy_placements(algo, graphs: list[GDPGraph]) -> list[np.ndarray]:
    """The argmax device of every op under the current policy, per graph (placement by op)."""
    import torch

    module = algo.get_module()
    env = GDPEnv({"graphs": graphs, "max_devices": module.model_config.get("max_devices", 8)})
    out = []
    for gi, g in enumerate(graphs):
        obs = {k: torch.as_tensor(v)[None] for k, v in env.observation(gi).items()}
        with torch.no_grad():
            logits = module.node_logits(obs)[0]  # [max_nodes, max_devices], masked devices at -inf
        out.append(g.placement_of(logits.argmax(-1).numpy()))
    return out


def gdp_train(graphs: list[GDPGraph], *, iterations: int | None = None, time_limit_s: float | None = None,
              seed: int = 0, init_state: dict | None = None, policy: dict | None = None,
              ppo: dict | None = None, keep_state: bool = False, log=None, config=None,
              greedy=None, name: str = "gdp") -> GDPRun:
    """PPO on ``graphs`` (one: GDP-one; several: GDP-batch) for ``iterations`` PPO updates or
    ``time_limit_s`` seconds (whichever binds first; at least one must be given), optionally from
    ``init_state`` (fine-tuning). Every sample is simulated; the result reports best-seen and greedy
    placements apart. ``config`` (an algorithm config built like :func:`gdp_ppo_config`) and ``greedy``
    (``fn(algo, graphs)``, the greedy policy's placements) let another placer, HDP, share this loop."""
    import torch

    from .mcm_ppo import load_module_state, module_state

    if iterations is None and time_limit_s is None:
        raise ValueError("gdp_train needs iterations or time_limit_s")
    if iterations is not None and iterations < 0:
        raise ValueError(f"iterations is {iterations}, must be >= 0")
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    algo = (config or gdp_ppo_config(graphs, seed=seed, policy=policy, ppo=ppo)).build_algo()
    G = len(graphs)
    best_t = [float("inf")] * G
    best_p: list[np.ndarray | None] = [None] * G
    curve: list[list[float]] = []
    sampled_mean: list[list[float]] = []  # per iteration and graph: mean step time of the valid samples
    it = samples = 0
    try:
        if init_state is not None:
            load_module_state(algo, init_state)
        while (iterations is None or it < iterations) and \
                (time_limit_s is None or time.perf_counter() - t0 < time_limit_s):
            res = algo.train()
            it += 1
            steps = np.asarray(_rows(res, GDP_STEP_KEY), dtype=np.float64).reshape(-1, 3)
            samples += len(steps)
            sampled_mean.append([float(steps[(steps[:, 0] == gi) & (steps[:, 2] > 0), 1].mean())
                                 if ((steps[:, 0] == gi) & (steps[:, 2] > 0)).any() else float("nan")
                                 for gi in range(G)])
            for row in _rows(res, GDP_BEST_KEY):
                gi = int(row[0])
                if row[1] < best_t[gi]:
                    best_t[gi], best_p[gi] = float(row[1]), np.asarray(row[2:], np.int64)
            curve.append([time.perf_counter() - t0, *best_t])
            if log:
                log(f"{name} iteration {it}: {samples} placements, best / sampled mean step time (ms) "
                    + ", ".join(f"{t * 1e3:.2f} / {m * 1e3:.2f}" for t, m in zip(best_t, sampled_mean[-1])))
        greedy = (greedy or greedy_placements)(algo, graphs)
        state = module_state(algo) if keep_state else None
    finally:
        algo.stop()
    g_t, g_v = [], []
    for g, p in zip(graphs, greedy):
        r = simulate_batch(g.problem, p[None, :])
        g_t.append(float(r.step_time_s[0]))
        g_v.append(bool(r.valid[0]))
    return GDPRun([g.name for g in graphs], best_t, best_p, g_t, g_v, greedy, it, samples,
                  time.perf_counter() - t0, curve, sampled_mean, state)
