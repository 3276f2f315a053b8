"""Auto-MAP's OPP DQN (RLlib, on the session's Ray) through ``archplace.api.sharding``: on a small T5 it
reaches Megatron's partition count within its propagation-call budget."""

from __future__ import annotations

import json

from archplace.algorithms.rl.sharding_env import ShardingEnv
from archplace.algorithms.search import sharding_search as ss
from archplace.api.sharding import ShardRequest, shard
from archplace.workloads import sharding_models as sm

CFG = dict(
    model_type="t5",
    d_model=64,
    d_ff=256,
    d_kv=16,
    num_layers=2,
    num_decoder_layers=2,
    num_heads=4,
    vocab_size=128,
)


def test_env_rewards_and_budget():
    g = sm.t5({k: v for k, v in CFG.items() if k != "model_type"}, seq=16, batch=2)
    env = ShardingEnv({"graph": g, "devices": 4, "budget": 50})
    obs, _ = env.reset()
    n = len(env.order)
    assert obs.shape == (2 * n,) and (obs[:n] == -1).all() and obs[n] == 1.0
    # splitting the first dim (the largest linkage group) decides its whole group at once
    obs, r, done, _, _ = env.step(1)
    split = int((obs[:n] == 1).sum())
    repl = int((obs[:n] == 0).sum())
    assert split > 1 and abs(r - (0.4 * split + 0.1 * repl)) < 1e-9
    # an episode of "split" everywhere ends without a conflict only if every split is consistent;
    # run to the end or the first conflict, then the budget truncates
    while not done:
        obs, r, done, trunc, info = env.step(1)
        if trunc:
            break
    assert env.calls <= 50
    while not env.exhausted:
        env.reset()
        done = False
        while not done:
            _, _, done, trunc, _ = env.step(0)
            done = done or trunc
    assert env.calls == 50 and env.step(1)[3] is True  # truncated once spent


def test_dqn_reaches_megatron_partition_count(ray_session, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CFG))
    # a claim about the search, not about learning: the same search with learning off (the DQN's lr set
    # to 0, the seeded network throughout, same budget) also ends at 35 partitioned variables, best and
    # greedy, as Megatron (measured seed 0); a test that learning helps needs a harder problem
    res = shard(ShardRequest(f"hf:{path}", devices=4, algo="dqn", budget=1000, seq=16, batch=2, seed=0))
    meg = ss.megatron(ss.ShardProblem(sm.t5({k: v for k, v in CFG.items() if k != "model_type"}, 16, 2), 4))
    assert res.partitioned_variables == meg.partitioned == res.reference["partitioned_variables"]
    assert res.reference["differs"] == 0  # the paper's reward's best plan is Megatron's here
    assert res.propagation_calls <= 1000
    assert any("episodes" in n for n in res.notes)


def test_dqn_adp_finds_batch_dimension(ray_session):
    from archplace.algorithms.rl.sharding_dqn import dqn_search

    g = sm.t5({k: v for k, v in CFG.items() if k != "model_type"}, seq=16, batch=8)
    # the search's claim, not learning's: with the DQN's lr at 0 (same seed and budget) the best and
    # the greedy plan split the batch dimension too (measured seed 0)
    r = dqn_search(ss.ShardProblem(g, 4, "adp"), 150, seed=0)
    assert r.best is not None and r.propagation_calls <= 150
    assert r.best.choice == dict.fromkeys(
        ["input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels"], 0
    )
