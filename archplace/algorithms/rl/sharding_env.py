"""Auto-MAP's OPP / ADP environment (spec automap.md §7-§8): decide the dimensions of the decision
tensors one at a time, each decision propagated over the whole graph.

* State: the decision vector (1 split, 0 replicated, -1 undecided) over every dimension of every
  decision tensor, followed by a one-hot of the current position (the paper gives no encoding).
* Action: 0 replicate, 1 partition the dimension at the current position.
* Order: by the size of the dimension's split linkage group, largest first (§7.4); a dimension another
  decision already fixed is skipped, so linkage groups apply their implied decisions at once.
* Reward ``paper``: +0.4 per newly partitioned and +0.1 per newly replicated dimension of a decision
  tensor (the chosen one and those it implied), -1 and the end of the episode on a propagation
  conflict. Reward ``cost``: minus the change of the predicted step time (undecided dims counted
  replicated) over the all-replicated plan's time, or of the memory overflow over the memory while
  the plan does not fit; -1 on a conflict.
* Budget: propagation calls (each step is one); when spent, episodes end at once (truncated).
* ``start``: class values an episode starts from (the two-stage search's second stage).

The env keeps the best plan it completed (``best_values``): the most partitioned dimensions for the
paper's reward, the lowest (overflow, step time) for the cost reward.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ...workloads.sharding import UNKNOWN
from ..search import sharding_search as ss


class ShardingEnv(gym.Env):
    def __init__(self, config: dict[str, Any]):
        self.pb: ss.ShardProblem = config.get("problem") or ss.ShardProblem(
            config["graph"], int(config["devices"]), config.get("mode", "opp")
        )
        self.reward_kind = config.get("reward", "paper")
        if self.reward_kind not in ("paper", "cost"):
            raise ValueError(f"reward is {self.reward_kind!r}; allowed: ['paper', 'cost']")
        self.budget = config.get("budget")
        cl = self.pb.graph.classes
        self.order = config.get("order") or ss.decision_order(self.pb)
        self.slot_cls = np.array([cl.tensor_classes[t][d] for t, d in self.order], dtype=np.int64)
        self.start = config.get("start")
        n = len(self.order)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2 * n,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.calls = 0
        self.episodes = 0
        self.best_values: np.ndarray | None = None
        self.best_key: tuple | None = None
        self.best_partitioned = -1
        self.history: list[float] = []  # best partitioned count (paper) or step s (cost) after each plan
        self.ref_s, _ = self.pb.fast_cost(np.zeros(cl.num, dtype=np.int64))
        self.cap = float(self.pb.cost.gpu.memory_bytes)

    @property
    def exhausted(self) -> bool:
        return self.budget is not None and self.calls >= self.budget

    def _obs(self) -> np.ndarray:
        v = self.values[self.slot_cls]
        dec = np.where(v == UNKNOWN, -1.0, np.where(v > 0, 1.0, 0.0)).astype(np.float32)
        pos = np.zeros(len(self.order), np.float32)
        if self.pos < len(self.order):
            pos[self.pos] = 1.0
        return np.concatenate([dec, pos])

    def _advance(self) -> None:
        while self.pos < len(self.order) and self.values[self.slot_cls[self.pos]] != UNKNOWN:
            self.pos += 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.values = (self.pb.base if self.start is None else self.start).copy()
        self.pos = 0
        self._advance()
        self.score = self.pb.score(self.values)
        return self._obs(), {}

    def _cost_reward(self, new: tuple[float, float]) -> float:
        if self.score[0] > 0 or new[0] > 0:
            return (self.score[0] - new[0]) / self.cap
        return (self.score[1] - new[1]) / self.ref_s

    def step(self, action: int):
        if self.exhausted:
            return self._obs(), 0.0, False, True, {}
        if self.pos >= len(self.order):  # the start state left nothing to decide
            self._finish()
            return self._obs(), 0.0, True, False, {}
        t, d = self.order[self.pos]
        p = self.pb.propagate({(t, d): self.pb.axis if int(action) == 1 else None}, base=self.values)
        self.calls += 1
        if p.conflict is not None:
            self.episodes += 1
            return self._obs(), -1.0, True, False, {"conflict": str(p.conflict)}
        newly = (self.values[self.slot_cls] == UNKNOWN) & (p.values[self.slot_cls] != UNKNOWN)
        split = int((newly & (p.values[self.slot_cls] > 0)).sum())
        self.values = p.values
        new_score = self.pb.score(self.values)
        if self.reward_kind == "paper":
            reward = 0.4 * split + 0.1 * (int(newly.sum()) - split)
        else:
            reward = self._cost_reward(new_score)
        self.score = new_score
        self._advance()
        done = self.pos >= len(self.order)
        if done:
            self._finish()
        return self._obs(), float(reward), done, False, {}

    def _finish(self) -> None:
        self.episodes += 1
        parts = int((self.values[self.slot_cls] > 0).sum())
        key = (-parts,) if self.reward_kind == "paper" else self.score
        if self.best_key is None or key < self.best_key:
            self.best_key, self.best_values, self.best_partitioned = key, self.values.copy(), parts
        self.history.append(float(self.best_partitioned if self.reward_kind == "paper" else self.best_key[1]))
