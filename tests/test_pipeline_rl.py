"""Pipeline-cut environment, masked Q-module and DQN (Auto-MAP online training and inference)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from archplace.algorithms.rl.pipeline_env import PipelineCutEnv, SyntheticPipelineEnv
from archplace.algorithms.solvers.pipeline_exact import candidate_pivots, solve_exact
from archplace.hardware.presets import v100_cluster
from archplace.simulators.pipeline import (
    PipelineSetup,
    coarse_pipeline_profile,
    coarse_to_real_pivots,
    evaluate,
    profile_from_graph,
    profile_time_arrays,
)
from archplace.workloads.profiles import coarsen


@functools.lru_cache(maxsize=1)
def bert_profile():
    """bert-base at sequence 128: small enough to build in a second, real enough to cut."""
    from archplace.hardware.presets import V100
    from archplace.workloads.models import build_graph

    return profile_from_graph(build_graph("bert-base", seq=128, mbs=16), V100, PipelineSetup())


def _env(cluster="B", k=3, **kw):
    return PipelineCutEnv({"profile": bert_profile(), "cluster": v100_cluster(cluster), "num_stages": k,
                           **kw})


def test_observation_matches_space_and_mask_matches_windows():
    env = _env()
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    cand = candidate_pivots(bert_profile(), v100_cluster("B"), 3)
    # step 1: exactly the first window's pivots are open
    assert set(env.pivots[obs["action_mask"] > 0]) == set(cand.per_cut[0])
    first = int(np.flatnonzero(obs["action_mask"])[len(cand.per_cut[0]) // 2])
    obs, r, done, _, _ = env.step(first)
    assert not done and r == 0.0
    open_ = env.pivots[obs["action_mask"] > 0]
    assert (open_ > env.pivots[first]).all()
    assert set(open_) <= set(cand.per_cut[1])
    assert env.observation_space.contains(obs)


def test_features_are_exact_for_a_complete_plan():
    """At the last cut the plan is complete: AllReduce and transfer features are log1p(max / t_unit)
    of the cost model's own terms, the balance ratio is min t_s / max t_s, and the fourth is the reward."""
    env = _env()
    obs, _ = env.reset(seed=0)
    a0 = int(np.flatnonzero(obs["action_mask"])[0])
    obs, _, _, _, _ = env.step(a0)
    i = int(np.flatnonzero(obs["action_mask"])[3])
    r = evaluate(env.profile, env.cluster, np.array([[env.pivots[a0], env.pivots[i]]]))
    f = obs["pivots"][i]
    assert f[0] == pytest.approx(np.log1p(r.allreduce_s.max() / env.t_unit), rel=1e-5)
    assert f[1] == pytest.approx(np.log1p(r.transfer_s.max() / env.t_unit), rel=1e-5)
    assert f[2] == pytest.approx(r.stage_time_s.min() / r.stage_time_s.max(), rel=1e-5)
    assert f[3] == pytest.approx(env.l_unit / r.length_s[0], rel=1e-5)


def test_reward_is_inverse_length_and_masked_action_raises():
    env = _env("B", 3)
    obs, _ = env.reset(seed=0)
    closed = np.flatnonzero(obs["action_mask"] == 0)
    assert len(closed)  # the second cut's window is masked at the first cut
    with pytest.raises(ValueError, match="masked"):
        env.step(int(closed[-1]))
    env = _env("A", 2)
    obs, _ = env.reset(seed=0)
    a = int(np.flatnonzero(obs["action_mask"])[0])
    _, rew, done, _, info = env.step(a)
    assert done
    assert rew == pytest.approx(env.l_unit / info["length_s"])
    assert env.best_length_s == pytest.approx(info["length_s"])


def test_oom_reward_is_negative_inverse_sqrt():
    from dataclasses import replace

    from archplace.hardware.presets import V100, Cluster

    a = v100_cluster("A")
    small = Cluster("v100-0.5GB", a.num_devices, replace(V100, hbm_gb=0.5), a.link_bw, "servers",
                    a.devices_per_server, a.inter_server_bw)  # bert-base: 1.6 GiB of Adam state, 2 stages
    env = PipelineCutEnv({"profile": bert_profile(), "cluster": small, "num_stages": 2})
    obs, _ = env.reset()
    _, rew, _, _, info = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    assert info["oom"]
    assert rew == pytest.approx(-np.sqrt(env.l_unit / info["length_s"]))


def test_random_plans_are_valid_and_never_below_the_optimum():
    env = _env()
    opt = solve_exact(env.profile, env.cluster, env.cand)
    lengths = env.random_plan_lengths(300, seed=0)
    assert np.isfinite(lengths).all()
    assert lengths.min() >= opt.length_s - 1e-12


def test_masked_q_values_are_minus_inf_and_never_chosen():
    """The module gives masked actions Q = -inf and neither greedy nor epsilon-greedy picks them."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from archplace.algorithms.rl.pivot_q_module import PivotQModule

    env = _env()
    torch.manual_seed(0)
    cfg = {"dueling": True, "double_q": True, "num_atoms": 11, "v_min": -1.5, "v_max": 1.5,
           "epsilon": [(0, 1.0), (10, 1.0)], "hidden": 16}
    module = RLModuleSpec(module_class=PivotQModule, observation_space=env.observation_space,
                          action_space=env.action_space, model_config=cfg).build()
    obs, _ = env.reset(seed=0)
    batch = {Columns.OBS: {k: torch.as_tensor(v)[None].repeat(256, *[1] * v.ndim) for k, v in obs.items()}}
    q = module.compute_q_values(batch)["qf_preds"]
    mask = torch.as_tensor(obs["action_mask"]) > 0
    assert torch.isinf(q[:, ~mask]).all() and torch.isfinite(q[:, mask]).all()
    explore = module.forward_exploration(batch, t=0)[Columns.ACTIONS]  # epsilon = 1: all random
    greedy = module.forward_inference(batch)[Columns.ACTIONS]
    assert mask[explore].all() and mask[greedy].all()
    assert len(set(explore.tolist())) > 10  # exploration really spreads over the open actions


def test_coarse_profile_maps_back_to_real_pivots():
    prof = bert_profile()
    cl = v100_cluster("C")
    cp = coarsen(*profile_time_arrays(prof, cl))
    cprof = coarse_pipeline_profile(cp, cl)
    assert cprof.num_ops == 128
    # compute before a coarse cut equals the real compute before the real pivot it maps to
    q = np.array([10, 64, 100])
    real = coarse_to_real_pivots(cp, q)
    assert np.allclose(cprof.compute_s_prefix[q] * cp.scale, prof.compute_s_prefix[real])
    assert np.allclose(cprof.cross_bytes[q] * cp.scale, prof.cross_bytes[real])


def test_synthetic_env_keeps_one_space_across_profiles():
    env = SyntheticPipelineEnv({"seed": 3, "steps_per_profile": 4})
    seen = set()
    for _ in range(30):
        obs, _ = env.reset()
        assert env.observation_space.contains(obs)
        seen.add(env.num_stages)
        done = False
        while not done:
            obs, _, done, _, _ = env.step(int(np.flatnonzero(obs["action_mask"])[-1] if env.cuts
                                              else np.flatnonzero(obs["action_mask"])[0]))
    assert len(seen) >= 2  # clusters A/B/C -> 2, 3, 4 stages
    assert env.action_space.n == 127


def test_short_seeded_dqn_beats_random_cuts(ray_session):
    """A short seeded DQN run's greedy plan beats the mean random plan, and its best plan is no worse
    than the best of as many random plans as it evaluated."""
    from archplace.algorithms.rl.pipeline_dqn import dqn_search

    env = _env()
    res = dqn_search(bert_profile(), v100_cluster("B"), 3, 800, seed=0,
                     dqn={"num_steps_sampled_before_learning_starts": 100})
    rand = env.random_plan_lengths(res.plans, seed=0)
    assert res.env_steps >= 800
    assert res.greedy_length_s < np.mean(rand)
    assert res.best_length_s <= np.min(rand) * 1.001
    opt = solve_exact(env.profile, env.cluster, env.cand)
    assert res.best_length_s >= opt.length_s - 1e-12
