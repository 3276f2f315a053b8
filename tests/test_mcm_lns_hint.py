"""Budgeted learned LNS (issue 31): action encoding and masks, per-node domain restrictions held by the
sub-solve, deterministic budgets (two identical runs give identical results, whatever the load), the
return is the log improvement, the controls' action choices, and a learning test that fails when PPO
stops learning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archplace.algorithms.rl.mcm_lns_hint import (
    ACTIONS,
    RADII,
    WINDOW_ACTIONS,
    MCMHintEnv,
    RuleChooser,
    UniformChooser,
    _chips,
    action_mask,
    decode,
    encode,
    neighbourhood,
    search,
)
from archplace.algorithms.search.mcm_baselines import greedy
from archplace.algorithms.solvers.mcm_lns import lns, solve_neighbourhood
from archplace.hardware.presets import mcm_package
from archplace.simulators.mcm import MCMProblem, evaluate
from archplace.workloads.synthetic import layered_dag

DET = 0.02  # CP-SAT deterministic units per sub-solve in these tests (tiny models)


@pytest.fixture(scope="module")
def dag24() -> MCMProblem:
    g = layered_dag(24, 3, 5, batch=1, seq=128, hidden=256, max_skip=2, bytes_per_element=1)
    return MCMProblem.from_graph(g, mcm_package(8))


@pytest.fixture(scope="module")
def dag60() -> MCMProblem:
    g = layered_dag(60, 5, 9, batch=1, seq=128, hidden=256, max_skip=2, bytes_per_element=1)
    return MCMProblem.from_graph(g, mcm_package(12))


@pytest.fixture(scope="module")
def start(dag60) -> np.ndarray:
    return greedy(dag60)[0]


def test_encode_decode_roundtrip_and_bad_action():
    seen = set()
    for a in range(ACTIONS):
        kind, w, pos, r = decode(a)
        assert encode(kind, w, pos, r) == a
        seen.add((kind, w, pos, r))
    assert len(seen) == ACTIONS and decode(WINDOW_ACTIONS)[0] == "nodes"
    with pytest.raises(ValueError, match="action"):
        decode(ACTIONS)


def test_mask_windows_hold_the_slowest_chip_and_are_distinct(dag60, start):
    f = start
    lat = evaluate(dag60, f).latency_s[0]
    b = int(np.argmax(lat[:int(f.max()) + 1]))
    m = action_mask(dag60, f, b)
    assert m[WINDOW_ACTIONS:].tolist() == [1.0] * len(RADII)
    chips: dict[tuple[int, int | None], set] = {}
    for a in np.flatnonzero(m[:WINDOW_ACTIONS]):
        _, w, pos, r = decode(int(a))
        lo, hi = _chips(dag60, f, b, w, pos)
        assert lo <= b <= hi  # every allowed window can lower the maximum
        key = (lo, hi)
        assert key not in chips.setdefault((w, r), set())  # no two positions cover the same chips
        chips[(w, r)].add(key)


def test_radius_restriction_holds_in_the_sub_solve(dag60, start):
    f = start
    lat = evaluate(dag60, f).latency_s[0]
    b = int(np.argmax(lat[:int(f.max()) + 1]))
    for r in (1, 2):
        nb = neighbourhood(dag60, f, b, encode("window", 6, 1, r), np.random.default_rng(0))
        assert np.all(nb.lo >= f[nb.free] - r) and np.all(nb.hi <= f[nb.free] + r)
        sub = solve_neighbourhood(dag60, f, nb, det_time=0.2)
        assert sub.partition is not None and sub.det_time > 0
        assert np.abs(sub.partition - f).max() <= r  # no node moved further than its radius
        fixed = np.setdiff1d(np.arange(dag60.num_nodes), nb.free)
        assert np.array_equal(sub.partition[fixed], f[fixed])


def test_deterministic_budget_runs_are_identical(dag60, start):
    f = start
    a = lns(dag60, f, 600.0, seed=3, max_subsolves=6, subsolve_det=DET)
    b = lns(dag60, f, 600.0, seed=3, max_subsolves=6, subsolve_det=DET)
    assert a.subsolves == b.subsolves == 6 and a.stopped == "subsolves"
    assert np.array_equal(a.partition, b.partition) and a.max_latency_s == b.max_latency_s
    assert a.trace_max_latency_s.tolist() == b.trace_max_latency_s.tolist()
    assert a.det_time > 0
    with pytest.raises(ValueError, match="subsolve_det"):
        lns(dag60, f, 10.0, subsolve_det=0.0)
    s1 = search(dag60, f, UniformChooser(), 5, seed=1, det_time=DET)
    s2 = search(dag60, f, UniformChooser(), 5, seed=1, det_time=DET)
    assert s1.trace_max_latency_s == s2.trace_max_latency_s and s1.subsolves == 5
    assert np.array_equal(s1.partition, s2.partition) and s1.actions == s2.actions


def test_env_return_is_the_log_improvement_and_incumbent_monotone(dag60, start):
    env = MCMHintEnv({"problems": [dag60], "starts": [start], "seed": 2, "episode_steps": 5,
                      "det_time": DET})
    obs, info = env.reset(options={"graph": 0})
    L0 = L = info["max_latency_s"]
    rng = np.random.default_rng(0)
    total, done = 0.0, False
    while not done:
        obs, r, done, _, info = env.step(UniformChooser()(obs, rng))
        assert info["max_latency_s"] <= L * (1 + 1e-12) and r >= 0
        L = info["max_latency_s"]
        total += r
    assert total == pytest.approx(math.log(L0 / L), abs=1e-12)
    assert evaluate(dag60, env.partition).valid[0]
    assert float(evaluate(dag60, env.partition).max_latency_s[0]) == pytest.approx(L)


def test_controls_choose_as_defined(dag60, start):
    env = MCMHintEnv({"problems": [dag60], "starts": [start], "episode_steps": 1})
    obs, _ = env.reset(options={"graph": 0})
    rng = np.random.default_rng(0)
    rule = [decode(RuleChooser()(obs, rng)) for _ in range(400)]
    assert all(r is None for *_, r in rule)  # the rule never restricts domains (as greedy+LNS)
    assert all(w in (2, 3, 4, 6, 8) for k, w, _, _ in rule if k == "window")
    nodes = sum(k == "nodes" for k, *_ in rule) / len(rule)
    assert 0.10 < nodes < 0.20  # p_nodes = 0.15
    uni = [UniformChooser()(obs, rng) for _ in range(400)]
    assert all(obs["action_mask"][a] == 1 for a in uni)
    assert len(set(uni)) > 0.8 * int(obs["action_mask"].sum())


def _expected_reward(chooser, obs, rewards: dict[int, float]) -> float:
    p = chooser.probs(obs)
    return float(sum(p[a] * r for a, r in rewards.items()))


def test_ppo_learns_the_better_neighbourhood_and_not_without_learning(ray_session, dag24):
    """A one-step episode from the greedy partition is a bandit whose every arm's reward is known by
    brute force (the sub-solve is deterministic): the best arm gains far more than the uniform mean, so
    a learned choice is provably better than uniform. A short seeded PPO run must raise the policy's
    expected reward over its own initial weights by a margin; the same run with lr = 0 must not."""
    from archplace.algorithms.rl.mcm_lns_ppo import PolicyChooser, train_hint_policy

    env = MCMHintEnv({"problems": [dag24], "episode_steps": 1, "det_time": DET})
    obs, _ = env.reset(options={"graph": 0})
    rewards = {}
    for a in np.flatnonzero(obs["action_mask"]):
        env.reset(options={"graph": 0})
        rewards[int(a)] = env.step(int(a))[1]
    r = np.array(list(rewards.values()))
    assert r.max() > r.mean() + 0.1  # the learnable margin exists (brute force)
    ppo = {"train_batch_size_per_learner": 32, "minibatch_size": 16, "lr": 1e-2, "entropy_coeff": 0.0,
           "num_epochs": 8}
    res = {}
    for label, extra in (("learn", {}), ("off", {"lr": 0.0})):
        init, final, info = train_hint_policy([dag24], 64, seed=0, det_time=DET, episode_steps=1,
                                              ppo={**ppo, **extra})
        assert info["subsolves"] >= 64
        res[label] = (_expected_reward(PolicyChooser(init), obs, rewards),
                      _expected_reward(PolicyChooser(final), obs, rewards))
    e0, e1 = res["learn"]
    assert e0 < r.mean() + 0.03  # untrained: about uniform
    assert e1 > e0 + 0.03  # learning moved the policy to better arms (measured: 0.066 -> 0.123)
    f0, f1 = res["off"]
    assert f0 == pytest.approx(e0, abs=1e-9)  # the same seeded initial weights
    assert f1 == pytest.approx(f0, abs=1e-9)  # no learning: no gain


def test_train_samples_does_not_start_an_iteration_past_the_deadline(monkeypatch):
    """Paper PPO ran a median 16 s on a 10 s budget: the update after the deadline still ran. With 4 s
    iterations and a 10 s deadline, two iterations run (ending at 8 s); the third would end at 12 s and
    is not started (a fake clock: no wall time in the test)."""
    import types

    from archplace.algorithms.rl import mcm_ppo

    clock = [0.0]
    monkeypatch.setattr(mcm_ppo, "time", types.SimpleNamespace(time=lambda: clock[0]))

    class Algo:
        iterations = 0

        def train(self):
            self.iterations += 1
            clock[0] += 4.0
            return {}

    class Tracker:
        total = 0

        def update(self, res):
            self.total += 10

    algo = Algo()
    tr = mcm_ppo.train_samples(algo, 1000, tracker=Tracker(), deadline=10.0)
    assert algo.iterations == 2 and tr.total == 20 and clock[0] == 8.0 <= 10.0
    clock[0] = 0.0
    algo2 = Algo()
    mcm_ppo.train_samples(algo2, 30, tracker=Tracker())  # no deadline: the sample budget binds
    assert algo2.iterations == 3
