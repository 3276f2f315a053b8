"""OPP / ADP searches: the exact CP-SAT method equals brute force over every per-variable choice, the
linear cost form equals the plan evaluator, linkage groups, baselines and ADP's batch dimension."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from archplace.algorithms.search import sharding_search as ss
from archplace.algorithms.search.sharding_cost import ShardCost, evaluate
from archplace.hardware.gpus import gpu_spec
from archplace.workloads import sharding_models as sm

V100 = gpu_spec("v100-sxm2")


def _block():
    return sm.t5_block(hidden=256, heads=8, dk=32, ff=1024, seq=128, batch=4)


def _all_plans(pb):
    out = []
    for combo in itertools.product(*[pb.choices(t) for t in pb.variables]):
        p, c = ss.plan_cost(pb, dict(zip(pb.variables, combo)))
        if c is not None:
            out.append((p, c))
    return out


def test_linear_form_equals_evaluator_on_every_valid_plan():
    pb = ss.ShardProblem(_block(), 4)
    plans = _all_plans(pb)
    assert len(plans) == 4  # 2 free classes (heads, FFN) once the input is replicated: 3^6·2^2 choices
    for p, c in plans:
        s, m = pb.fast_cost(p.values)
        assert s == pytest.approx(c.step_s, rel=1e-12)
        assert m == pytest.approx(c.memory_bytes, rel=1e-6)


@pytest.mark.parametrize("graph", ["mlp", "block"])
def test_exact_equals_brute_force(graph):
    g = sm.mlp2(batch=64, d=256, f=1024) if graph == "mlp" else _block()
    pb0 = ss.ShardProblem(g, 4)
    mems = sorted({c.memory_bytes for _, c in _all_plans(pb0)})
    settings = [
        ShardCost(),  # NVLink: splitting pays
        ShardCost(link_bytes_per_s=1e6),  # a slow link: replicate everything
        # a slow link and memory for all but the fully replicated plans: the cheapest split
        ShardCost(gpu=dataclasses.replace(V100, memory_bytes=int(mems[-2]) + 1), link_bytes_per_s=1e6),
    ]
    optima = set()
    for devices, cost in itertools.product((2, 4), settings):
        pb = ss.ShardProblem(g, devices, cost=cost)
        brute = ss.brute_force(pb)
        exact = ss.solve_exact(pb)
        assert exact.status == "optimal"
        assert exact.cost.step_s == pytest.approx(brute.cost.step_s, rel=1e-9)
        assert exact.cost.fits
        optima.add(tuple(sorted(exact.choice.items())))
    assert len(optima) >= 2  # the settings do move the optimum


def test_linkage_groups_of_an_attention_block():
    pb = ss.ShardProblem(_block(), 4)
    groups = ss.linkage_groups(pb)
    name = lambda t: pb.graph.tensors[t].name  # noqa: E731
    q = pb.graph.tensor("SelfAttention/q/kernel")
    forced = {(name(u), k, dec) for u, k, dec in groups[(q, 1, "split")]}
    # splitting q's heads splits k's, v's and o's (o on its input dim), and replicates their other dims
    assert {
        ("SelfAttention/k/kernel", 1, "split"),
        ("SelfAttention/v/kernel", 1, "split"),
        ("SelfAttention/o/kernel", 0, "split"),
        ("SelfAttention/q/kernel", 0, "replicate"),
        ("SelfAttention/o/kernel", 1, "replicate"),
    } <= forced
    # through the residual stream it fixes only the MLP's hidden-size dims (replicated), not d_ff
    mlp = {(n, k, dec) for n, k, dec in forced if n.startswith("DenseReluDense")}
    assert mlp == {("DenseReluDense/wi/kernel", 0, "replicate"), ("DenseReluDense/wo/kernel", 1, "replicate")}
    order = ss.decision_order(pb, groups)
    assert name(order[0][0]).startswith("SelfAttention")  # the largest group first


def test_baselines_on_t5():
    cfg = dict(d_model=64, d_ff=256, d_kv=16, num_layers=2, num_decoder_layers=2, num_heads=6, vocab_size=128)
    g = sm.t5(cfg, seq=16, batch=2)
    pb = ss.ShardProblem(g, 4)
    meg = ss.megatron(pb)
    # 6 heads do not divide over 4 devices: Megatron's attention splits are dropped and reported
    assert any("SelfAttention/q/kernel" in n and "replicated" in n for n in meg.notes)
    assert meg.choice["encoder/block.0/layer.1/DenseReluDense/wi/kernel"] == 1
    assert meg.choice["shared"] == 0
    exact = ss.solve_exact(pb)
    assert exact.cost.step_s <= meg.cost.step_s * (1 + 1e-12)
    gr = ss.greedy(pb)
    r1 = ss.random_search(pb, gr.propagation_calls, seed=3)
    r2 = ss.random_search(pb, gr.propagation_calls, seed=3)
    assert r1.choice == r2.choice and r1.cost.step_s == r2.cost.step_s
    assert gr.propagation_calls <= r1.propagation_calls <= gr.propagation_calls + 1
    for res in (gr, r1):
        assert res.cost.step_s >= exact.cost.step_s * (1 - 1e-12)
    # the decision order's propagations count against the budget: a budget they use up is an error
    # naming budget; one call more than they take cannot finish an episode, and the note says so
    with pytest.raises(ValueError, match="^budget: random search spends") as e:
        ss.random_search(pb, 1, seed=3)
    order_calls = int(str(e.value).split("spends ")[1].split()[0])
    r0 = ss.random_search(pb, order_calls + 1, seed=3)
    assert r0.propagation_calls == order_calls + 1 and r0.evaluated == 1
    assert r0.notes[-1].startswith("0 complete episodes") and "ended one more episode early" in r0.notes[-1]
    assert r1.notes[-1].split(" complete episodes")[0].isdigit()


def test_adp_finds_batch_dimension():
    cfg = dict(d_model=64, d_ff=256, d_kv=16, num_layers=1, num_decoder_layers=1, num_heads=4, vocab_size=128)
    pb = ss.ShardProblem(sm.t5(cfg, seq=32, batch=8), 4, mode="adp")
    names = [pb.graph.tensors[t].name for t in pb.variables]
    assert names == ["input_ids", "attention_mask", "decoder_input_ids", "decoder_attention_mask", "labels"]
    res = ss.adp_exhaustive(pb)
    assert res.choice == dict.fromkeys(names, 0)
    pb = ss.ShardProblem(sm.vgg19(batch=32), 8, mode="adp")  # at 32x32 images the gradients outweigh it
    res = ss.adp_exhaustive(pb)
    assert res.choice == {"features": 0, "labels": 0}
    # data parallelism: every weight's gradient is AllReduced once
    p, c = ss.plan_cost(pb, {t: 0 for t in pb.variables})
    grads = [x for x in c.collectives if x.phase == "backward"]
    assert len(grads) == len(pb.graph.params()) and sum(x.bytes for x in grads) == 4 * pb.graph.num_params()
    assert evaluate(p, pb.cost).step_s == pytest.approx(c.step_s)


def test_bad_input():
    with pytest.raises(ValueError, match="mode is 'x'"):
        ss.ShardProblem(_block(), 4, mode="x")
    with pytest.raises(ValueError, match="devices is 0"):
        ss.ShardProblem(_block(), 0)
    assert np.isfinite(ss.solve_exact(ss.ShardProblem(_block(), 1)).cost.step_s)
