"""MCM partitioning RL: the graph corpus, the GraphSAGE RLModule and the refinement env (the PPO run
lands with the training pipeline)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from archplace.algorithms.rl.mcm_env import FEATURES, MCMPartitionEnv, node_features
from archplace.hardware.presets import mcm_package
from archplace.simulators.mcm import MCMProblem, evaluate, greedy_partition
from archplace.workloads.corpus import SPLITS, CorpusGraph, _corpus, mcm_corpus, split_by_family
from archplace.workloads.synthetic import layered_dag


@pytest.fixture(scope="module")
def corpus() -> list[CorpusGraph]:
    return mcm_corpus(seed=0)


# ------------------------------------------------------------------------------------------ corpus
def test_corpus_size_families_and_split(corpus):
    assert len(corpus) == 87
    assert len({g.name for g in corpus}) == len(corpus)
    sizes = np.array([g.num_nodes for g in corpus])
    assert sizes.min() >= 10 and sizes.max() <= 400
    fams = {g.family for g in corpus}
    assert fams == {"synthetic", "cnn", "rnn", "lstm", "transformer"}
    split = split_by_family(corpus)
    assert [len(split[s]) for s in ("train", "validation", "test")] == [66, 5, 16]  # the paper's 66/5/16
    train_f = {g.family for g in split["train"]}
    val_f = {g.family for g in split["validation"]}
    test_f = {g.family for g in split["test"]}
    assert train_f == {"synthetic", "cnn"} and val_f == {"rnn"} and test_f == {"lstm", "transformer"}
    assert not (train_f & test_f) and not (train_f & val_f) and not (val_f & test_f)
    # the real transformers carry attention: a matmul between two activations (no weights)
    tr = [g for g in split["test"] if g.family == "transformer"]
    assert len(tr) == 10
    for g in tr:
        nd = g.graph.nodes
        assert ((nd["kind"] == "matmul") & (nd["weight_bytes"] == 0)).any(), g.name
    # cached: a second call builds nothing (a cache hit, counted, not timed) and hands back the same graphs
    hits, misses = _corpus.cache_info().hits, _corpus.cache_info().misses
    again = mcm_corpus(seed=0)
    assert (_corpus.cache_info().hits, _corpus.cache_info().misses) == (hits + 1, misses)
    assert len(again) == len(corpus) and all(a is b for a, b in zip(again, corpus))
    # another seed changes the synthetic graphs, never the split
    other = mcm_corpus(seed=1)
    assert [g.name for g in other if g.family == "transformer"] == [g.name for g in tr]
    assert [g.graph.content_hash() for g in other[:3]] != [g.graph.content_hash() for g in corpus[:3]]


def test_split_rejects_family_in_two_splits(corpus):
    with pytest.raises(ValueError, match="family 'cnn'"):
        split_by_family(corpus, {"train": ("synthetic", "cnn"), "test": ("cnn",)})
    with pytest.raises(ValueError, match="in no split"):
        split_by_family(corpus, {"train": ("synthetic",)})
    assert set(SPLITS) == {"train", "validation", "test"}


def test_corpus_graphs_fit_the_package(corpus):
    """On mcm-36 no op's weights plus output exceed a chip's SRAM, and the time-balanced greedy
    partition fits in memory (the dynamic constraint H) for every graph."""
    pkg = mcm_package(36)
    for cg in corpus:
        p = MCMProblem.from_graph(cg.graph, pkg)
        assert (p.weight_bytes + p.out_bytes).max() < p.sram_bytes, cg.name
        assert evaluate(p, greedy_partition(p)).memory_ok[0], cg.name
        assert p.time_s.sum() > 0


# ------------------------------------------------------------------------------------------ module
def _module(env: MCMPartitionEnv, **cfg):
    from archplace.algorithms.rl.gnn_module import GraphPartitionModule

    torch.manual_seed(0)
    return GraphPartitionModule(observation_space=env.observation_space, action_space=env.action_space,
                                model_config={"hidden": 32, "num_layers": 3, "head_hiddens": [32, 32],
                                              "vf_hiddens": [32], **cfg})


def _batch(obs_list):
    from ray.rllib.core.columns import Columns

    return {Columns.OBS: {k: torch.as_tensor(np.stack([o[k] for o in obs_list])) for k in obs_list[0]}}


def _graphs_small(corpus, k=3):
    small = sorted(corpus, key=lambda g: g.num_nodes)
    return [small[0], small[len(small) // 3], small[len(small) // 2]][:k]


def test_module_batched_equals_per_sample_and_shapes(corpus):
    from ray.rllib.core.columns import Columns

    graphs = _graphs_small(corpus)
    env = MCMPartitionEnv({"graphs": graphs, "num_chips": 8})
    rng = np.random.default_rng(0)
    obs = []
    for i in range(3):
        o, _ = env.reset(options={"graph": i})
        n = env.problem.num_nodes
        o["prev"][:n] = rng.integers(0, 8, n)  # any previous assignment
        obs.append(o)
    mod = _module(env)
    mod.eval()
    with torch.no_grad():
        out = mod.forward_inference(_batch(obs))
        logits = out[Columns.ACTION_DIST_INPUTS]
        assert logits.shape == (3, env.n_max * 8)
        vals = mod.compute_values(_batch(obs))
        assert vals.shape == (3,)
        for i, o in enumerate(obs):
            one = mod.forward_inference(_batch([o]))[Columns.ACTION_DIST_INPUTS]
            torch.testing.assert_close(one[0], logits[i], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(mod.compute_values(_batch([o]))[0], vals[i], rtol=1e-5, atol=1e-5)
        train = mod.forward_train(_batch(obs))
        assert train[Columns.EMBEDDINGS].shape == (3, 32)
    # padded nodes: all mass on chip 0, so they add nothing to log-probs and entropy
    dist = mod.get_train_action_dist_cls().from_logits(logits)
    acts = dist.sample()
    per_node = logits.reshape(3, env.n_max, 8)
    for i, o in enumerate(obs):
        n = int(o["num_nodes"][0])
        assert (acts[i, n:] == 0).all()
        manual = torch.log_softmax(per_node[i, :n], -1).gather(1, acts[i, :n, None].long()).sum()
        torch.testing.assert_close(dist.logp(acts)[i], manual, rtol=1e-5, atol=1e-4)
        ent_manual = -(torch.softmax(per_node[i, :n], -1) * torch.log_softmax(per_node[i, :n], -1)).sum()
        torch.testing.assert_close(dist.entropy()[i], ent_manual, rtol=1e-5, atol=1e-4)


def test_module_padding_invariance(corpus):
    """The same graph padded to two N_max / E_max gives the same logits on its real nodes and the same
    value; the previous assignment changes the logits (it is an input)."""
    from ray.rllib.core.columns import Columns

    g = _graphs_small(corpus)[1]
    env_a = MCMPartitionEnv({"graphs": [g], "num_chips": 8})
    env_b = MCMPartitionEnv({"graphs": [g], "num_chips": 8, "n_max": env_a.n_max + 37,
                             "e_max": env_a.e_max + 50})
    mod_a, mod_b = _module(env_a), _module(env_b)
    mod_b.load_state_dict(mod_a.state_dict())
    oa, _ = env_a.reset()
    ob, _ = env_b.reset()
    n = env_a.problem.num_nodes
    with torch.no_grad():
        la = mod_a.forward_inference(_batch([oa]))[Columns.ACTION_DIST_INPUTS].reshape(env_a.n_max, 8)
        lb = mod_b.forward_inference(_batch([ob]))[Columns.ACTION_DIST_INPUTS].reshape(env_b.n_max, 8)
        torch.testing.assert_close(la[:n], lb[:n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mod_a.compute_values(_batch([oa])), mod_b.compute_values(_batch([ob])),
                                   rtol=1e-5, atol=1e-5)
        oc = dict(oa, prev=np.zeros_like(oa["prev"]))
        lc = mod_a.forward_inference(_batch([oc]))[Columns.ACTION_DIST_INPUTS].reshape(env_a.n_max, 8)
        assert not torch.allclose(la[:n], lc[:n])
    # a graph whose edges are all dropped differs (the edges matter)
    od = dict(oa, num_edges=np.array([0]))
    with torch.no_grad():
        ld = mod_a.forward_inference(_batch([od]))[Columns.ACTION_DIST_INPUTS].reshape(env_a.n_max, 8)
    assert not torch.allclose(la[:n], ld[:n])


def test_module_default_sizes_match_the_paper(corpus):
    from torch_geometric.nn import SAGEConv

    from archplace.algorithms.rl.gnn_module import GraphPartitionModule

    env = MCMPartitionEnv({"graphs": _graphs_small(corpus, 1), "num_chips": 36})
    mod = GraphPartitionModule(observation_space=env.observation_space, action_space=env.action_space,
                               model_config={})
    convs = [m for m in mod.modules() if isinstance(m, SAGEConv)]
    assert len(convs) == 8 and all(c.out_channels == 128 for c in convs)
    assert convs[0].in_channels == len(FEATURES) + 36 + 1  # features, one-hot prev, round
    lin = [m for m in mod.pi_head if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in lin] == [(128, 128), (128, 128), (128, 36)]


# ------------------------------------------------------------------------------------------ env
def test_node_features_hand_made():
    # chain 0 -> 1 -> 2 plus 0 -> 2; times 1, 2, 1 s; 2 chips
    p = MCMProblem.from_arrays(2, [0, 1, 0], [1, 2, 2], [1.0, 2.0, 1.0], out_bytes=[0, 2**20, 0],
                               weight_bytes=[2**24, 0, 0])
    x = node_features(p)
    assert x.shape == (3, len(FEATURES))
    np.testing.assert_allclose(x[:, 0], [0.5, 1.0, 0.5])  # time / max
    np.testing.assert_allclose(x[:, 1], [0.5, 1.0, 0.5])  # time * C / total
    np.testing.assert_allclose(x[:, 2], [0, 1 / 32, 0])  # out / SRAM (32 MB)
    np.testing.assert_allclose(x[:, 3], [0.5, 0, 0])
    np.testing.assert_allclose(x[:, 4], np.log1p([0, 1, 2]) / 2, rtol=1e-6)
    np.testing.assert_allclose(x[:, 5], np.log1p([2, 1, 0]) / 2, rtol=1e-6)
    np.testing.assert_allclose(x[:, 6], [0, 1 / 3, 2 / 3], rtol=1e-6)
    np.testing.assert_allclose(x[:, 7], [0, 0.25, 0.75])


def test_env_fix_repair_gives_valid_partitions_and_greedy_reward_one(corpus):
    graphs = [corpus[0], corpus[40], corpus[72], corpus[-1]]  # synthetic, cnn, lstm, t5 (266 ops)
    env = MCMPartitionEnv({"graphs": graphs, "num_chips": 36, "rounds": 3, "seed": 0})
    assert env.observation_space["x"].shape == (env.n_max, len(FEATURES))
    assert env.action_space.nvec.shape == (env.n_max,)
    rng = np.random.default_rng(0)
    for i in range(len(graphs)):
        obs, info = env.reset(options={"graph": i})
        assert env.observation_space.contains(obs)
        p = env.problem
        # y'^(0) is the greedy partition after FIX
        np.testing.assert_array_equal(obs["prev"][:p.num_nodes], env.greedy_part(i))
        # random actions: FIX always yields a statically valid y'; reward = throughput / baseline > 0
        for t in range(3):
            obs, r, term, trunc, info = env.step(rng.integers(0, 36, env.n_max))
            assert info["repair_status"] == "valid" and info["samples"] == 1
            assert info["repaired_valid"] and r > 0
            assert r == pytest.approx(info["throughput"] / env.baseline(i))
            assert term == (t == 2) and not trunc
            assert evaluate(p, obs["prev"][:p.num_nodes]).valid[0]
        # the greedy-repaired partition is valid, FIX keeps it, and its reward is exactly 1
        env.reset(options={"graph": i})
        _, r, _, _, info = env.step(env.pad(env.greedy_part(i)))
        assert info["changed"] == 0 and info["raw_valid"]
        assert r == 1.0
        assert env.best[env.names[i]][0] >= info["throughput"]
    assert env.total_samples == 4 * len(graphs)
    assert [len(h) for h in env.history.values()] == [4] * len(graphs), env.history


def test_env_greedy_baseline_is_the_heuristic_after_fix():
    g = layered_dag(60, 4, seed=3, batch=1, seq=128, hidden=256, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(8))
    env = MCMPartitionEnv({"graphs": [p], "num_chips": 8})
    y0 = greedy_partition(p)
    # FIX keeps every node of y0 whose chip survives propagation; a valid y0 comes back unchanged
    if evaluate(p, y0).static_ok[0]:
        np.testing.assert_array_equal(env.greedy_part(0), y0)
    assert env.baseline(0) == pytest.approx(float(evaluate(p, env.greedy_part(0)).throughput[0]))
    assert env.baseline(0) > 0


def test_env_without_repair_almost_never_valid(corpus):
    """The paper's RL-without-solver baseline: on 36 chips a sampled assignment of a graph with a hundred
    nodes is essentially never valid, so the reward is 0."""
    g = min((g for g in corpus if g.num_nodes >= 100), key=lambda g: g.num_nodes)
    env = MCMPartitionEnv({"graphs": [g], "num_chips": 36, "repair": "none", "rounds": 50})
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    valid, rewards = [], []
    for _ in range(50):
        _, r, _, _, info = env.step(rng.integers(0, 36, env.n_max))
        valid.append(info["raw_valid"])
        rewards.append(r)
    assert sum(valid) == 0 and sum(rewards) == 0.0
    assert env.best == {}
    # the same env repairs with FIX when asked to
    env_fix = MCMPartitionEnv({"graphs": [g], "num_chips": 36, "repair": "fix"})
    env_fix.reset(seed=0)
    _, r, _, _, info = env_fix.step(rng.integers(0, 36, env_fix.n_max))
    assert not info["raw_valid"] and info["repaired_valid"] and r > 0


def test_env_sample_mode_and_config_errors(corpus):
    g = _graphs_small(corpus, 1)
    env = MCMPartitionEnv({"graphs": g, "num_chips": 8, "repair": "sample", "init": "zeros"})
    obs, _ = env.reset(seed=1)
    assert (obs["prev"] == 0).all()
    _, r, _, _, info = env.step(np.random.default_rng(1).integers(0, 8, env.n_max))
    assert info["repaired_valid"] and r > 0
    with pytest.raises(ValueError, match="repair"):
        MCMPartitionEnv({"graphs": g, "repair": "bogus"})
    with pytest.raises(ValueError, match="n_max"):
        MCMPartitionEnv({"graphs": g, "n_max": 3})
    with pytest.raises(ValueError, match="graphs"):
        MCMPartitionEnv({})


# ------------------------------------------------------------------------------------------ PPO
def test_ppo_improves_episode_reward(ray_session):
    """A short PPO run on one small graph (20 ops, 4 chips, T = 2 refinement steps), RLlib new API
    stack with local sampling: the mean reward per step of the last iterations beats that of the first
    ones by a clear margin (measured: 0.55 -> 0.8, where 1.0 is greedy + FIX; ~15 s)."""
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from archplace.algorithms.rl.gnn_module import GraphPartitionModule

    g = layered_dag(20, 2, seed=1, batch=1, seq=128, hidden=256, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(4))
    rounds, episodes = 2, 20
    config = (
        PPOConfig()
        .environment(MCMPartitionEnv, env_config={"graphs": [p], "num_chips": 4, "rounds": rounds,
                                                  "seed": 0, "init": "zeros"})
        .framework("torch")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1)
        .learners(num_learners=0)
        .training(train_batch_size_per_learner=episodes * rounds, minibatch_size=episodes * rounds // 4,
                  num_epochs=10, lr=5e-3, clip_param=0.5, gamma=0.5, lambda_=0.95, entropy_coeff=0.0,
                  use_kl_loss=False, grad_clip=1.0)
        .rl_module(rl_module_spec=RLModuleSpec(
            module_class=GraphPartitionModule,
            model_config={"hidden": 32, "num_layers": 3, "head_hiddens": [32, 32], "vf_hiddens": [32]}))
        .reporting(metrics_num_episodes_for_smoothing=episodes)  # each value: one iteration's episodes
        .debugging(seed=0)
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: one thread is ~5x faster than two fighting a busy machine
    algo = config.build_algo()
    try:
        returns = []
        for _ in range(30):
            res = algo.train()
            returns.append(res["env_runners"]["episode_return_mean"] / rounds)
        env = algo.env_runner.env.unwrapped.envs[0].unwrapped
        best = env.best[env.names[0]][0] / env.baseline(0)
    finally:
        algo.stop()
        torch.set_num_threads(threads)
    first, last = np.mean(returns[:3]), np.mean(returns[-3:])
    print(f"PPO mean reward per step by iteration: {np.round(returns, 3).tolist()}; best {best:.3f}")
    assert last > first + 0.1, returns
    assert best >= max(returns)


def test_module_prev_bias_adds_exactly_the_keep_prior(corpus):
    """``prev_bias`` adds log(C - 1) + bias to each real node's previous chip and nothing else."""
    from ray.rllib.core.columns import Columns

    graphs = _graphs_small(corpus, 2)
    env = MCMPartitionEnv({"graphs": graphs, "num_chips": 8})
    o, _ = env.reset(options={"graph": 1})
    n = env.problem.num_nodes
    o["prev"][:n] = np.random.default_rng(1).integers(0, 8, n)
    plain, prior = _module(env), _module(env, prev_bias=1.5)
    missing = prior.load_state_dict(plain.state_dict(), strict=False)
    assert missing.missing_keys == ["prev_bias"] and not missing.unexpected_keys
    with torch.no_grad():
        a = plain.forward_inference(_batch([o]))[Columns.ACTION_DIST_INPUTS].reshape(env.n_max, 8)
        b = prior.forward_inference(_batch([o]))[Columns.ACTION_DIST_INPUTS].reshape(env.n_max, 8)
    expect = torch.zeros_like(a)
    expect[torch.arange(n), torch.as_tensor(o["prev"][:n])] = np.log(7) + 1.5
    torch.testing.assert_close(b[:n] - a[:n], expect[:n], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b[n:], a[n:])  # padded rows keep their constant logits


def test_env_sample_budget_freezes_best():
    g = layered_dag(12, 2, seed=3, batch=1, seq=64, hidden=128, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(4))
    env = MCMPartitionEnv({"graphs": [p], "num_chips": 4, "rounds": 2, "sample_budget": 3, "seed": 0})
    rng = np.random.default_rng(0)
    seen = []
    for _ in range(4):
        env.reset()
        for _ in range(2):
            _, r, _, _, info = env.step(rng.integers(0, 4, env.n_max))
            seen.append(info["throughput"])
    assert env.total_samples == 8 and len(env.history[env.names[0]]) == 8
    assert env.best[env.names[0]][0] == pytest.approx(max(seen[:3]))
    assert env.valid_samples == sum(t > 0 for t in seen[:3])


# ------------------------------------------------------------------------------------------ PPO driver
TINY = {"hidden": 16, "num_layers": 2, "head_hiddens": [16], "vf_hiddens": [16]}
TINY_PPO = {"episodes_per_iteration": 4}


def test_rl_search_repair_zero_shot_and_fine_tune(ray_session, tmp_path):
    """One graph on mcm-36: with FIX every sample is valid, without the solver none is; a zero-shot run
    leaves the weights as loaded, a fine-tuning run changes them; weights survive an .npz round trip."""
    from archplace.algorithms.rl.mcm_ppo import load_state, rl_search, save_state
    from archplace.simulators.mcm import static_valid

    torch.manual_seed(0)
    g = layered_dag(30, 3, seed=2, batch=1, seq=128, hidden=256, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(36))
    run = rl_search(p, 20, seed=0, model=TINY, ppo=TINY_PPO, keep_state=True)
    tr = run.trace
    assert tr.method == "rl" and tr.samples == 20 and tr.valid_samples == 20
    assert (np.diff(tr.best_so_far) >= 0).all() and tr.best == pytest.approx(tr.best_so_far.max())
    assert static_valid(p, tr.best_partition)[0]
    assert evaluate(p, tr.best_partition).throughput[0] == pytest.approx(tr.best)
    none = rl_search(p, 16, seed=0, model=TINY, ppo=TINY_PPO, repair="none").trace
    assert none.method == "rl" and none.extra["raw_valid_samples"] == 0 and none.best == 0.0
    assert none.best_partition is None

    save_state(tmp_path / "w.npz", run.state, samples=20)
    state, meta = load_state(tmp_path / "w.npz")
    assert meta == {"samples": 20} and set(state) == set(run.state)
    zs = rl_search(p, 8, seed=1, init_state=state, train=False, model=TINY, ppo=TINY_PPO, keep_state=True)
    assert zs.trace.method == "rl_zeroshot" and zs.trace.samples == 8
    for k in state:
        np.testing.assert_array_equal(np.asarray(zs.state[k]), state[k])
    ft = rl_search(p, 16, seed=1, init_state=state, model=TINY, ppo=TINY_PPO, keep_state=True)
    assert ft.trace.method == "rl_finetune"
    assert any(not np.allclose(np.asarray(ft.state[k]), state[k]) for k in state)
    with pytest.raises(ValueError, match="samples"):
        rl_search(p, 0)


def test_pretrain_keeps_the_best_validation_checkpoint(ray_session):
    from archplace.algorithms.rl.mcm_ppo import pretrain

    torch.manual_seed(0)
    gs = [layered_dag(n, 2, seed=s, batch=1, seq=64, hidden=128, bytes_per_element=1)
          for n, s in ((14, 0), (18, 1), (16, 2))]
    probs = [MCMProblem.from_graph(g, mcm_package(8)) for g in gs]
    res = pretrain(probs[:2], probs[2:], total_samples=48, checkpoint_every=16, num_chips=8, model=TINY,
                   ppo=TINY_PPO)
    assert [s for s, _ in res.checkpoints] == [16, 32, 48]
    best = max(res.checkpoints, key=lambda c: c[1])
    assert (res.best_samples, res.best_validation_reward) == best
    assert len(res.train_reward) == 3 and all(r >= 0 for r in res.train_reward)
    with pytest.raises(ValueError, match="checkpoint_every"):
        pretrain(probs[:2], probs[2:], total_samples=8, checkpoint_every=16, num_chips=8)


def test_ppo_trained_on_repaired_actions_learns_faster(ray_session):
    """``train_on: repaired`` (PPO's action and log-probability become those of y', spec §2.3 option (b))
    on the fixed 20-node, 4-chip graph: the mean reward per step climbs well past greedy + FIX within
    25 iterations (training on the sampled y reaches ~0.8 in 30). Measured 0.56 -> 1.12 within 15 iterations
    on an earlier install; a fresh install on 2026-11-25 (ortools 9.15.6755, ray 2.60.0) gives the same
    seeded run a slower start, 0.55 -> 0.83 at 15 and 1.24 at 25, and failed at the last landed commit too,
    so the budget is 25."""
    from archplace.algorithms.rl.mcm_ppo import build_ppo, env_of

    g = layered_dag(20, 2, seed=1, batch=1, seq=128, hidden=256, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(4))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    algo = build_ppo([p], num_chips=4, seed=0, env={"rounds": 2, "init": "zeros", "train_on": "repaired"},
                     ppo={"lr": 5e-3}, model={"hidden": 32, "num_layers": 3, "head_hiddens": [32, 32],
                                              "vf_hiddens": [32]})
    try:
        returns = [algo.train()["env_runners"]["episode_return_mean"] / 2 for _ in range(25)]
        env = env_of(algo)
        assert env.total_samples == 25 * 40
    finally:
        algo.stop()
        torch.set_num_threads(threads)
    print(f"PPO on y': mean reward per step by iteration {np.round(returns, 3).tolist()}")
    assert np.mean(returns[:3]) < 0.7 and np.mean(returns[-3:]) > 1.0, returns
    with pytest.raises(ValueError, match="train_on"):
        build_ppo([p], num_chips=4, env={"train_on": "both"})


def test_env_init_best_starts_from_the_incumbent():
    """``init="best"``: before any valid sample an episode starts from greedy + FIX, afterwards from the
    best partition found so far on that graph."""
    g = layered_dag(14, 2, seed=4, batch=1, seq=64, hidden=128, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(4))
    env = MCMPartitionEnv({"graphs": [p], "num_chips": 4, "rounds": 2, "init": "best", "seed": 0})
    o, _ = env.reset()
    np.testing.assert_array_equal(o["prev"][:p.num_nodes], env.greedy_part(0))
    rng = np.random.default_rng(0)
    for _ in range(3):
        env.reset()
        for _ in range(2):
            env.step(rng.integers(0, 4, env.n_max))
    o, _ = env.reset()
    np.testing.assert_array_equal(o["prev"][:p.num_nodes], env.best[env.names[0]][1])
    with pytest.raises(ValueError, match="init"):
        MCMPartitionEnv({"graphs": [p], "num_chips": 4, "init": "incumbent"})


def test_env_load_features_are_the_previous_partitions_chip_latencies(corpus):
    """``load_features``: ``chip_load`` is L_d(prev) / max_d L_d(prev); the module takes the C + 1 extra
    channels (every chip's load and the node's own chip's) and its logits depend on them."""
    from ray.rllib.core.columns import Columns

    from archplace.simulators.mcm import chip_latency_s

    graphs = _graphs_small(corpus, 2)
    env = MCMPartitionEnv({"graphs": graphs, "num_chips": 8, "load_features": True})
    o, _ = env.reset(options={"graph": 1})
    n = env.problem.num_nodes
    lat = chip_latency_s(env.problem, o["prev"][:n])[0]
    np.testing.assert_allclose(o["chip_load"], lat / lat.max(), rtol=1e-6)
    assert o["chip_load"].max() == pytest.approx(1.0) and env.observation_space.contains(o)
    m = _module(env)
    assert m.convs[0].in_channels == len(FEATURES) + 8 + 1 + 9  # x, prev one-hot, round, loads
    o2 = {**o, "chip_load": np.roll(o["chip_load"], 1)}
    with torch.no_grad():
        a = m.forward_inference(_batch([o]))[Columns.ACTION_DIST_INPUTS]
        b = m.forward_inference(_batch([o2]))[Columns.ACTION_DIST_INPUTS]
    assert not torch.allclose(a, b)


def test_ppo_learner_bounds_the_joint_log_ratio(ray_session):
    """A behaviour log-probability 1e4 nats below the current one makes RLlib's ratio exp(1e4) = inf and
    the gradients NaN; the learner bounds the log-ratio at MAX_LOG_RATIO, so loss and gradients stay
    finite, and where the ratio is in range the loss is RLlib's, unchanged."""
    from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.core.columns import Columns
    from ray.rllib.evaluation.postprocessing import Postprocessing

    from archplace.algorithms.rl.mcm_ppo import build_ppo

    g = layered_dag(12, 2, seed=3, batch=1, seq=64, hidden=128, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(4))
    torch.manual_seed(0)
    algo = build_ppo([p], num_chips=4, seed=0, model=TINY, ppo=TINY_PPO)
    try:
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID]
        env = MCMPartitionEnv({"graphs": [p], "num_chips": 4})
        obs = [env.reset()[0] for _ in range(4)]
        batch = _batch(obs)
        fwd = module.forward_train(batch)
        dist = module.get_train_action_dist_cls().from_logits(fwd[Columns.ACTION_DIST_INPUTS])
        actions = dist.sample()
        logp = dist.logp(actions).detach()
        batch.update({Columns.ACTIONS: actions,
                      Columns.ACTION_DIST_INPUTS: fwd[Columns.ACTION_DIST_INPUTS].detach(),
                      Postprocessing.ADVANTAGES: torch.tensor([1.0, -1.0, 0.5, -0.5]),
                      Postprocessing.VALUE_TARGETS: torch.ones(4)})

        def loss_and_grads(cls, old_logp):
            module.zero_grad()
            b = {**batch, Columns.ACTION_LOGP: old_logp}
            out = module.forward_train(b)
            loss = cls.compute_loss_for_module(learner, module_id=DEFAULT_MODULE_ID, config=algo.config,
                                               batch=b, fwd_out=out)
            loss.backward()
            return float(loss), [q.grad for q in module.parameters() if q.grad is not None]

        far = logp - torch.tensor([1e4, 1e4, 0.0, 0.0])
        raw_loss, raw_grads = loss_and_grads(PPOTorchLearner, far)
        assert not (np.isfinite(raw_loss) and all(torch.isfinite(q).all() for q in raw_grads))
        loss, grads = loss_and_grads(type(learner), far)
        assert np.isfinite(loss) and all(torch.isfinite(q).all() for q in grads)
        near = logp - 0.1
        expect = loss_and_grads(PPOTorchLearner, near)[0]
        assert loss_and_grads(type(learner), near)[0] == pytest.approx(expect)
    finally:
        algo.stop()
