"""GDP's one-step environment (issue 18): observations in topological order with padded edges, the
reward is -sqrt(simulated step time) or -10 for an invalid placement, episodes cycle through the graphs,
and the best valid placement per graph is kept."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archplace.algorithms.rl.gdp_env import INVALID_REWARD, GDPEnv, GDPGraph
from archplace.simulators.gpu_placement import PlacementProblem, simulate


def chain_problem(n: int, d: int, *, prio=None, resident=None, mem=1e12) -> PlacementProblem:
    return PlacementProblem([1e-3] * n, [1e6] * n, resident if resident is not None else [0] * n,
                            list(range(n - 1)), list(range(1, n)), [1e6] * (n - 1), [-1] * n,
                            prio if prio is not None else list(range(n)), d, mem, 10e9, 1e-5, "pcie")


def test_observation_is_in_topological_order_and_padded():
    # priority reversed relative to row order: row 2 is first in the topological order
    p = PlacementProblem([1e-3] * 3, [0] * 3, [0] * 3, [2, 1], [1, 0], [0, 0], [-1] * 3, [2, 1, 0], 2, 1e12,
                         10e9, 1e-5, "pcie")
    feats = np.array([[0.0], [1.0], [2.0]], np.float32)
    g = GDPGraph(p, feats, "rev")
    big = GDPGraph(chain_problem(5, 4), np.zeros((5, 1), np.float32), "chain5")
    env = GDPEnv({"graphs": [g, big], "max_devices": 4})
    obs, info = env.reset(options={"graph": 0})
    assert obs["x"].shape == (5, 1) and obs["x"][:3, 0].tolist() == [2.0, 1.0, 0.0]
    assert obs["x"][3:].sum() == 0
    assert obs["edge_index"].shape == (2, 4)
    assert obs["edge_index"][:, :2].tolist() == [[0, 1], [1, 2]]  # 2->1, 1->0 by position
    assert (obs["edge_index"][:, 2:] == -1).all()
    assert obs["num_nodes"].tolist() == [3] and obs["num_devices"].tolist() == [2]
    assert env.observation_space.contains(obs)
    # action by position -> placement by op: position 0 is op 2
    action = np.array([1, 0, 0, 3, 3])
    assert g.placement_of(action).tolist() == [0, 0, 1]


def test_reward_is_minus_sqrt_step_time_and_the_best_is_kept():
    p = chain_problem(4, 2)
    env = GDPEnv({"graphs": [GDPGraph(p, np.zeros((4, 2), np.float32), "c4")], "max_devices": 2})
    env.reset()
    _, r, term, trunc, info = env.step(np.array([0, 1, 0, 1]))
    t = simulate(p, [0, 1, 0, 1]).step_time_s
    assert term and not trunc and info["valid"]
    assert r == pytest.approx(-math.sqrt(t)) and info["step_time_s"] == pytest.approx(t)
    env.reset()
    _, r2, *_ = env.step(np.zeros(4, np.int64))
    assert r2 == pytest.approx(-math.sqrt(4e-3)) and r2 > r
    assert env.best[0][0] == pytest.approx(4e-3) and env.best[0][1].tolist() == [0, 0, 0, 0]


def test_invalid_placement_gets_minus_ten():
    p = chain_problem(3, 2, resident=[6e9, 6e9, 6e9], mem=16e9)
    env = GDPEnv({"graphs": [GDPGraph(p, np.zeros((3, 1), np.float32))], "max_devices": 2})
    env.reset()
    _, r, _, _, info = env.step(np.zeros(3, np.int64))
    assert r == INVALID_REWARD and not info["valid"] and info["oom"]
    _, _ = env.reset()
    _, r, _, _, info = env.step(np.array([0, 0, 1]))
    assert info["valid"] and r == pytest.approx(-math.sqrt(simulate(p, [0, 0, 1]).step_time_s))
    assert 0 in env.best


def test_episodes_cycle_through_graphs_and_devices_past_d_are_refused():
    gs = [GDPGraph(chain_problem(n, 2), np.zeros((n, 1), np.float32), f"c{n}") for n in (2, 3, 4)]
    env = GDPEnv({"graphs": gs, "max_devices": 4, "seed": 1})
    seen = [env.reset()[1]["graph_index"] for _ in range(6)]
    assert sorted(seen[:3]) == [0, 1, 2] and seen[3:] == seen[:3]
    env.reset(options={"graph": 0})
    with pytest.raises(ValueError, match="device 3"):
        env.step(np.array([3, 0, 0, 0]))
    with pytest.raises(ValueError, match="max_devices"):
        GDPEnv({"graphs": [GDPGraph(chain_problem(2, 8), np.zeros((2, 1), np.float32))], "max_devices": 4})


def test_a_colocation_group_follows_its_first_op():
    # ops 0..3 in a chain; ops 1 and 3 form group 7, ops 0 and 2 are free; priority = row order
    p = PlacementProblem([1e-3] * 4, [0] * 4, [0] * 4, [0, 1, 2], [1, 2, 3], [0] * 3, [-1, 7, -1, 7],
                         list(range(4)), 2, 1e12, 10e9, 1e-5, "pcie")
    g = GDPGraph(p, np.zeros((4, 1), np.float32))
    assert g.placement_of(np.array([1, 0, 1, 1])).tolist() == [1, 0, 1, 0]  # op 3 follows op 1
    env = GDPEnv({"graphs": [g], "max_devices": 2})
    env.reset()
    _, r, _, _, info = env.step(np.array([0, 1, 0, 0]))
    assert info["valid"] and not info["coloc_violated"]
