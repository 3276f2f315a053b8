"""``archplace shard`` on the Llama and OPT families (config-built graphs, counts against transformers,
Megatron's collectives, exact == brute force) and infeasible results that say why."""

from __future__ import annotations

import dataclasses
import itertools
import re

import pytest

from archplace.algorithms.search import sharding_search as ss
from archplace.algorithms.search.sharding_cost import ShardCost
from archplace.hardware.gpus import gpu_spec
from archplace.workloads import sharding_families as sf
from archplace.workloads import sharding_models as sm
from archplace.workloads.sharding import Mesh, collectives, propagate

V100 = gpu_spec("v100-sxm2")


# ------------------------------------------------------------------------------------ infeasible


def test_exact_infeasible_reports_the_smallest_memory_any_plan_reaches():
    g = sm.mlp2(batch=64, d=256, f=1024)
    pb0 = ss.ShardProblem(g, 4)
    least = min(
        c.memory_bytes
        for combo in itertools.product(*[pb0.choices(t) for t in pb0.variables])
        for _, c in [ss.plan_cost(pb0, dict(zip(pb0.variables, combo)))]
        if c is not None
    )
    tiny = dataclasses.replace(V100, memory_bytes=least - 1)
    res = ss.solve_exact(ss.ShardProblem(g, 4, cost=ShardCost(gpu=tiny)))
    assert res.status == "infeasible" and res.choice == {}
    assert f"reaches over 4 devices is {least / 2**30:.2f} GiB ({least} B" in res.reason
    assert res.to_dict()["reason"] == res.reason
    with pytest.raises(
        ValueError,
        match=rf"the smallest of the \d+ plans without a conflict \(of 36\) needs .* \({least} B\)",
    ):
        ss.brute_force(ss.ShardProblem(g, 4, cost=ShardCost(gpu=tiny)))
    # one byte more and the optimum is that plan
    ok = ss.solve_exact(
        ss.ShardProblem(g, 4, cost=ShardCost(gpu=dataclasses.replace(V100, memory_bytes=least)))
    )
    assert ok.status == "optimal" and ok.cost.memory_bytes == least and ok.reason is None


def test_shard_api_infeasible_says_why():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("gpt2-xl", devices=8))
    assert res.status == "infeasible" and res.strategy == {} and not res.fits
    m = re.search(r"reaches over 8 devices is [\d.]+ GiB \((\d+) B", res.reason)
    assert m and int(m.group(1)) > V100.memory_bytes
    # the minimum is no more than Megatron's plan needs (which conflicts on 25 heads over 8)
    assert int(m.group(1)) <= res.reference["memory_bytes"]
    assert "h.*/attn/q/kernel dim 1 and 47 like it (size 25 is not divisible by 8" in res.reason
    assert res.reference["differs"] is None
    d = res.to_dict()
    assert d["step_s"] is None and d["reason"] == res.reason


def test_shard_cli_human_output_of_an_infeasible_plan(capsys):
    from archplace.cli import main

    assert main(["shard", "gpt2-xl", "--devices", "8", "--algo", "ilp"]) == 0
    out = capsys.readouterr().out
    assert "[ilp, infeasible," in out and "step         none: no plan" in out
    assert "why          no plan fits in v100-sxm2's 32.00 GiB per device" in out


def test_a_plan_that_does_not_fit_says_by_how_much():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("gpt2-xl", devices=8, algo="greedy"))
    assert not res.fits
    assert res.reason == (
        f"the greedy plan needs {res.memory_bytes} B per device, more than v100-sxm2's {V100.memory_bytes} B"
    )


# ------------------------------------------------------------------------------------ llama, opt

LLAMA = dict(
    hidden_size=32,
    num_hidden_layers=2,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,  # grouped-query attention: 2 query heads per kv head
    vocab_size=100,
    max_position_embeddings=16,
)
OPT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    ffn_dim=64,
    num_attention_heads=4,
    word_embed_proj_dim=16,  # project_in / project_out, as OPT-350M
    vocab_size=100,
    max_position_embeddings=16,
)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("kv", [2, 4])
def test_llama_parameter_count_matches_transformers(kv, tied):
    import torch
    import transformers  # a dependency (pyproject): missing, the test fails rather than skips

    cfg = {**LLAMA, "num_key_value_heads": kv, "tie_word_embeddings": tied}
    with torch.device("meta"):
        ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg)).num_parameters()
    assert sf.llama(cfg, seq=8, batch=2).num_params() == ref == sf.llama_params(cfg)


def test_llama2_7b_parameter_count():
    from archplace.workloads.models import preset

    cfg = dict(preset("llama2-7b").config)
    # Touvron et al. 2023 (Llama 2): the 7B checkpoint has 6,738,415,616 parameters
    assert sf.llama_params(cfg) == 6_738_415_616
    assert sf.llama(cfg, seq=16, batch=1).num_params() == 6_738_415_616


@pytest.mark.parametrize("pre", [False, True])
def test_opt_parameter_count_matches_transformers(pre):
    import torch
    import transformers  # a dependency (pyproject): missing, the test fails rather than skips

    cfg = {**OPT, "do_layer_norm_before": pre}
    with torch.device("meta"):
        ref = transformers.OPTForCausalLM(transformers.OPTConfig(**cfg)).num_parameters()
    assert sf.opt(cfg, seq=8, batch=2).num_params() == ref


def _megatron_plan(g, devices=2):
    dec = {
        (n, d if d is not None else 0): ("model" if d is not None else None)
        for n, d in g.meta["megatron"].items()
    }
    dec.update({("input_ids", 0): None, ("input_ids", 1): None, ("labels", 0): None})
    p = propagate(g, Mesh((("model", devices),)), dec)
    assert p.conflict is None
    return p


def test_megatron_llama_block_collectives():
    g = sf.llama({**LLAMA, "num_hidden_layers": 1}, seq=8, batch=2)
    p = _megatron_plan(g)
    got = sorted((c.phase, c.kind, c.at, c.bytes) for c in collectives(p))
    act = 2 * 8 * 32 * 2  # [b, s, h] bf16
    # per attention and per MLP exactly one forward AllReduce (after o_proj, down_proj) and one
    # backward AllReduce (the gradient of the norm output feeding the column-parallel GEMMs); the
    # vocabulary-parallel lookup and cross entropy (3 fp32 statistics) and the column-parallel LM
    # head's input gradient (the final norm's) add one each
    assert got == [
        ("backward", "allreduce", "layers.0/input_layernorm", act),
        ("backward", "allreduce", "layers.0/post_attention_layernorm", act),
        ("backward", "allreduce", "norm", act),
        ("forward", "allreduce", "embed_tokens/lookup", act),
        ("forward", "allreduce", "layers.0/mlp/down_proj", act),
        ("forward", "allreduce", "layers.0/self_attn/o_proj", act),
        ("forward", "allreduce", "loss", 3 * 2 * 8 * 4),
    ]
    # the kv heads split as the query heads do (2 of 4 query heads, 1 of 2 kv heads per device)
    assert p.spec("layers.0/self_attn/k/bnsd") == (None, "model", None, None)
    assert p.spec("layers.0/self_attn/k/repeat_kv/merge") == (None, "model", None, None)
    assert p.spec("layers.0/mlp/gate_mul") == (None, None, "model")
    assert p.spec("lm_head") == (None, None, "model")


def test_megatron_llama_kv_heads_that_do_not_divide_conflict():
    g = sf.llama({**LLAMA, "num_hidden_layers": 1, "num_key_value_heads": 2}, seq=8, batch=2)
    p = propagate(g, Mesh((("model", 4),)), {("layers.0/self_attn/q_proj/kernel", 1): "model"})
    assert p.conflict is not None and "do not divide" in p.conflict.reason


@pytest.mark.parametrize("pre", [False, True])
def test_megatron_opt_block_collectives(pre):
    g = sf.opt({**OPT, "num_hidden_layers": 1, "vocab_size": 64, "do_layer_norm_before": pre}, seq=8, batch=2)
    got = sorted((c.phase, c.at) for c in collectives(_megatron_plan(g)))
    # post-LN (OPT-350M): the attention reads the embedding sum, the MLP the attention's norm
    attn_in = "layers.0/self_attn_layer_norm" if pre else "embed/add"
    mlp_in = "layers.0/final_layer_norm" if pre else "layers.0/self_attn_layer_norm"
    assert got == sorted(
        [
            ("backward", attn_in),
            ("backward", mlp_in),
            ("backward", "project_out"),  # feeds the vocabulary-split tied LM head
            ("forward", "embed_tokens/lookup"),
            ("forward", "layers.0/fc2"),
            ("forward", "layers.0/self_attn/o"),
            ("forward", "loss"),
        ]
    )


def test_exact_equals_brute_force_on_a_llama_block():
    cfg = dict(
        hidden_size=256,
        num_hidden_layers=1,
        intermediate_size=688,
        num_attention_heads=8,
        num_key_value_heads=4,
    )
    g = sf.llama(cfg, seq=128, batch=4, embeddings=False)
    assert len(ss.ShardProblem(g, 4).variables) == 9  # 7 GEMM weights, 2 norm scales: 3^7 · 2^2 plans
    settings = [ShardCost(), ShardCost(link_bytes_per_s=1e6)]
    optima = set()
    for devices, cost in itertools.product((2, 4), settings):
        pb = ss.ShardProblem(g, devices, cost=cost)
        brute, exact = ss.brute_force(pb), ss.solve_exact(pb)
        assert exact.status == "optimal" and exact.cost.fits
        assert exact.cost.step_s == pytest.approx(brute.cost.step_s, rel=1e-9)
        optima.add(tuple(sorted(exact.choice.items())))
    # NVLink: Megatron's plan (q, k, v, gate, up by columns; o, down by rows); a slow link: replicate
    megatron = {k: (-1 if v is None else v) for k, v in g.meta["megatron"].items()}
    assert optima == {tuple(sorted(megatron.items())), tuple(sorted((k, -1) for k in megatron))}


def test_shard_llama2_7b_and_opt_350m():
    from archplace.api.sharding import ShardRequest, shard

    res = shard(ShardRequest("llama2-7b", devices=8, batch=1, seq=1024))
    assert res.family == "llama" and res.status == "optimal" and res.fits
    assert res.graph["parameters"] == 6_738_415_616
    ref = res.reference
    assert ref["dropped"] == 0 and res.step_s <= ref["step_s"] * (1 + 1e-12)
    # the exact plan is Megatron's except for the embedding, which it keeps whole (no lookup AllReduce)
    assert ref["differences"] == ["embed_tokens: 0 -> -1"]
    assert res.table3["layers.*/self_attn/k_proj/kernel"] == 1 and res.table3["lm_head/kernel"] == 1
    assert res.collectives["forward allreduce"]["count"] == 2 * 32 + 1  # per block 2, the loss
    opt = shard(ShardRequest("opt-350m", devices=8))
    assert opt.family == "opt" and opt.status == "optimal" and opt.fits
    assert opt.reference["differs"] == 0 and opt.step_s == pytest.approx(opt.reference["step_s"], rel=1e-12)


def test_shard_llama_from_a_config_file(tmp_path):
    import json

    from archplace.api.sharding import ShardRequest, shard

    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA, "model_type": "llama"}))
    res = shard(ShardRequest(f"hf:{f}", devices=2, seq=8, batch=2))
    assert res.family == "llama" and res.graph["parameters"] == sf.llama_params(LLAMA)
    f.write_text(json.dumps({**LLAMA, "model_type": "mistral"}))
    with pytest.raises(ValueError, match="family 'mistral'"):
        shard(ShardRequest(f"hf:{f}", devices=2))


def test_rules_rotary_and_repeat_kv():
    M4 = Mesh((("model", 4),))
    B = sm.Builder()
    q = B.input("q", (2, 4, 8, 16), bpe=2)
    cos, sin = B.const("cos", (8, 16)), B.const("sin", (8, 16))
    r = sf.rotary(B, "rope", q, cos, sin)
    g = B.build()
    assert g.ops[0].flops == 3 * 2 * 4 * 8 * 16
    assert propagate(g, M4, {("q", 1): "model"}).spec(r) == (None, "model", None, None)  # heads split
    p = propagate(g, M4, {("q", 2): "model"})  # positions split: cos and sin rows follow
    assert p.spec("cos") == ("model", None) and p.spec("sin") == ("model", None)
    c = propagate(g, M4, {("q", 3): "model"}).conflict  # rotate_half pairs i with i + d/2
    assert c is not None and c.op == "rope"

    B = sm.Builder()
    k = B.input("k", (2, 4, 8, 16), bpe=2)
    y = sf.repeat_kv(B, "rep", k, 2)
    g = B.build()
    assert g.tensors[y].shape == (2, 8, 8, 16)
    p = propagate(g, M4, {("k", 1): "model"})  # contiguous blocks of kv heads = blocks of their copies
    assert p.conflict is None and p.spec(y) == (None, "model", None, None)
    assert sf.repeat_kv(B, "same", k, 1) == k  # no copy without grouping
