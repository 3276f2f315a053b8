"""The learned-neighbourhood environment for MCM partitioning (issue 17, ``--algo ppo-lns``): an RL policy
chooses which neighbourhood CP-SAT re-solves next (``algorithms/solvers/mcm_lns.py``).

Why learn this: once an exact sub-solver exists, the search's only decision is *where* to spend the next
sub-solve. The non-learned rule (:class:`~archplace.algorithms.solvers.mcm_lns.BottleneckChooser`) picks
windows around the slowest chip uniformly; a policy can learn which widths, offsets and spare chips pay
off on which load profiles (learned LNS, e.g. Song et al. 2020, Wu et al. 2021).

* **State**: the current (valid) partition's per-chip loads seen from the slowest chip ``b``: for the
  17 chips ``b - 8 .. b + 8`` (relative, so one policy serves any chip count and graph size) the chip
  latency, compute and link time over the max latency, the op count over the mean, whether the chip is
  used and whether it is the top used chip; then global features (top chip and spare chips over C, b
  over the top, the episode's progress, log graph size, the second-largest and mean latency over the max,
  the last reward's sign, and per window width the running rate at which it improved the incumbent).
* **Action** (``Discrete(ACTIONS)``, masked through the Dict observation's ``action_mask``): a window
  of ``w`` in :data:`WIDTHS` consecutive chips starting ``o`` in ``0..7`` below ``b`` (``o < w``: the
  window holds ``b``; a window that cannot hold the slowest chip cannot lower the maximum), with 0 or
  :data:`SPARE` spare chips above the top used chip (only when the window reaches it and chips are left);
  then "the slowest chip's nodes plus as many random neighbours" and "a full warm-started solve" (masked
  when ``nodes x chips`` exceeds ``FULL_SOLVE_MAX_CELLS``).
* **Reward**: the improvement per sub-solve second, ``log(L_before / L_after) / max(wall_s, 0.05)``
  (``L`` the max chip latency of the incumbent; 0 when the candidate is worse or invalid, and it is
  dropped). Spending time on neighbourhoods that cannot improve is what the policy must learn to avoid.
* **Reward, ``reward="budget"``**: the plain log improvement ``log(L_before / L_after)``, and the episode
  ends once its sub-solves have used ``episode_s`` wall seconds; the observation's progress feature is
  the share of that budget used. The undiscounted return is then ``log(L_start / L_end)``: exactly the
  improvement a fixed wall budget buys, the quantity a time-to-result comparison measures. The per-second
  rate above is myopic (it prefers many cheap windows that each gain a little) and is kept as the
  default of the env only because earlier weights were trained with it.
* **Episode**: :data:`EPISODE_STEPS` sub-solves (``reward="rate"``) from a start partition:
  ``init="greedy"`` (the greedy heuristic after repair) or ``"best"`` (the best partition this env has
  found on the graph: a search that keeps going, the mode of ``ppo-lns`` on one graph). Multi-graph
  envs pick a graph per episode; a "budget" episode ends when its ``episode_s`` are spent.

Every sub-solve's candidate is re-scored by the simulator; the env keeps the best partition per graph
and reports it through ``info`` on every improvement (``best_partition``), so bookkeeping works from
remote env runners too (callbacks). No Ray import here; the PPO wiring is ``mcm_lns_ppo.py``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import gymnasium as gym
import numpy as np

from ...simulators.mcm import MCMProblem, evaluate
from ..search.mcm_baselines import greedy
from ..solvers.mcm_lns import (
    FULL_SOLVE_MAX_CELLS,
    SUBSOLVE_S,
    Neighbourhood,
    bottleneck_nodes,
    full,
    solve_neighbourhood,
    window,
)

WIDTHS = (1, 2, 3, 4, 6, 8)
OFFSETS = 8
SPARE = 2
SPAN = 8  # chips seen on each side of the slowest one
CHIP_FEATURES = 6
GLOBAL_FEATURES = 9 + len(WIDTHS)
OBS_SIZE = (2 * SPAN + 1) * CHIP_FEATURES + GLOBAL_FEATURES
WINDOW_ACTIONS = len(WIDTHS) * OFFSETS * 2
NODES_ACTION = WINDOW_ACTIONS
FULL_ACTION = WINDOW_ACTIONS + 1
ACTIONS = WINDOW_ACTIONS + 2
EPISODE_STEPS = 16
MIN_WALL_S = 0.05


def decode(action: int) -> tuple[str, int, int, int]:
    """``(kind, width, offset, spare)`` of an action index (kind "window", "nodes" or "full")."""
    a = int(action)
    if a == NODES_ACTION:
        return "nodes", 0, 0, 0
    if a == FULL_ACTION:
        return "full", 0, 0, 0
    wi, rest = divmod(a, OFFSETS * 2)
    o, s = divmod(rest, 2)
    return "window", WIDTHS[wi], o, SPARE * s


def action_mask(problem: MCMProblem, f: np.ndarray, b: int) -> np.ndarray:
    """1 for the actions that make sense at this partition (module doc), else 0."""
    top, C = int(f.max()), problem.num_chips
    m = np.zeros(ACTIONS, dtype=np.float32)
    for a in range(WINDOW_ACTIONS):
        _, w, o, s = decode(a)
        start = b - o
        if o >= w or start < 0:
            continue
        reaches_top = start + w - 1 >= top
        if s and (not reaches_top or top >= C - 1):
            continue
        if not s and w > 1 and start + w - 1 > top and o > 0:
            continue  # the same chips as a smaller window
        m[a] = 1.0
    m[NODES_ACTION] = 1.0
    if problem.num_nodes * min(C, top + 1 + SPARE) <= FULL_SOLVE_MAX_CELLS:
        m[FULL_ACTION] = 1.0
    return m


def neighbourhood(problem: MCMProblem, f: np.ndarray, b: int, action: int, rng: np.random.Generator
                  ) -> Neighbourhood:
    """The neighbourhood an action names at partition ``f`` with slowest chip ``b``."""
    kind, w, o, s = decode(action)
    if kind == "full":
        return full(problem, f, spare=SPARE)
    if kind == "nodes":
        return bottleneck_nodes(problem, f, b, rng, spare=SPARE)
    return window(problem, f, b - o, w, spare=s)


def observe(problem: MCMProblem, f: np.ndarray, lat: np.ndarray, progress: float, last_reward: float,
            width_rate: np.ndarray) -> tuple[np.ndarray, int]:
    """The observation vector (module doc) and the slowest chip; ``progress`` is the share of the
    episode used (steps or wall budget)."""
    C, n = problem.num_chips, problem.num_nodes
    top = int(f.max())
    b = int(np.argmax(lat[:top + 1]))
    L = float(lat[b]) if lat[b] > 0 else 1.0
    comp = np.bincount(f, weights=problem.time_s, minlength=C)[:C]
    cnt = np.bincount(f, minlength=C)[:C]
    mean_cnt = n / (top + 1)
    chips = np.zeros((2 * SPAN + 1, CHIP_FEATURES), dtype=np.float32)
    for i, d in enumerate(range(b - SPAN, b + SPAN + 1)):
        if 0 <= d < C:
            used = d <= top
            chips[i] = (lat[d] / L, comp[d] / L, (lat[d] - comp[d]) / L, min(cnt[d] / mean_cnt, 4.0) / 4.0,
                        float(used), float(d == top))
    srt = np.sort(lat[:top + 1])
    glob = np.array([top / C, (C - 1 - top) / C, b / max(top, 1), progress,
                     math.log(max(n, 1)) / 8.0, (srt[-2] / L) if srt.size > 1 else 0.0,
                     float(srt.mean() / L), float(np.sign(last_reward)), float(C == top + 1),
                     *width_rate.tolist()], dtype=np.float32)
    return np.concatenate([chips.ravel(), glob]).astype(np.float32), b


class MCMLNSEnv(gym.Env):
    """One LNS search as an episode (module doc). ``config``: ``problems`` (a list of
    :class:`MCMProblem`), ``seed``, ``init`` ("greedy" | "best"), ``subsolve_s`` (CP-SAT seconds per
    sub-solve, default ``SUBSOLVE_S``: the same as greedy+LNS), ``episode_steps`` (default
    :data:`EPISODE_STEPS`), ``start_partitions``
    (optional: one valid partition per problem to start from instead of greedy), ``deadline`` (optional
    unix time: later steps solve nothing and end the episode), ``reward`` ("rate" | "budget", module
    doc) and ``episode_s`` (the wall budget of a "budget" episode, default 8 s)."""

    metadata: dict[str, Any] = {}

    def __init__(self, config: dict | None = None):
        cfg = dict(config or {})
        probs = cfg.get("problems")
        if not probs:
            raise ValueError("MCMLNSEnv config 'problems' must be a non-empty list of MCMProblem")
        self.problems: list[MCMProblem] = list(probs)
        self.init = str(cfg.get("init", "greedy"))
        if self.init not in ("greedy", "best"):
            raise ValueError(f"MCMLNSEnv config 'init' is {self.init!r}, must be 'greedy' or 'best'")
        self.subsolve_s = float(cfg.get("subsolve_s", SUBSOLVE_S))
        self.episode_steps = int(cfg.get("episode_steps", EPISODE_STEPS))
        self.reward = str(cfg.get("reward", "rate"))
        if self.reward not in ("rate", "budget"):
            raise ValueError(f"MCMLNSEnv config 'reward' is {self.reward!r}, must be 'rate' or 'budget'")
        self.episode_s = float(cfg.get("episode_s", 8.0))
        if not self.episode_s > 0:
            raise ValueError(f"MCMLNSEnv config 'episode_s' is {self.episode_s}, must be > 0")
        self.deadline = cfg.get("deadline")  # unix time after which steps solve nothing (a wall budget)
        self._rng = np.random.default_rng(int(cfg.get("seed", 0)))
        starts = cfg.get("start_partitions")
        self._starts = [None] * len(self.problems) if starts is None else \
            [np.asarray(s, np.int64) for s in starts]
        self.observation_space = gym.spaces.Dict({
            "observations": gym.spaces.Box(-10.0, 10.0, (OBS_SIZE,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32)})
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self.best: dict[int, tuple[float, np.ndarray]] = {}  # graph -> (max latency, partition)
        self.subsolves = 0
        self._g = 0

    # ------------------------------------------------------------------ helpers
    def start_partition(self, g: int) -> np.ndarray:
        if self.init == "best" and g in self.best:
            return self.best[g][1].copy()
        if self._starts[g] is None:
            self._starts[g] = greedy(self.problems[g])[0]
        return self._starts[g].copy()

    def _obs(self) -> dict[str, np.ndarray]:
        p = self.problems[self._g]
        progress = (min(self._spent / self.episode_s, 1.0) if self.reward == "budget"
                    else self._t / EPISODE_STEPS)
        vec, b = observe(p, self._f, self._lat, progress, self._last_r, self._rate)
        self._b = b
        return {"observations": np.clip(vec, -10, 10), "action_mask": action_mask(p, self._f, b)}

    # ------------------------------------------------------------------ gym API
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        opts = options or {}
        self._g = int(opts["graph"]) if "graph" in opts else int(self._rng.integers(len(self.problems)))
        p = self.problems[self._g]
        self._f = self.start_partition(self._g)
        ev = evaluate(p, self._f)
        if not ev.valid[0]:
            raise ValueError(f"start partition of graph {self._g} is not valid")
        self._L = float(ev.max_latency_s[0])
        self._lat = ev.latency_s[0]
        self._t = 0
        self._spent = 0.0  # sub-solve wall seconds used in this episode
        self._last_r = 0.0
        self._rate = np.full(len(WIDTHS), 0.5, dtype=np.float32)
        if self._g not in self.best or self._L < self.best[self._g][0]:
            self.best[self._g] = (self._L, self._f.copy())
        return self._obs(), {"graph_index": self._g, "max_latency_s": self._L}

    def step(self, action):
        p = self.problems[self._g]
        a = int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)
        limit = self.subsolve_s * (5 if a == FULL_ACTION else 1)
        if self.reward == "budget":
            limit = max(min(limit, self.episode_s - self._spent), 0.05)
        if self.deadline is not None:
            left = float(self.deadline) - time.time()
            if left <= 0.01:  # the wall budget is spent: nothing solved, the episode ends
                info = {"graph_index": self._g, "max_latency_s": self._L, "subsolve_wall_s": None,
                        "kind": "none", "accepted": False, "improved": False, "status": "BUDGET",
                        "best_partition": None}
                return self._obs(), 0.0, True, False, info
            limit = min(limit, left)
        t0 = time.perf_counter()
        nb = neighbourhood(p, self._f, self._b, a, self._rng)
        sub = solve_neighbourhood(p, self._f, nb, time_limit_s=limit, seed=int(self._rng.integers(2**31)))
        wall = time.perf_counter() - t0
        self.subsolves += 1
        reward, improved, accepted = 0.0, False, False
        if sub.partition is not None:
            ev = evaluate(p, sub.partition)
            L2 = float(ev.max_latency_s[0])
            if ev.valid[0] and L2 <= self._L * (1 + 1e-12):
                accepted = True
                gain = math.log(self._L / L2) if L2 > 0 else 0.0
                reward = gain if self.reward == "budget" else gain / max(wall, MIN_WALL_S)
                improved = L2 < self._L * (1 - 1e-12)
                self._f, self._L, self._lat = sub.partition, L2, ev.latency_s[0]
        kind, w, _, _ = decode(a)
        if kind == "window":
            i = WIDTHS.index(w)
            self._rate[i] = 0.8 * self._rate[i] + 0.2 * float(improved)
        self._last_r = reward
        self._t += 1
        self._spent += wall
        new_best = improved and self._L < self.best[self._g][0]
        if new_best:
            self.best[self._g] = (self._L, self._f.copy())
        info = {"graph_index": self._g, "max_latency_s": self._L, "subsolve_wall_s": wall, "kind": nb.kind,
                "accepted": accepted, "improved": improved, "status": sub.status,
                "best_partition": self._f.copy() if new_best else None}
        done = (self._spent >= self.episode_s - 1e-3 if self.reward == "budget"
                else self._t >= self.episode_steps)
        return self._obs(), float(reward), done, False, info
