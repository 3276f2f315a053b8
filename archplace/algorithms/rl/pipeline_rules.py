"""Plans for the pipeline-cut environment made without learning, from the same information the DQN sees.

These are the baselines an RL result has to beat (``bench/pipeline.py``):

* the *lookahead rule*: at every cut take the open pivot whose fourth feature (``L_unit / L`` of the
  tentative plan, exact at the last cut) is largest — the DQN's own input, argmaxed, with no network;
  with ``epsilon > 0`` each cut is a uniformly random open pivot with that probability instead, and
  the best of many such rollouts is kept (a search of the same budget as the agent's);
* *random* plans: every cut a uniformly random open pivot, evaluated in batches, for a number of plans
  or for a wall-clock budget.

Every completed plan is one simulator call (:func:`~archplace.simulators.pipeline.evaluate`), the unit
in which budgets are compared; features are the environment's cheap estimate, as for the agent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...simulators.pipeline import evaluate
from .pipeline_env import PipelineCutEnv


@dataclass
class RuleSearch:
    """Best of ``plans`` plans; ``history[i]`` is the best feasible L after plan ``i + 1`` (inf until one)."""

    best_cuts: np.ndarray | None
    best_length_s: float
    best_oom: bool
    first_cuts: np.ndarray | None     # the first plan (for epsilon = 0: the deterministic rule's plan)
    first_length_s: float
    plans: int
    wall_s: float
    history: np.ndarray


def _walk(env: PipelineCutEnv, choose) -> np.ndarray | None:
    """One plan: cut after cut, ``choose(open_indices)`` picks an index into ``env.pivots``."""
    env.cuts = []
    while len(env.cuts) < env.num_stages - 1:
        open_ = np.flatnonzero(env._mask())
        if not len(open_):
            return None   # dead end (overlapping windows)
        env.cuts.append(int(env.pivots[choose(open_)]))
    return np.asarray(env.cuts, dtype=np.int64)


def _score(env: PipelineCutEnv, plans: list[np.ndarray | None]) -> np.ndarray:
    """L of each plan, inf for a dead end or (unless the env ignores memory) an OOM plan."""
    out = np.full(len(plans), np.inf)
    ok = [i for i, p in enumerate(plans) if p is not None]
    if ok:
        r = evaluate(env.profile, env.cluster, np.stack([plans[i] for i in ok]))
        length = np.where(r.oom & (not env.ignore_memory), np.inf, r.length_s)
        out[ok] = length
    return out


def _result(plans: list, lengths: np.ndarray, t0: float) -> RuleSearch:
    hist = np.minimum.accumulate(lengths) if len(lengths) else np.zeros(0)
    i = int(np.argmin(lengths)) if len(lengths) else 0
    feasible = bool(len(lengths)) and np.isfinite(lengths[i])
    return RuleSearch(plans[i] if feasible else None, float(lengths[i]) if feasible else np.inf, not feasible,
                      plans[0] if plans else None, float(lengths[0]) if len(lengths) else np.inf,
                      len(plans), time.perf_counter() - t0, hist)


def lookahead_rule(env: PipelineCutEnv, plans: int = 1, *, epsilon: float = 0.0, seed: int = 0) -> RuleSearch:
    """Best of ``plans`` rollouts of the lookahead-feature argmax, each cut random with prob. ``epsilon``."""
    if not env.lookahead:
        raise ValueError("the lookahead rule needs the env's lookahead feature (lookahead: True)")
    if plans < 1 or not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"plans must be >= 1 and epsilon in [0, 1], got {plans}, {epsilon}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    col = 3   # the lookahead column comes right after the paper's three (raw columns follow it)

    def choose(open_: np.ndarray) -> int:
        if epsilon > 0 and rng.random() < epsilon:
            return int(rng.choice(open_))
        f = env._features()[open_, col]
        return int(open_[int(np.argmax(f))])

    saved = env.cuts
    found = [_walk(env, choose) for _ in range(plans)]
    env.cuts = saved
    return _result(found, _score(env, found), t0)


def random_plans(env: PipelineCutEnv, plans: int | None = None, *, wall_s: float | None = None, seed: int = 0,
                 chunk: int = 256, max_plans: int = 1_000_000) -> RuleSearch:
    """Best of ``plans`` uniformly random valid plans, or of as many as fit in ``wall_s`` seconds."""
    if (plans is None) == (wall_s is None):
        raise ValueError("give exactly one of plans and wall_s")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    saved = env.cuts
    found: list[np.ndarray | None] = []
    lengths: list[np.ndarray] = []
    target = plans if plans is not None else max_plans
    while len(found) < target:
        batch = [_walk(env, lambda o: int(rng.choice(o))) for _ in range(min(chunk, target - len(found)))]
        found += batch
        lengths.append(_score(env, batch))
        if wall_s is not None and time.perf_counter() - t0 >= wall_s:
            break
    env.cuts = saved
    return _result(found, np.concatenate(lengths) if lengths else np.zeros(0), t0)
