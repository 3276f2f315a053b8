"""Auto-MAP's DQN for operator sharding (OPP) and data-parallel dimensions (ADP), RLlib new API stack.

The Rainbow pieces the pipeline DQN (``pipeline_dqn``) uses, with the paper's OPP/ADP values (§5.1,
spec automap.md §4.2): double Q, dueling head, prioritized replay (α 0.2, β 0.6, capacity 2000, our
seeded buffer), γ 0.6, Adam at 5e-4, minibatch 64, target update every 100 steps, ε 1.0 → 0.1 over
2000 (OPP) or 500 (ADP) steps, no noisy nets, one-step returns, RLlib's default MLP Q-network (the
paper gives no sizes). Budget: propagation calls (the environment's steps); the search stops when the
environment has spent them. The two-stage search (§7.7) restarts episodes from the first stage's best
plan with its replicated dimensions undecided again, keeping the network and the replay buffer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...workloads.sharding import UNKNOWN
from ..search import sharding_search as ss
from .pipeline_dqn import NSTEP_BUFFER
from .sharding_env import ShardingEnv

DQN = {  # (paper) unless noted
    "lr": 5e-4,
    "gamma": 0.6,
    "train_batch_size_per_learner": 64,
    "target_network_update_freq": 100,
    "double_q": True,
    "dueling": True,
    "n_step": 1,
    "num_atoms": 1,
    "num_steps_sampled_before_learning_starts": 128,  # ours
    "training_intensity": 8,  # ours: a 64-transition minibatch every 8 environment steps
}
EPSILON_STEPS = {"opp": 2000, "adp": 500}
HIDDEN = [128, 128]  # ours: the paper gives no layer sizes


def dqn_config(env_config: dict[str, Any], *, mode: str = "opp", seed: int = 0, budget: int | None = None):
    from ray.rllib.algorithms.dqn import DQNConfig

    steps = EPSILON_STEPS[mode]
    if budget is not None:  # a smaller budget reaches the minimum at 60% of it (as pipeline_dqn does)
        steps = max(1, min(steps, int(0.6 * budget)))
    return (
        DQNConfig()
        .environment(ShardingEnv, env_config={**env_config, "seed": seed})
        .framework("torch")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=8)
        .training(
            **DQN,
            epsilon=[(0, 1.0), (steps, 0.1)],
            replay_buffer_config={
                "type": NSTEP_BUFFER,
                "capacity": 2000,
                "alpha": 0.2,
                "beta": 0.6,
                "seed": int(seed),
            },
        )
        .rl_module(model_config={"fcnet_hiddens": HIDDEN, "head_fcnet_hiddens": [64]})
        .reporting(min_sample_timesteps_per_iteration=64)
        .debugging(seed=seed)
    )


def _env(algo) -> ShardingEnv:
    return algo.env_runner.env.unwrapped.envs[0].unwrapped


def greedy_values(algo, env: ShardingEnv) -> tuple[np.ndarray | None, int]:
    """Roll out the argmax-Q policy once on ``env``; (class values, or None on a conflict, its calls)."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns

    module = algo.get_module()
    module.set_state(algo.learner_group.get_weights()[DEFAULT_MODULE_ID])
    obs, _ = env.reset()
    c0 = env.calls
    while True:
        with torch.no_grad():
            a = int(module.forward_inference({Columns.OBS: torch.as_tensor(obs)[None]})[Columns.ACTIONS][0])
        obs, r, done, trunc, info = env.step(a)
        if "conflict" in info:
            return None, env.calls - c0
        if done or trunc:
            return env.values.copy(), env.calls - c0


@dataclass
class DQNShardSearch:
    best: ss.ShardResult | None  # the best plan the search completed (by its reward's criterion)
    greedy: ss.ShardResult | None  # the final network's argmax plan (None: it conflicts)
    best_partitioned_dims: int
    stage1_partitioned_dims: int
    propagation_calls: int
    episodes: int
    wall_s: float
    history: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def dqn_search(
    pb: ss.ShardProblem,
    budget: int,
    *,
    reward: str = "paper",
    seed: int = 0,
    two_stage: bool = True,
    stage1_share: float = 0.7,
    safety_wall_s: float = 3600.0,
) -> DQNShardSearch:
    """Train from scratch for ``budget`` propagation calls (the linkage groups' extraction excluded, it is
    reported apart); with ``two_stage``, ``stage1_share`` of them from scratch and the rest fine-tuning
    from the first stage's best plan. Needs a running Ray (RLlib builds its algorithm on it)."""
    t0 = time.perf_counter()
    groups = ss.linkage_groups(pb)
    link_calls = pb.calls
    order = ss.decision_order(pb, groups)
    stage1 = int(budget * stage1_share) if two_stage else budget
    cfg = {"problem": pb, "reward": reward, "budget": stage1, "order": order}
    algo = dqn_config(cfg, mode=pb.mode, seed=seed, budget=budget).build_algo()
    env = _env(algo)
    notes = [
        f"linkage groups: {link_calls} propagation calls, largest {max(len(v) for v in groups.values())}"
    ]
    try:
        while not env.exhausted and time.perf_counter() - t0 < safety_wall_s:
            algo.train()
        stage1_best = env.best_partitioned
        if two_stage and env.best_values is not None:
            start = env.best_values.copy()
            cl = pb.graph.classes
            # backtrack: the replicated dims of decision tensors become undecided (with their classes)
            for c in set(env.slot_cls.tolist()):
                if start[c] == 0 and pb.base[c] == UNKNOWN:
                    start[c] = UNKNOWN
            # re-derive what the remaining splits imply
            splits = {
                (t, d): pb.axis
                for t in pb.variables
                for d, c in enumerate(cl.tensor_classes[t])
                if start[c] > 0
            }
            start = ss.propagate(pb.graph, pb.mesh, splits, pb.base).values
            reopened = int((start[env.slot_cls] == UNKNOWN).sum())
            env.start, env.budget = start, budget if reopened else env.calls
            notes.append(
                f"stage 2 from the stage-1 best ({stage1_best} dims split), "
                f"{int((start[env.slot_cls] == UNKNOWN).sum())} dims reopened"
            )
            while not env.exhausted and time.perf_counter() - t0 < safety_wall_s:
                algo.train()
        if not env.exhausted:
            notes.append(f"stopped by safety_wall_s={safety_wall_s} at {env.calls} of {budget} calls")
        calls, episodes = env.calls, env.episodes
        # the final network's argmax plan from the state its last stage trained on (stage 2: the
        # stage-1 best with its replicated dims reopened)
        genv = ShardingEnv({"problem": pb, "reward": reward, "order": order, "start": env.start})
        gv, _ = greedy_values(algo, genv)
    finally:
        algo.stop()
    best = _as_result(pb, env.best_values, "dqn-best", t0)
    greedy = _as_result(pb, gv, "dqn-greedy", t0)
    return DQNShardSearch(
        best,
        greedy,
        env.best_partitioned,
        stage1_best,
        calls,
        episodes,
        time.perf_counter() - t0,
        env.history,
        notes,
    )


def _as_result(pb: ss.ShardProblem, values: np.ndarray | None, algo: str, t0: float) -> ss.ShardResult | None:
    if values is None:
        return None
    v = values.copy()
    v[v == UNKNOWN] = 0
    return ss.result_from_values(pb, algo, v, t0, pb.calls)
