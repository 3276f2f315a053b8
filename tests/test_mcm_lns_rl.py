"""The learned-neighbourhood environment and PPO-LNS (issue 17): action decoding and masks against their
definitions, the env's incumbent never gets worse and its reward is the log improvement per second,
the wall-time budget holds, and a short PPO-LNS search on Ray returns a valid partition no worse than
greedy."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from archplace.algorithms.rl.mcm_lns_env import (
    ACTIONS,
    FULL_ACTION,
    NODES_ACTION,
    OBS_SIZE,
    WIDTHS,
    MCMLNSEnv,
    action_mask,
    decode,
    neighbourhood,
)
from archplace.algorithms.search.mcm_baselines import greedy
from archplace.hardware.presets import mcm_package
from archplace.simulators.mcm import MCMProblem, evaluate
from archplace.workloads.synthetic import rnn_graph


@pytest.fixture(scope="module")
def lstm8() -> MCMProblem:
    g = rnn_graph(2, 256, 101, batch=32, cell="lstm", bytes_per_element=1)  # lstm-s0 of bench/mcm/mcm.py
    return MCMProblem.from_graph(g, mcm_package(8))


def test_decode_covers_every_window_once():
    seen = set()
    for a in range(ACTIONS):
        kind, w, o, s = decode(a)
        if kind == "window":
            assert w in WIDTHS and 0 <= o < 8 and s in (0, 2)
            seen.add((w, o, s))
    assert len(seen) == ACTIONS - 2
    assert decode(NODES_ACTION)[0] == "nodes" and decode(FULL_ACTION)[0] == "full"


def test_mask_allows_exactly_the_windows_holding_the_slowest_chip(lstm8):
    f, _ = greedy(lstm8)
    lat = evaluate(lstm8, f).latency_s[0]
    top = int(f.max())
    b = int(np.argmax(lat[:top + 1]))
    m = action_mask(lstm8, f, b)
    assert m[NODES_ACTION] == 1
    for a in np.flatnonzero(m[:NODES_ACTION]):
        nb = neighbourhood(lstm8, f, b, int(a), np.random.default_rng(0))
        chips = set(range(int(nb.lo.min()), int(nb.hi.max()) + 1)) if nb.free.size else set()
        assert b in chips  # every allowed window can lower the maximum
        _, w, o, s = decode(int(a))
        assert o < w and b - o >= 0
        if s:
            assert b - o + w - 1 >= top and top < lstm8.num_chips - 1
    # a window that starts above the slowest chip is never allowed
    for a in range(NODES_ACTION):
        _, w, o, _ = decode(a)
        if o >= w:
            assert m[a] == 0


def test_env_incumbent_monotone_reward_is_log_gain_per_second(lstm8):
    env = MCMLNSEnv({"problems": [lstm8], "seed": 3, "subsolve_s": 0.5, "episode_steps": 6})
    obs, info = env.reset()
    assert obs["observations"].shape == (OBS_SIZE,) and obs["action_mask"].shape == (ACTIONS,)
    L = info["max_latency_s"]
    assert L == pytest.approx(float(evaluate(lstm8, greedy(lstm8)[0]).max_latency_s[0]))
    rng = np.random.default_rng(0)
    done = False
    while not done:
        a = int(rng.choice(np.flatnonzero(obs["action_mask"])))
        obs, r, done, _, info = env.step(a)
        L2 = info["max_latency_s"]
        assert L2 <= L * (1 + 1e-12)
        if info["improved"]:
            assert r == pytest.approx(math.log(L / L2) / max(info["subsolve_wall_s"], 0.05), rel=1e-6)
        else:
            assert r == pytest.approx(0.0, abs=1e-9)
        L = L2
    best_L, best_f = env.best[0]
    assert best_L == pytest.approx(L) and evaluate(lstm8, best_f).valid[0]


def test_env_budget_reward_sums_to_the_log_improvement_of_the_episode(lstm8):
    env = MCMLNSEnv({"problems": [lstm8], "seed": 5, "subsolve_s": 0.3, "reward": "budget", "episode_s": 1.5})
    obs, info = env.reset()
    L0 = L = info["max_latency_s"]
    progress = obs["observations"][OBS_SIZE - len(WIDTHS) - 6]  # the progress feature (module doc)
    assert progress == 0.0
    rng = np.random.default_rng(1)
    done, total, spent, steps = False, 0.0, 0.0, 0
    while not done:
        a = int(rng.choice(np.flatnonzero(obs["action_mask"])))
        obs, r, done, _, info = env.step(a)
        steps += 1
        spent += info["subsolve_wall_s"]
        assert r == pytest.approx(math.log(L / info["max_latency_s"]), abs=1e-12)  # not divided by time
        L = info["max_latency_s"]
        total += r
        assert done == (spent >= 1.5 - 1e-3)
        progress = obs["observations"][OBS_SIZE - len(WIDTHS) - 6]
        assert progress == pytest.approx(min(spent / 1.5, 1.0), rel=1e-5)
    assert total == pytest.approx(math.log(L0 / L), rel=1e-9, abs=1e-12) and steps >= 1
    with pytest.raises(ValueError, match="'reward'"):
        MCMLNSEnv({"problems": [lstm8], "reward": "speed"})


def test_env_deadline_ends_the_episode_without_solving(lstm8):
    env = MCMLNSEnv({"problems": [lstm8], "deadline": time.time() - 1})
    obs, _ = env.reset()
    _, r, done, _, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    assert done and r == 0.0 and info["status"] == "BUDGET" and env.subsolves == 0


def test_ppo_lns_search_short(ray_session, lstm8):
    from archplace.algorithms.rl.mcm_lns_ppo import ppo_lns_search

    g_tp = greedy(lstm8)[1]
    run = ppo_lns_search(lstm8, 12.0, seed=0, ppo={"train_batch_size_per_learner": 8, "minibatch_size": 4})
    assert evaluate(lstm8, run.partition).valid[0]
    assert run.throughput == pytest.approx(float(evaluate(lstm8, run.partition).throughput[0]))
    assert run.throughput >= g_tp * (1 - 1e-12) and run.seed_throughput == pytest.approx(g_tp)
    assert run.subsolves >= 1 and run.iterations >= 1
    # that the 12 s budget binds is not timed here (a wall-clock bound depends on the machine's load);
    # test_env_deadline_ends_the_episode_without_solving checks the env's side, and on a fake clock
    # test_mcm_lns_hint::test_train_samples_does_not_start_an_iteration_past_the_deadline checks the
    # rule this loop shares (no iteration started that would end past the deadline)
    assert run.trace_max_latency_s == sorted(run.trace_max_latency_s, reverse=True)
