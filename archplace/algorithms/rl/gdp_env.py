"""GDP's placement task as a one-step environment (issue 18): observe a graph, place every op at once,
get the simulated step time.

GDP (spec §4) is a contextual bandit: the state is the graph, the action the whole placement sampled in
one pass of the policy, the reward one scalar after the placement ran. Here:

* **Observation** (a Dict, padded to the largest graph of the env so one space serves a batch of
  graphs): ``x`` node features ``[max_nodes, F]`` in topological order (``workloads.gdp_models
  .node_features``; the placer's segments follow this order), ``edge_index`` ``[2, max_edges]`` by
  position in that order, padded with -1, ``num_nodes``, ``num_devices`` and ``graph`` (the graph's index,
  for the per-graph reward baseline).
* **Action**: ``MultiDiscrete([max_devices] * max_nodes)``, the device of every op (entries past
  ``num_nodes`` are ignored; the policy masks devices past ``num_devices``). A co-location group goes
  where its first op (in topological order) goes, and the other members' entries are ignored: with
  groups of up to 60 ops (an unrolled LSTM layer's weight readers and their gradients) an independent
  per-op sample would split almost every group, every reward would be -10 and nothing could be learned.
  GDP states no co-location heuristic but does not say how its policy met the constraint (spec §2.1);
  Mirhoseini et al. (2017) likewise placed a group as one unit. Invalid then means out of memory.
* **Reward**: ``-sqrt(step time in seconds)`` (spec §4.1) from ``simulators.gpu_placement``, and
  ``INVALID_REWARD`` (-10) for a placement that runs out of memory or splits a co-location group.

The env remembers the best valid placement per graph (``best``) and reports every step's time and
validity in ``info``, so callbacks see them from remote env runners. No Ray import here.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from ...simulators.gpu_placement import PlacementProblem, simulate_batch

INVALID_REWARD = -10.0


class GDPGraph:
    """One graph of the env: the problem in topological order and its padded observation arrays."""

    def __init__(self, problem: PlacementProblem, features: np.ndarray, name: str = "") -> None:
        n = problem.num_nodes
        if features.shape[0] != n:
            raise ValueError(f"features has {features.shape[0]} rows, the problem has {n} ops")
        self.name = name
        self.problem = problem
        self.order = np.argsort(problem.priority, kind="stable")  # topological order
        self.pos = np.empty(n, np.int64)
        self.pos[self.order] = np.arange(n)  # op -> position in that order
        self.features = np.asarray(features, np.float32)[self.order]
        self.edge_index = np.stack([self.pos[problem.src], self.pos[problem.dst]]).astype(np.int64)
        # each op's leader: the first op of its co-location group in topological order (itself if none)
        self.leader = np.arange(n)
        grp = problem.coloc_group
        members = np.flatnonzero(grp >= 0)
        if members.size:
            first: dict[int, int] = {}
            for v in members[np.argsort(self.pos[members], kind="stable")]:
                self.leader[v] = first.setdefault(int(grp[v]), int(v))

    def placement_of(self, action: np.ndarray) -> np.ndarray:
        """An action (device per position) as a placement (device per op); a co-location group follows
        its first op (module doc)."""
        by_op = np.asarray(action, np.int64)[:self.problem.num_nodes][self.pos]
        return by_op[self.leader]


def reward_of(step_time_s: np.ndarray, valid: np.ndarray) -> np.ndarray:
    return np.where(valid, -np.sqrt(np.maximum(step_time_s, 0.0)), INVALID_REWARD)


class GDPEnv(gym.Env):
    """``config``: ``graphs`` (a list of :class:`GDPGraph`), ``max_devices`` (default 8; the policy's
    head width), ``seed``. Each episode is one graph (in turn, so a batch sees every graph equally)."""

    metadata: dict[str, Any] = {}

    def __init__(self, config: dict | None = None):
        cfg = dict(config or {})
        graphs = cfg.get("graphs")
        if not graphs:
            raise ValueError("GDPEnv config 'graphs' must be a non-empty list of GDPGraph")
        self.graphs: list[GDPGraph] = list(graphs)
        self.max_devices = int(cfg.get("max_devices", 8))
        for g in self.graphs:
            if g.problem.num_devices > self.max_devices:
                raise ValueError(f"graph {g.name!r} has {g.problem.num_devices} devices, more than "
                                 f"max_devices {self.max_devices}")
        self.max_nodes = max(g.problem.num_nodes for g in self.graphs)
        self.max_edges = max(max(g.problem.num_edges for g in self.graphs), 1)
        F = self.graphs[0].features.shape[1]
        self.observation_space = gym.spaces.Dict({
            "x": gym.spaces.Box(-np.inf, np.inf, (self.max_nodes, F), np.float32),
            "edge_index": gym.spaces.Box(-1, self.max_nodes, (2, self.max_edges), np.int64),
            "num_nodes": gym.spaces.Box(0, self.max_nodes, (1,), np.int64),
            "num_devices": gym.spaces.Box(1, self.max_devices, (1,), np.int64),
            "graph": gym.spaces.Box(0, len(self.graphs), (1,), np.int64)})
        self.action_space = gym.spaces.MultiDiscrete([self.max_devices] * self.max_nodes)
        self._rng = np.random.default_rng(int(cfg.get("seed", 0)))
        self._next = int(self._rng.integers(len(self.graphs)))
        self._g = 0
        self.best: dict[int, tuple[float, np.ndarray]] = {}  # graph -> (step time, placement by op)
        self._obs_cache: dict[int, dict[str, np.ndarray]] = {}

    def observation(self, gi: int) -> dict[str, np.ndarray]:
        if gi not in self._obs_cache:
            g = self.graphs[gi]
            n, m = g.problem.num_nodes, g.problem.num_edges
            x = np.zeros(self.observation_space["x"].shape, np.float32)
            x[:n] = g.features
            ei = np.full((2, self.max_edges), -1, np.int64)
            ei[:, :m] = g.edge_index
            self._obs_cache[gi] = {"x": x, "edge_index": ei, "num_nodes": np.array([n], np.int64),
                                   "num_devices": np.array([g.problem.num_devices], np.int64),
                                   "graph": np.array([gi], np.int64)}
        return self._obs_cache[gi]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        opts = options or {}
        if "graph" in opts:
            self._g = int(opts["graph"])
        else:
            self._g = self._next
            self._next = (self._next + 1) % len(self.graphs)
        return self.observation(self._g), {"graph_index": self._g}

    def step(self, action):
        g = self.graphs[self._g]
        placement = g.placement_of(action)
        if placement.max(initial=0) >= g.problem.num_devices:
            raise ValueError(f"action puts an op on device {int(placement.max())}, graph {g.name!r} has "
                             f"{g.problem.num_devices} (the policy must mask the others)")
        res = simulate_batch(g.problem, placement[None, :])
        t, valid = float(res.step_time_s[0]), bool(res.valid[0])
        reward = float(reward_of(res.step_time_s, res.valid)[0])
        new_best = valid and (self._g not in self.best or t < self.best[self._g][0])
        if new_best:
            self.best[self._g] = (t, placement.copy())
        info = {"graph_index": self._g, "step_time_s": t, "valid": valid,
                "oom": bool(res.oom[0]), "coloc_violated": bool(res.coloc_violated[0])}
        if new_best:  # only then (a vector env merges infos by key; None would not stack)
            info["best_placement"] = placement.copy()
        return self.observation(self._g), reward, True, False, info

