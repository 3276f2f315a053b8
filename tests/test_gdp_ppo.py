"""GDP's PPO (issue 18): the per-graph running-mean baseline is the paper's advantage, and a seeded short
run improves the sampled step time on a fixed small graph; best-seen and greedy-policy results are
reported apart and each equals the simulator's value for its placement."""

from __future__ import annotations

import numpy as np
import pytest

from archplace.algorithms.rl.gdp_env import GDPGraph
from archplace.simulators.gpu_placement import PlacementProblem, simulate

CHAINS, LENGTH = 4, 6


@pytest.fixture(scope="module")
def chains() -> GDPGraph:
    """Four independent 6-op chains (1 ms per op) joined by a 0.1 ms sink, on 2 GPUs: the optimum puts two
    chains on each GPU (12 ms + one transfer + the sink); all on one GPU takes 24.1 ms."""
    n = CHAINS * LENGTH + 1
    src, dst = [], []
    for c in range(CHAINS):
        src += [c * LENGTH + i for i in range(LENGTH)]
        dst += [c * LENGTH + i + 1 for i in range(LENGTH - 1)] + [n - 1]
    p = PlacementProblem([1e-3] * (n - 1) + [1e-4], [1e5] * n, [0] * n, src, dst, [1e5] * len(src),
                         [-1] * n, list(range(n)), 2, 1e12, 10e9, 1e-5, "pcie")
    feats = np.zeros((n, 4), np.float32)
    feats[:, 0] = 1.0
    feats[:n - 1, 1] = (np.arange(n - 1) // LENGTH) / CHAINS  # which chain
    feats[:, 2] = np.arange(n) / n
    return GDPGraph(p, feats, "chains")


def test_per_graph_running_mean_baseline():
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing

    from archplace.algorithms.rl.gdp_ppo import baseline_connector

    conn = baseline_connector()()
    import torch

    def batch(r, g):
        return {"m": {Columns.REWARDS: torch.tensor(r), Columns.OBS: {"graph": torch.tensor(g)[:, None]}}}

    b1 = conn(rl_module=None, batch=batch([-1.0, -3.0, -10.0, -20.0], [0, 0, 1, 1]), episodes=[])
    raw1 = np.array([1.0, -1.0, 5.0, -5.0])  # first batch of a graph: its own mean (-2, -15)
    adv1 = b1["m"][Postprocessing.ADVANTAGES].numpy()
    assert adv1 == pytest.approx((raw1 - raw1.mean()) / raw1.std(), 1e-6)
    b2 = conn(rl_module=None, batch=batch([-1.0, -14.0], [0, 1]), episodes=[])
    raw2 = np.array([-1.0 - (-2.0), -14.0 - (-15.0)])  # against the mean of all earlier rewards per graph
    assert raw2.std() == 0  # both +1: standardisation leaves zeros (floored std)
    assert b2["m"][Postprocessing.ADVANTAGES].numpy() == pytest.approx([0.0, 0.0], abs=1e-6)
    assert conn.get_state() == {"reward_sum": {0: -5.0, 1: -44.0}, "reward_count": {0: 3, 1: 3}}


def test_short_ppo_run_improves_the_sampled_step_time(ray_session, chains):
    import torch

    from archplace.algorithms.rl.gdp_ppo import gdp_train

    torch.set_num_threads(1)
    run = gdp_train([chains], iterations=30, seed=0, ppo={"lr": 3e-3, "entropy_coeff": 0.0})
    # control (issue 31): the same loop, seed and samples with learning off (lr 0: the policy never moves).
    # The untrained policy's best sample is as good as the trained one's (the optimum has many faces), so
    # only the policy's own placements tell learning apart
    ctl = gdp_train([chains], iterations=30, seed=0, ppo={"lr": 0.0, "entropy_coeff": 0.0})
    m = np.array([row[0] for row in run.sampled_mean_step_time_s])
    m_ctl = np.array([row[0] for row in ctl.sampled_mean_step_time_s])
    print(f"sampled mean first/last 5: learning {m[:5].mean() * 1e3:.2f}/{m[-5:].mean() * 1e3:.2f} ms, "
          f"control {m_ctl[:5].mean() * 1e3:.2f}/{m_ctl[-5:].mean() * 1e3:.2f} ms; greedy learning "
          f"{run.greedy_step_time_s[0] * 1e3:.2f} ms, control {ctl.greedy_step_time_s[0] * 1e3:.2f} ms")
    assert run.iterations == ctl.iterations == 30 and run.samples == ctl.samples == 30 * 16
    # measured (seed 0): sampled mean 17.7 -> 15.9 ms learning, 16.1 -> 16.0 ms control; greedy 14.1 ms
    # learning (both GPUs), 24.1 ms control (the untrained argmax: every op on one GPU); optimum 12.1 ms
    assert m[-5:].mean() < 0.95 * m[:5].mean()  # the policy's samples get faster
    assert run.greedy_step_time_s[0] < 0.9 * ctl.greedy_step_time_s[0]  # the policy itself learned
    assert len(np.unique(run.greedy_placement[0])) == 2
    opt = 12e-3 + 1e-5 + 1e5 / 10e9 + 1e-4
    assert opt <= run.best_step_time_s[0] <= 1.01 * opt  # best-seen within 1% of the optimum (1 GPU: 24.1)
    best = simulate(chains.problem, run.best_placement[0])
    assert run.best_step_time_s[0] == pytest.approx(best.step_time_s)
    assert run.greedy_step_time_s[0] == pytest.approx(
        simulate(chains.problem, run.greedy_placement[0]).step_time_s)
    assert run.curve[-1][1] == run.best_step_time_s[0]
