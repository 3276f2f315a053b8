"""The MCM repair as a module-to-env connector: what the env evaluates, what the episode trains on,
and the policy's own probabilities for SAMPLE (issue 16 item 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archplace.algorithms.rl.mcm_env import MCMPartitionEnv
from archplace.hardware.presets import mcm_package
from archplace.simulators.mcm import MCMProblem, evaluate, static_valid
from archplace.workloads.synthetic import layered_dag

TINY = {"hidden": 16, "num_layers": 2, "head_hiddens": [16], "vf_hiddens": [16]}
TINY_PPO = {"episodes_per_iteration": 4}


def _problem(n=16, seed=2):
    g = layered_dag(n, 2, seed=seed, batch=1, seq=64, hidden=128, bytes_per_element=1)
    return MCMProblem.from_graph(g, mcm_package(4))


def test_node_probs_and_joint_logp_closed_form():
    from archplace.algorithms.rl.mcm_connectors import joint_logp, node_probs

    logits = np.array([0.0, np.log(3.0), 0.0, 5.0, 5.0, 5.0])      # 2 nodes x 3 chips
    p = node_probs(logits, 2)
    assert np.allclose(p, [[0.2, 0.6, 0.2], [1 / 3, 1 / 3, 1 / 3]])
    assert joint_logp(logits, [1, 2]) == pytest.approx(np.log(0.6) + np.log(1 / 3), rel=1e-6)
    with pytest.raises(ValueError, match="train_on"):
        from archplace.algorithms.rl.mcm_connectors import repair_connector
        repair_connector("both")


def _sample(algo, steps=8):
    return algo.env_runner.sample(num_timesteps=steps, explore=True)


@pytest.mark.parametrize("train_on", ["sampled", "repaired"])
def test_connector_sends_y_prime_and_the_episode_keeps_the_chosen_action(ray_session, train_on):
    """Every action the env evaluated is statically valid (Eqs. 2-4); the episode holds y' with
    log pi(y') (``repaired``) or the sampled y with log pi(y) (``sampled``), and y != y' wherever the
    sampled y itself was invalid."""
    from ray.rllib.core.columns import Columns

    from archplace.algorithms.rl.mcm_connectors import joint_logp
    from archplace.algorithms.rl.mcm_ppo import build_ppo

    p = _problem()
    torch.manual_seed(0)
    algo = build_ppo([p], num_chips=4, seed=0, model=TINY, ppo=TINY_PPO,
                     env={"rounds": 2, "init": "zeros", "train_on": train_on})
    try:
        episodes = _sample(algo, 16)
    finally:
        algo.stop()
    n, differ, steps = p.num_nodes, 0, 0
    for ep in episodes:
        acts = np.asarray(ep.get_actions())
        infos = ep.get_infos()
        logits = np.asarray(ep.get_extra_model_outputs(Columns.ACTION_DIST_INPUTS))
        logp = np.asarray(ep.get_extra_model_outputs(Columns.ACTION_LOGP))
        for t in range(len(acts)):
            info = infos[t + 1]
            y_rep = np.asarray(info["repaired_action"])
            assert static_valid(p, y_rep[:n][None])[0]
            assert logp[t] == pytest.approx(joint_logp(logits[t], acts[t]), abs=1e-3)
            if train_on == "repaired":
                assert np.array_equal(acts[t], y_rep)
            elif not info["raw_valid"] and info["changed"] > 0:
                assert not np.array_equal(acts[t][:n], y_rep[:n])
                differ += 1
            steps += 1
    assert steps >= 16
    if train_on == "sampled":
        assert differ > 0       # an untrained policy's y is mostly invalid on 4 chips


def test_sample_repair_draws_from_the_policys_probabilities(ray_session):
    """``repair: sample``: the connector hands the env the module's per-node softmax (not the env's
    made-up 0.9 onehot + 0.1 / C), and every repaired node lies where that softmax has mass."""
    from ray.rllib.core.columns import Columns

    from archplace.algorithms.rl.mcm_connectors import node_probs
    from archplace.algorithms.rl.mcm_ppo import build_ppo, env_of

    p = _problem()
    torch.manual_seed(0)
    algo = build_ppo([p], num_chips=4, seed=0, model=TINY, ppo=TINY_PPO,
                     env={"rounds": 2, "init": "zeros", "repair": "sample", "train_on": "sampled"})
    seen = []
    try:
        env = env_of(algo)
        real = env.repair_action

        def spy(y, probs=None):
            seen.append(None if probs is None else np.array(probs))
            return real(y, probs=probs)

        env.repair_action = spy
        episodes = _sample(algo, 8)
    finally:
        algo.stop()
    col = Columns.ACTION_DIST_INPUTS
    logits = [np.asarray(x) for ep in episodes for x in ep.get_extra_model_outputs(col)]
    assert len(seen) >= len(logits) >= 8
    for probs, lg in zip(seen, logits):
        assert probs is not None
        assert np.allclose(probs, node_probs(lg, len(probs)), atol=1e-6)
        assert np.allclose(probs.sum(1), 1.0)


def test_env_alone_still_repairs_what_it_is_given():
    """Without RLlib, ``step`` repairs an unrepaired action itself, and a ``repair_action`` result
    passed to ``step`` is evaluated with that call's bookkeeping (no second repair)."""
    p = _problem()
    env = MCMPartitionEnv({"graphs": [p], "num_chips": 4, "init": "zeros", "seed": 0})
    env.reset()
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, p.num_nodes)
    _, _, _, _, info = env.step(y)
    assert static_valid(p, np.asarray(info["repaired_action"])[None])[0]
    y2 = rng.integers(0, 4, p.num_nodes)
    y_rep = env.repair_action(y2)
    draws = env._rng.bit_generator.state
    _, _, _, _, info2 = env.step(y_rep)
    assert env._rng.bit_generator.state == draws            # no second repair
    assert np.array_equal(info2["repaired_action"], y_rep)
    assert info2["raw_valid"] == bool(evaluate(p, y2).valid[0])   # y's own validity, not y''s
