"""Learned LNS at a deterministic sub-solve budget (issue 31): a policy picks the neighbourhood *and* a
per-node domain restriction for each CP-SAT sub-solve, hinted with (warm-started from) the incumbent.

Why this action space: at a fixed CP-SAT deterministic time per sub-solve, a wide window with every free
node allowed anywhere in it often does not finish (on a 1,000-node graph a 12-chip window ends UNKNOWN in
0.7 deterministic units), while the same window with each node kept within one chip of its current one
is solved to optimality in 0.3. Which trade-off pays (narrow and free, or wide and restricted) depends on
the load profile; that is a decision a policy can learn and a fixed rule cannot.

* **Action** (``Discrete(ACTIONS)``, masked): a window of ``w`` in :data:`WIDTHS` consecutive chips at one
  of three positions relative to the slowest chip ``b`` (``b`` at its top, centre or bottom), with
  :data:`SPARE` spare chips above the top used chip when the window reaches it; or "the slowest chip's
  nodes plus as many random neighbours" (``bottleneck_nodes``). Either with a per-node domain radius in
  :data:`RADII`: each free node may move at most ``r`` chips from its incumbent chip (``None``: anywhere
  its window and Eq. 2 allow). Positions that clip to the same chips as an earlier one are masked.
* **Sub-solve**: ``solve_neighbourhood`` with the incumbent as the CP-SAT hint, ``det_time``
  deterministic units, one worker, a CP-SAT seed drawn from ``(seed, episode, step)``: a run is a
  function of its inputs and seeds only (no wall clock inside; load-independent).
* **Observation**: ``mcm_lns_env.observe`` (per-chip loads around ``b``, global features, progress =
  step / episode length, the running improvement rate per width) plus the running improvement rate per
  radius.
* **Reward**: ``log(L_before / L_after)`` per sub-solve (0 when the candidate is worse, invalid or
  missing; it is dropped), so an episode's undiscounted return is ``log(L_start / L_end)``: the
  improvement a budget of ``episode_steps`` sub-solves buys.
* **Start**: a given partition per problem (the bench's warm start: greedy followed by greedy+LNS for a
  fixed number of sub-solves), else greedy.

:func:`search` runs one budgeted search with any chooser (``obs, rng -> action``): the trained PPO
policy and the controls (:class:`UniformChooser`, :class:`RuleChooser`, an untrained policy) all go
through this one code path, so they differ only in the choices. No Ray here (``mcm_lns_ppo.py`` trains).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from ...simulators.mcm import MCMProblem, evaluate
from ..search.mcm_baselines import greedy
from ..solvers.mcm_lns import bottleneck_nodes, restrict, solve_neighbourhood, window
from .mcm_lns_env import SPAN, observe

WIDTHS = (2, 3, 4, 6, 8, 12)
POSITIONS = 3  # b at the window's top, centre, bottom
RADII: tuple[int | None, ...] = (1, 2, None)
SPARE = 2
WINDOW_ACTIONS = len(WIDTHS) * POSITIONS * len(RADII)
NODES_ACTIONS = len(RADII)
ACTIONS = WINDOW_ACTIONS + NODES_ACTIONS
OBS_SIZE = (2 * SPAN + 1) * 6 + 9 + len(WIDTHS) + len(RADII)
DET_TIME = 0.25  # CP-SAT deterministic units per sub-solve (bench/mcm/mcm_large.py docstring says why)
EPISODE_STEPS = 16
RULE_WIDTHS = (2, 3, 4, 6, 8)  # BottleneckChooser's widths (2, 3, 4, 5, 6, 8) inside this action space
RULE_P_NODES = 0.15  # BottleneckChooser.p_nodes


def decode(action: int) -> tuple[str, int, int, int | None]:
    """``(kind, width, position, radius)`` of an action index (kind "window" or "nodes")."""
    a = int(action)
    if not 0 <= a < ACTIONS:
        raise ValueError(f"action is {a}, must be in 0..{ACTIONS - 1}")
    if a >= WINDOW_ACTIONS:
        return "nodes", 0, 0, RADII[a - WINDOW_ACTIONS]
    wi, rest = divmod(a, POSITIONS * len(RADII))
    pos, ri = divmod(rest, len(RADII))
    return "window", WIDTHS[wi], pos, RADII[ri]


def encode(kind: str, width: int = 0, position: int = 0, radius: int | None = None) -> int:
    ri = RADII.index(radius)
    if kind == "nodes":
        return WINDOW_ACTIONS + ri
    return (WIDTHS.index(width) * POSITIONS + position) * len(RADII) + ri


def _start(b: int, w: int, pos: int) -> int:
    return max(0, b - w + 1 if pos == 0 else (b - w // 2 if pos == 1 else b))


def _chips(problem: MCMProblem, f: np.ndarray, b: int, w: int, pos: int) -> tuple[int, int]:
    """The chip range a window action covers (after clipping at 0 and the top used chip)."""
    top = int(f.max())
    a = min(_start(b, w, pos), top)
    return a, min(top, a + w - 1)


def action_mask(problem: MCMProblem, f: np.ndarray, b: int) -> np.ndarray:
    """1 for the actions whose window differs from every lower-index position of the same width."""
    m = np.zeros(ACTIONS, dtype=np.float32)
    for wi, w in enumerate(WIDTHS):
        seen = set()
        for pos in range(POSITIONS):
            c = _chips(problem, f, b, w, pos)
            if c in seen:
                continue
            seen.add(c)
            for ri in range(len(RADII)):
                m[(wi * POSITIONS + pos) * len(RADII) + ri] = 1.0
    m[WINDOW_ACTIONS:] = 1.0
    return m


def neighbourhood(problem: MCMProblem, f: np.ndarray, b: int, action: int, rng: np.random.Generator):
    kind, w, pos, r = decode(action)
    if kind == "nodes":
        nb = bottleneck_nodes(problem, f, b, rng, spare=SPARE)
    else:
        nb = window(problem, f, _start(b, w, pos), w, spare=SPARE)
    return restrict(nb, f, r)


class MCMHintEnv(gym.Env):
    """Budgeted learned LNS as an episode (module doc). ``config``: ``problems`` (list of
    :class:`MCMProblem`), ``starts`` (optional list of valid partitions, one per problem; default greedy),
    ``seed``, ``episode_steps`` (default :data:`EPISODE_STEPS`), ``det_time`` (default :data:`DET_TIME`),
    ``num_workers`` (CP-SAT workers, default 1)."""

    metadata: dict[str, Any] = {}

    def __init__(self, config: dict | None = None):
        cfg = dict(config or {})
        probs = cfg.get("problems")
        if not probs:
            raise ValueError("MCMHintEnv config 'problems' must be a non-empty list of MCMProblem")
        self.problems: list[MCMProblem] = list(probs)
        starts = cfg.get("starts")
        if starts is not None and len(starts) != len(self.problems):
            raise ValueError(f"MCMHintEnv config 'starts' has {len(starts)} partitions, "
                             f"must have one per problem ({len(self.problems)})")
        self._starts = [None] * len(self.problems) if starts is None else \
            [None if s is None else np.asarray(s, np.int64) for s in starts]
        self.seed = int(cfg.get("seed", 0))
        self.episode_steps = int(cfg.get("episode_steps", EPISODE_STEPS))
        if self.episode_steps < 1:
            raise ValueError(f"MCMHintEnv config 'episode_steps' is {self.episode_steps}, must be >= 1")
        self.det_time = float(cfg.get("det_time", DET_TIME))
        if not self.det_time > 0:
            raise ValueError(f"MCMHintEnv config 'det_time' is {self.det_time}, must be > 0")
        self.num_workers = int(cfg.get("num_workers", 1))
        self._rng = np.random.default_rng(self.seed)
        self._episode = -1
        self.observation_space = gym.spaces.Dict({
            "observations": gym.spaces.Box(-10.0, 10.0, (OBS_SIZE,), np.float32),
            "action_mask": gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32)})
        self.action_space = gym.spaces.Discrete(ACTIONS)
        self.det_used = 0.0
        self.subsolves = 0

    def start_partition(self, g: int) -> np.ndarray:
        if self._starts[g] is None:
            self._starts[g] = greedy(self.problems[g])[0]
        return self._starts[g].copy()

    def _obs(self) -> dict[str, np.ndarray]:
        p = self.problems[self._g]
        vec, b = observe(p, self._f, self._lat, self._t / self.episode_steps, self._last_r, self._wrate)
        self._b = b
        vec = np.concatenate([vec, self._rrate]).astype(np.float32)
        return {"observations": np.clip(vec, -10, 10), "action_mask": action_mask(p, self._f, b)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
            self.seed = int(seed)
        opts = options or {}
        self._episode += 1
        self._g = int(opts["graph"]) if "graph" in opts else int(self._rng.integers(len(self.problems)))
        p = self.problems[self._g]
        self._f = self.start_partition(self._g)
        ev = evaluate(p, self._f)
        if not ev.valid[0]:
            raise ValueError(f"start partition of graph {self._g} is not valid")
        self._L = float(ev.max_latency_s[0])
        self._lat = ev.latency_s[0]
        self._t = 0
        self._last_r = 0.0
        self._wrate = np.full(len(WIDTHS), 0.5, dtype=np.float32)
        self._rrate = np.full(len(RADII), 0.5, dtype=np.float32)
        return self._obs(), {"graph_index": self._g, "max_latency_s": self._L}

    def step(self, action):
        p = self.problems[self._g]
        a = int(np.asarray(action).reshape(-1)[0]) if np.ndim(action) else int(action)
        step_rng = np.random.default_rng([self.seed, self._episode, self._t])
        nb = neighbourhood(p, self._f, self._b, a, step_rng)
        t0 = time.perf_counter()
        sub = solve_neighbourhood(p, self._f, nb, time_limit_s=600.0, seed=int(step_rng.integers(2**31)),
                                  num_workers=self.num_workers, det_time=self.det_time)
        wall = time.perf_counter() - t0
        self.subsolves += 1
        self.det_used += sub.det_time
        reward, improved, accepted = 0.0, False, False
        if sub.partition is not None:
            ev = evaluate(p, sub.partition)
            L2 = float(ev.max_latency_s[0])
            if ev.valid[0] and L2 <= self._L * (1 + 1e-12):
                accepted = True
                reward = math.log(self._L / L2) if L2 > 0 else 0.0
                improved = L2 < self._L * (1 - 1e-12)
                self._f, self._L, self._lat = sub.partition, L2, ev.latency_s[0]
        kind, w, _, r = decode(a)
        if kind == "window":
            i = WIDTHS.index(w)
            self._wrate[i] = 0.8 * self._wrate[i] + 0.2 * float(improved)
        j = RADII.index(r)
        self._rrate[j] = 0.8 * self._rrate[j] + 0.2 * float(improved)
        self._last_r = reward
        self._t += 1
        info = {"graph_index": self._g, "max_latency_s": self._L, "wall_s": wall, "det_time": sub.det_time,
                "kind": kind, "accepted": accepted, "improved": improved, "status": sub.status}
        return self._obs(), float(reward), self._t >= self.episode_steps, False, info

    @property
    def partition(self) -> np.ndarray:
        return self._f.copy()


# ================================================================== choosers (the controls)
class UniformChooser:
    """Uniform over the allowed actions (the uniform-random control)."""

    def __call__(self, obs: dict, rng: np.random.Generator) -> int:
        return int(rng.choice(np.flatnonzero(obs["action_mask"])))


class RuleChooser:
    """greedy+LNS's rule (``BottleneckChooser``) inside this action space: with probability
    :data:`RULE_P_NODES` the slowest chip's nodes, else a window of a width drawn from
    :data:`RULE_WIDTHS` at a uniformly drawn allowed position; never a domain restriction (``r=None``),
    as greedy+LNS. The rule-based control of issue 31."""

    def __call__(self, obs: dict, rng: np.random.Generator) -> int:
        m = obs["action_mask"]
        if rng.random() < RULE_P_NODES:
            return encode("nodes", radius=None)
        w = int(rng.choice(RULE_WIDTHS))
        ok = [pos for pos in range(POSITIONS) if m[encode("window", w, pos, None)] > 0]
        return encode("window", w, int(rng.choice(ok)), None)


class FixedChooser:
    """Always the same action (tests; a one-action baseline)."""

    def __init__(self, action: int):
        self.action = int(action)

    def __call__(self, obs: dict, rng: np.random.Generator) -> int:
        return self.action


@dataclass
class SearchResult:
    """One budgeted search: best partition and max latency, the start's, sub-solves used, CP-SAT
    deterministic time and wall seconds spent, the best max latency after each sub-solve, and the
    actions taken per kind/radius."""

    partition: np.ndarray
    max_latency_s: float
    start_max_latency_s: float
    subsolves: int
    det_time: float
    wall_s: float
    trace_max_latency_s: list[float] = field(default_factory=list)
    actions: dict[str, int] = field(default_factory=dict)


def search(problem: MCMProblem, start, chooser, subsolves: int, *, seed: int = 0, det_time: float = DET_TIME,
           safety_s: float = 3600.0) -> SearchResult:
    """``subsolves`` sub-solves on ``problem`` from ``start`` with ``chooser(obs, rng) -> action`` (the
    env's own code path; module doc); the incumbent never gets worse. ``safety_s`` is an outer wall limit
    only (a run that hits it has fewer sub-solves, which the result shows)."""
    if subsolves < 1:
        raise ValueError(f"subsolves is {subsolves}, must be >= 1")
    t0 = time.perf_counter()
    env = MCMHintEnv({"problems": [problem], "starts": [start], "seed": seed, "episode_steps": subsolves,
                      "det_time": det_time})
    rng = np.random.default_rng([seed, 7])
    obs, info = env.reset(options={"graph": 0})
    L0 = info["max_latency_s"]
    trace: list[float] = []
    acts: dict[str, int] = {}
    done = False
    while not done and time.perf_counter() - t0 < safety_s:
        a = int(chooser(obs, rng))
        kind, w, _, r = decode(a)
        key = f"{kind}{w if kind == 'window' else ''}/r{'-' if r is None else r}"
        acts[key] = acts.get(key, 0) + 1
        obs, _, done, _, info = env.step(a)
        trace.append(info["max_latency_s"])
    return SearchResult(env.partition, float(env._L), L0, env.subsolves, env.det_used,
                        time.perf_counter() - t0, trace, acts)
