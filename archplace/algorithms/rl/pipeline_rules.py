"""Plans for the pipeline-cut environment made without learning, from the same information the DQN sees.

These are the baselines an RL result has to beat (``bench/automap/pipeline.py``):

* the *lookahead rule*: at every cut take the open pivot whose fourth feature (``L_unit / L`` of the
  tentative plan, exact at the last cut) is largest — the DQN's own input, argmaxed, with no network;
  with ``epsilon > 0`` each cut is a uniformly random open pivot with that probability instead, and
  the best of many such rollouts is kept (a search of the same budget as the agent's);
* *random* plans: every cut a uniformly random open pivot, evaluated in batches, for a number of plans
  or for a wall-clock budget.

Budgets are in cost-model evaluations (issue 31), counted as for the agent: every completed plan is one
simulator call (:func:`~archplace.simulators.pipeline.evaluate`, ``sim_calls``) and every open pivot
whose feature row is scored is one more (``feature_calls``). With ``budget`` a search stops before an
evaluation that would exceed it and says so (``budget_exhausted``); a random plan scores no features, so
at an equal budget random search completes many more plans than the rule or the agent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

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
    sim_calls: int = 0            # completed plans scored by the simulator
    feature_calls: int = 0        # open pivots whose feature row was scored
    budget: int | None = None     # in cost-model evaluations (None: ``plans`` plans)
    budget_exhausted: bool = False

    @property
    def calls(self) -> int:
        """Cost-model evaluations: simulator calls plus feature evaluations."""
        return self.sim_calls + self.feature_calls


class _Stop(Exception):
    """The budget cannot pay for the next evaluation."""


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
        r = env.evaluate_plans(np.stack([plans[i] for i in ok]))
        length = np.where(r.oom & (not env.ignore_memory), np.inf, r.length_s)
        out[ok] = length
    return out


def _result(plans: list, lengths: np.ndarray, t0: float, env: PipelineCutEnv, calls0: tuple[int, int],
            budget: int | None, exhausted: bool) -> RuleSearch:
    hist = np.minimum.accumulate(lengths) if len(lengths) else np.zeros(0)
    i = int(np.argmin(lengths)) if len(lengths) else 0
    feasible = bool(len(lengths)) and np.isfinite(lengths[i])
    return RuleSearch(plans[i] if feasible else None, float(lengths[i]) if feasible else np.inf, not feasible,
                      plans[0] if plans else None, float(lengths[0]) if len(lengths) else np.inf,
                      len(plans), time.perf_counter() - t0, hist, env.sim_calls - calls0[0],
                      env.feature_calls - calls0[1], budget, exhausted)


def _check_budget(budget: int | None) -> None:
    if budget is not None and (isinstance(budget, bool) or int(budget) != budget or budget < 1):
        raise ValueError(f"budget is {budget!r}; allowed: None or an integer >= 1 cost-model evaluations")


def lookahead_rule(env: PipelineCutEnv, plans: int | None = 1, *, epsilon: float = 0.0, seed: int = 0,
                   budget: int | None = None) -> RuleSearch:
    """Best of ``plans`` rollouts of the lookahead-feature argmax, each cut random with prob. ``epsilon``;
    with ``budget`` (and ``plans=None``), of as many rollouts as ``budget`` cost-model evaluations pay for
    (a rollout the budget cannot finish is dropped, and nothing past the budget is evaluated)."""
    if not env.lookahead:
        raise ValueError("the lookahead rule needs the env's lookahead feature (lookahead: True)")
    _check_budget(budget)
    if (plans is None) == (budget is None) or (plans is not None and plans < 1) or not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"give plans >= 1 or a budget, and epsilon in [0, 1]; got plans {plans}, budget "
                         f"{budget}, epsilon {epsilon}")
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    col = 3   # the lookahead column comes right after the paper's three (raw columns follow it)
    calls0 = (env.sim_calls, env.feature_calls)
    found: list[np.ndarray | None] = []

    def spent() -> int:   # evaluations so far, with one simulator call owed per plan found
        return env.sim_calls - calls0[0] + env.feature_calls - calls0[1] + sum(p is not None for p in found)

    def choose(open_: np.ndarray) -> int:
        if epsilon > 0 and rng.random() < epsilon:
            return int(rng.choice(open_))
        if budget is not None and spent() + len(open_) + 1 > budget:   # features + this plan's call
            raise _Stop
        f = env._features(open_)[:, col]
        return int(open_[int(np.argmax(f))])

    saved = env.cuts
    exhausted = False
    while plans is None or len(found) < plans:
        if budget is not None and spent() + 1 > budget:
            exhausted = True
            break
        try:
            found.append(_walk(env, choose))
        except _Stop:
            exhausted = True
            break
    env.cuts = saved
    return _result(found, _score(env, found), t0, env, calls0, budget, exhausted)


def _random_batch(env: PipelineCutEnv, n: int, rng: np.random.Generator) -> list[np.ndarray | None]:
    """``n`` random plans at once: at every cut a uniformly random open pivot (the mask of ``_mask`` for
    each plan's last cut, vectorised over the plans); a plan with no open pivot is a dead end (None)."""
    prof, k = env.profile, env.num_stages
    tv = prof.trainable_prefix
    piv = env.pivots
    last = np.zeros(n, np.int64)
    alive = np.ones(n, bool)
    cuts = np.zeros((n, k - 1), np.int64)
    for j in range(k - 1):
        ok = env.window[j][None, :] & (piv[None, :] > last[:, None])
        ok &= (tv[piv][None, :] - tv[last][:, None]) >= 1
        ok &= (tv[-1] - tv[piv] >= k - j - 1)[None, :]
        count = ok.sum(axis=1)
        alive &= count > 0
        pick = np.minimum((rng.random(n) * count).astype(np.int64), np.maximum(count - 1, 0))
        # the pick-th open pivot of each row: the first position where the running count passes it
        idx = np.argmax(np.cumsum(ok, axis=1) > pick[:, None], axis=1)
        cuts[:, j] = np.where(alive, piv[idx], 0)
        last = np.where(alive, piv[idx], last)
    return [cuts[i] if alive[i] else None for i in range(n)]


def random_plans(env: PipelineCutEnv, plans: int | None = None, *, wall_s: float | None = None, seed: int = 0,
                 chunk: int = 256, max_plans: int = 1_000_000, budget: int | None = None) -> RuleSearch:
    """Best of ``plans`` uniformly random valid plans, of as many as ``budget`` simulator calls pay for
    (one per completed plan: a random cut scores no feature), or of as many as fit in ``wall_s``
    seconds; exactly one of the three. Plans are drawn ``chunk`` at a time, vectorised."""
    if sum(x is not None for x in (plans, wall_s, budget)) != 1:
        raise ValueError("give exactly one of plans, wall_s and budget")
    _check_budget(budget)
    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    calls0 = (env.sim_calls, env.feature_calls)
    found: list[np.ndarray | None] = []
    lengths: list[np.ndarray] = []
    target = plans if plans is not None else max_plans
    complete = 0
    while len(found) < target and (budget is None or complete < budget):
        n = min(chunk, target - len(found)) if budget is None else min(chunk, budget - complete)
        batch = _random_batch(env, n, rng)
        found += batch
        complete += sum(p is not None for p in batch)
        lengths.append(_score(env, batch))
        if wall_s is not None and time.perf_counter() - t0 >= wall_s:
            break
    return _result(found, np.concatenate(lengths) if lengths else np.zeros(0), t0, env, calls0, budget,
                   budget is not None and complete >= budget)
