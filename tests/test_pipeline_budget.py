"""Pipeline budgets in cost-model evaluations (issue 31): every simulator call and every feature row a
method scores is counted, the counts equal an independent count made by wrapping the cost model, and a
search with budget B never makes more than B evaluations."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.algorithms.rl import pipeline_env
from archplace.hardware.presets import v100_cluster


class Counter:
    """Wraps the env module's cost model: ``evaluate`` (complete plans, one per row of cuts) and
    ``allocate_devices`` (called once per feature computation, one row per tentative plan)."""

    def __init__(self, monkeypatch, module=pipeline_env, features: bool = True):
        self.sims = 0
        self.features = 0
        ev = module.evaluate

        def evaluate(prof, cluster, cuts):
            self.sims += len(cuts)
            return ev(prof, cluster, cuts)

        monkeypatch.setattr(module, "evaluate", evaluate)
        if features:
            alloc = module.allocate_devices

            def allocate(comp, devices):
                self.features += comp.shape[0]
                return alloc(comp, devices)

            monkeypatch.setattr(module, "allocate_devices", allocate)

    @property
    def total(self) -> int:
        return self.sims + self.features


def _env(cluster="C", k=4, **kw):
    from test_pipeline_rl import bert_profile

    return pipeline_env.PipelineCutEnv({"profile": bert_profile(), "cluster": v100_cluster(cluster),
                                        "num_stages": k, **kw})


def test_env_counts_every_open_pivot_and_every_plan(monkeypatch):
    env = _env()
    count = Counter(monkeypatch)
    rng = np.random.default_rng(0)
    opened = plans = 0
    for _ in range(20):
        obs, _ = env.reset()
        done = False
        while not done:
            m = np.flatnonzero(obs["action_mask"])
            opened += len(m)
            assert not obs["pivots"][obs["action_mask"] == 0].any()   # closed pivots are not scored
            obs, _, done, _, info = env.step(int(rng.choice(m)))
            plans += "length_s" in info
    assert plans == 20 and env.sim_calls == count.sims == 20
    assert env.feature_calls == count.features == opened        # closed form: the open pivots seen
    assert env.calls == count.total and env.live_steps == 20 * 3


@pytest.mark.parametrize("budget", [0, 1, 150, 1000])
def test_env_never_exceeds_its_budget(monkeypatch, budget):
    env = _env(eval_budget=budget)
    count = Counter(monkeypatch)
    rng = np.random.default_rng(1)
    truncated = 0
    for _ in range(40):
        obs, info = env.reset()
        done = trunc = False
        while not (done or trunc):
            obs, _, done, trunc, info = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
        truncated += trunc
        assert env.calls == count.total <= budget
    assert env.exhausted and truncated and info == {"budget_exhausted": True}
    spent = env.calls
    env.reset()
    assert env.step(0)[3] and env.calls == spent      # out of budget: nothing more is evaluated
    # once exhausted, nothing is scored even where what is left would pay for a smaller cut's features
    # (exhaustion at a wide cut, then a reset to a narrower first cut)
    e = _env(eval_budget=10**6)
    e.reset()
    e.exhausted = True
    before = e.calls
    obs, info = e.reset()
    assert info == {"budget_exhausted": True} and e.calls == before and obs["action_mask"].sum() == 1
    assert e.step(0)[3] and e.calls == before
    # however the budget ran out (at a first cut or in mid-episode), later observations score nothing
    for b in range(0, 700, 7):
        e = _env(eval_budget=b)
        obs, _ = e.reset()
        for _ in range(30):
            obs, _, done, trunc, _ = e.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            if done or trunc:
                obs, _ = e.reset()
        assert e.exhausted and e.calls <= b
        before = e.calls
        for _ in range(10):
            obs, _, done, trunc, _ = e.step(int(np.flatnonzero(obs["action_mask"])[-1]))
            assert trunc and e.calls == before
    with pytest.raises(ValueError, match="eval_budget is -1"):
        _env(eval_budget=-1)


def test_rules_count_and_stop_at_the_budget(monkeypatch):
    from archplace.algorithms.rl.pipeline_rules import lookahead_rule, random_plans

    env = _env()
    count = Counter(monkeypatch)
    r = lookahead_rule(env, None, budget=5000, epsilon=0.1, seed=0)
    assert r.budget_exhausted and r.calls == count.total <= 5000
    assert (r.sim_calls, r.feature_calls) == (count.sims, count.features) and r.sim_calls == r.plans
    # the budget is spent up to less than one rollout's worth (at most every window plus one call)
    assert 5000 - r.calls <= int(env.window.sum()) + 1
    one = lookahead_rule(env, 1)
    assert one.sim_calls == one.plans == 1 and 0 < one.feature_calls <= int(env.window.sum())
    before = count.total
    rp = random_plans(env, budget=700, seed=0)
    assert rp.sim_calls == rp.plans == 700 == count.total - before and rp.feature_calls == 0
    assert rp.budget_exhausted
    with pytest.raises(ValueError, match="exactly one"):
        random_plans(env, 10, budget=10)
    with pytest.raises(ValueError, match="budget is 0"):
        lookahead_rule(env, None, budget=0)


def test_dp_counts_its_simulator_calls(monkeypatch):
    from test_pipeline_rl import bert_profile

    from archplace.algorithms.solvers import pipeline_dp

    count = Counter(monkeypatch, pipeline_dp, features=False)
    dp = pipeline_dp.solve_dp(bert_profile(), v100_cluster("C"), 4)
    assert dp.plan_evaluations == count.sims > 0 and dp.evaluated > 0


def test_dqn_search_spends_at_most_its_budget_and_reports_it(ray_session, monkeypatch):
    """Through the API: the JSON's counts equal the independent count, the total never exceeds the
    budget, the search says it stopped there, and every completed plan (and the greedy one) is one
    simulator call."""
    from archplace import api

    count = Counter(monkeypatch)
    budget = 40 * 489 + 111    # bert-48 on cluster A: one cut, 488 candidates
    res = api.pipeline(api.PipelineRequest("bert-48", cluster="A", algo="rainbow", budget=budget)).to_dict()
    assert res["budget"] == budget and res["stopped"] == "budget" and res["budget_exhausted"]
    assert res["simulator_calls"] == count.total <= budget
    assert (res["env_step_calls"], res["feature_calls"]) == (count.sims, count.features)
    assert res["env_step_calls"] == res["plans_evaluated"] + 1 and res["plans_evaluated"] >= 39
    assert res["simulator_calls"] == res["env_step_calls"] + res["feature_calls"]
    assert res["greedy_calls"] <= 489 and res["gap"] >= -1e-12
    with pytest.raises(api.InvalidRequest, match="budget"):
        api.pipeline(api.PipelineRequest("bert-48", cluster="A", algo="rainbow", budget=0))


def test_learning_off_control_keeps_the_initial_q_network(ray_session):
    """``learning=False``: the same search with no Q update, so the weights it ends with are the seeded
    initial ones, while the learning search changes them."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from test_pipeline_rl import bert_profile

    from archplace.algorithms.rl.pipeline_dqn import build_dqn, dqn_search

    prof, cl = bert_profile(), v100_cluster("B")
    off = dqn_search(prof, cl, 3, 150 * 164, seed=5, learning=False, keep_state=True)
    on = dqn_search(prof, cl, 3, 150 * 164, seed=5, keep_state=True)
    env = _env("B", 3)
    algo = build_dqn({"profile": prof, "cluster": cl, "num_stages": 3, "candidates": env.cand}, seed=5)
    try:
        init = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    assert not off.learning and on.learning and off.simulator_calls <= 150 * 164
    same = [torch.equal(torch.as_tensor(init[k]), torch.as_tensor(off.state[k])) for k in init]
    moved = [torch.equal(torch.as_tensor(init[k]), torch.as_tensor(on.state[k])) for k in init]
    assert all(same) and not all(moved)
