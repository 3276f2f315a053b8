"""The sharding-propagation engine: each rule on hand cases, Megatron's GPT block collectives, the
known chained-GEMM conflict, memory in closed form and parameter counts against transformers."""

from __future__ import annotations

import pytest

from archplace.workloads import sharding_models as sm
from archplace.workloads.sharding import Mesh, collectives, memory, propagate

M4 = Mesh((("model", 4),))


def _megatron(g, extra=None):
    dec = {
        (n, d if d is not None else 0): ("model" if d is not None else None)
        for n, d in g.meta["megatron"].items()
    }
    return {**dec, **(extra or {})}


def _kinds(p):
    return sorted((c.phase, c.kind, c.at) for c in collectives(p))


def test_megatron_gpt_block_collectives():
    g = sm.gpt_block(hidden=64, heads=4, seq=16, batch=2)
    p = propagate(g, M4, _megatron(g, {("x", 0): None, ("x", 1): None}))
    assert p.conflict is None
    # one forward AllReduce after the row-parallel GEMM and one backward AllReduce of the block input's
    # gradient (Megatron's g and f), per attention block and per MLP
    assert _kinds(p) == [
        ("backward", "allreduce", "ln_1"),
        ("backward", "allreduce", "ln_2"),
        ("forward", "allreduce", "attn/o"),
        ("forward", "allreduce", "mlp/c_proj"),
    ]
    assert {c.bytes for c in collectives(p)} == {2 * 16 * 64 * 2}  # [b, s, h] bf16, replicated
    assert p.spec("attn/q/bnsd") == (None, "model", None, None)  # heads split
    assert p.spec("attn/o/kernel") == ("model", None)
    assert p.spec("mlp/c_fc/bias") == ("model",)


def test_megatron_gpt_two_layers_with_embedding():
    g = sm.gpt(layers=2, hidden=32, heads=4, vocab=64, seq=8, batch=2)
    p = propagate(g, M4, _megatron(g, {("input_ids", 0): None, ("input_ids", 1): None, ("labels", 0): None}))
    assert p.conflict is None
    fwd = [c for c in collectives(p) if c.phase == "forward"]
    bwd = [c for c in collectives(p) if c.phase == "backward"]
    # 2 per layer + vocab-parallel embedding lookup + vocab-parallel cross entropy (3 fp32 statistics)
    assert sorted(c.at for c in fwd) == sorted(
        ["embed/tokens", "h.0/attn/o", "h.0/mlp/c_proj", "h.1/attn/o", "h.1/mlp/c_proj", "loss"]
    )
    loss = next(c for c in fwd if c.at == "loss")
    assert loss.bytes == 3 * 2 * 8 * 4
    # backward: 2 per layer, and ln_f's output feeds the vocab-split LM head
    assert sorted(c.at for c in bwd) == sorted(["h.0/ln_1", "h.0/ln_2", "h.1/ln_1", "h.1/ln_2", "ln_f"])


def test_chained_gemm_inconsistent_contracting_split_is_a_conflict():
    g = sm.mlp2(batch=8, d=16, f=64, bias=False)
    # fc1 split by columns makes the hidden activation split on f; fc2 then contracts f but is told
    # to keep it replicated (split on its output instead)
    p = propagate(g, M4, {("fc1/kernel", 1): "model", ("fc2/kernel", 1): "model"})
    assert p.status == "conflict"
    # fc1's column split made fc2's contracting dim 0 split, which leaves its dim 1 replicated
    assert p.conflict.op == "fc2" and "fc2/kernel dim 1" in p.conflict.dims
    assert "fc2/kernel splitting dim 0 (decision on fc1/kernel dim 1)" in p.conflict.reason
    # both GEMMs split on their contracting dims: fc1's output is AllReduced (replicated), which fc2's
    # split contracting dim cannot read
    p = propagate(g, M4, {("fc1/kernel", 0): "model", ("fc2/kernel", 0): "model"})
    assert (
        p.status == "conflict" and p.conflict.op == "fc2" and "fc2/kernel dim 0 (label 'k'" in p.conflict.dims
    )
    # the consistent pair (column then row) is fine and costs one AllReduce each way
    p = propagate(g, M4, {("fc1/kernel", 1): "model", ("fc2/kernel", 0): "model", ("x", 0): None})
    assert p.conflict is None
    assert _kinds(p) == [("forward", "allreduce", "fc2")]  # x is an input: no gradient to reduce


def test_rules_gemm_and_data_parallel_gradients():
    g = sm.mlp2(batch=8, d=16, f=64)
    p = propagate(g, Mesh((("data", 2),)), {("x", 0): "data"})
    assert p.conflict is None
    assert p.spec("relu") == ("data", None)
    # the weights' dims are forced replicated (a tensor splits one dim per axis), and each weight's
    # gradient contracts the split batch: one AllReduce per weight and bias, nothing forward
    kinds = _kinds(p)
    assert [k[:2] for k in kinds] == [("backward", "allreduce")] * 4
    assert {k[2] for k in kinds} == {"fc1/kernel", "fc1/bias", "fc2/kernel", "fc2/bias"}
    assert next(c for c in collectives(p) if c.at == "fc1/kernel").bytes == 16 * 64 * 2


def test_rules_elementwise_broadcast_embedding_norm_softmax():
    B = sm.Builder()
    x = B.input("x", (4, 8), bpe=2)
    b = B.param("b", (1, 8))
    y = B.elementwise("add", "add", x, b)
    g = B.build()
    # the broadcast size-1 dim is not tied to the batch: splitting x's batch leaves b free
    p = propagate(g, M4, {("x", 0): "model"})
    assert p.conflict is None and p.spec("b") == (None, None) and p.spec(y) == ("model", None)
    assert propagate(g, M4, {("b", 1): "model"}).spec("x") == (None, "model")

    B = sm.Builder()
    ids = B.input("ids", (2, 4))
    tab = B.param("table", (16, 8))
    e = B.embedding("lookup", ids, tab)
    n = B.norm("ln", e, B.param("s", (8,)))
    B.softmax("sm", n)
    g = B.build()
    p = propagate(g, M4, {("table", 0): "model"})  # vocabulary split: partial sum
    assert [(c.kind, c.at, c.bytes) for c in collectives(p)] == [("allreduce", "lookup", 2 * 4 * 8 * 2)]
    c = propagate(g, M4, {("table", 1): "model"}).conflict  # hidden split meets the norm's axis
    assert c is not None and c.op == "ln" and "'h'" in c.dims
    B = sm.Builder()
    s = B.softmax("sm", B.input("x", (4, 8), bpe=2))
    g = B.build()
    assert propagate(g, M4, {("x", 0): "model"}).conflict is None
    assert propagate(g, M4, {(s, 1): "model"}).conflict.op == "sm"


def test_rules_reshape_transpose_reduce():
    B = sm.Builder()
    x = B.input("x", (2, 8, 64), bpe=2)
    r = B.reshape("split_heads", x, (2, 8, 4, 16))
    t = B.transpose("tr", r, (0, 2, 1, 3))
    s = B.reduce("sum", "sum", t, (1,))
    g = B.build()
    p = propagate(g, M4, {("x", 2): "model"})  # hidden 64 -> heads 4: the groups line up
    assert (
        p.conflict is None
        and p.spec(r) == (None, None, "model", None)
        and p.spec(t) == (None, "model", None, None)
    )
    assert [(c.kind, c.at) for c in collectives(p)] == [("allreduce", "sum")]  # reduced axis was split
    assert p.spec(s) == (None, None, None)
    c = propagate(g, M4, {(r, 3): "model"}).conflict  # the inner dim of a group does not line up
    assert c is not None and c.op == "split_heads"
    c = propagate(g, Mesh((("model", 8),)), {("x", 2): "model"}).conflict  # 4 heads over 8 devices
    assert c is not None and "do not divide" in c.reason


def test_rules_attention_conv_reshard():
    B = sm.Builder()
    q = B.input("q", (2, 4, 8, 16), bpe=2)
    k = B.input("k", (2, 4, 8, 16), bpe=2)
    v = B.input("v", (2, 4, 8, 16), bpe=2)
    o = B.attention("attn", q, k, v)
    g = B.build()
    assert propagate(g, M4, {("q", 1): "model"}).spec(o) == (None, "model", None, None)
    assert propagate(g, M4, {("q", 2): "model"}).spec("k") == (None, None, None, None)  # query split ok
    assert propagate(g, M4, {("k", 2): "model"}).conflict.op == "attn"  # key positions may not split

    B = sm.Builder()
    x = B.input("x", (4, 8, 6, 6), bpe=2)
    y = B.conv2d("conv", x, B.param("w", (16, 8, 3, 3)))
    g = B.build()
    p = propagate(g, M4, {("w", 1): "model"})  # input channels: a partial sum
    assert [(c.kind, c.bytes) for c in collectives(p)] == [("allreduce", 4 * 16 * 6 * 6 * 2)]
    assert propagate(g, M4, {("w", 0): "model"}).spec(y) == (None, "model", None, None)
    assert propagate(g, M4, {("x", 2): "model"}).conflict.op == "conv"

    B = sm.Builder()
    x = B.param("x", (8, 16))
    y = B.reshard("rs", x)
    g = B.build()
    kinds = lambda d: sorted((c.phase, c.kind) for c in collectives(propagate(g, M4, d)))  # noqa: E731
    assert kinds({("x", 0): "model", (y, 0): None}) == [
        ("backward", "reducescatter"),
        ("forward", "allgather"),
    ]
    assert kinds({("x", 0): "model", (y, 1): "model"}) == [("backward", "alltoall"), ("forward", "alltoall")]
    assert kinds({("x", 0): None, (y, 1): "model"}) == []  # a local slice


def test_two_axes_and_memory_closed_form():
    g = sm.mlp2(batch=8, d=16, f=64, bias=False)
    mesh = Mesh((("data", 2), ("model", 4)))
    p = propagate(g, mesh, {("x", 0): "data", ("fc1/kernel", 1): "model", ("fc2/kernel", 0): "model"})
    assert p.conflict is None and p.spec("relu") == ("data", "model")
    mem = memory(p)
    params = (16 * 64 + 64 * 16) * 2 // 4
    assert (mem.params_bytes, mem.optimizer_bytes) == (params, 6 * params)
    # activations: fc1 and relu [8,64] split 2x4, fc2 [8,16] split on data only
    assert mem.activations_bytes == 2 * (8 * 64 * 2 // 8) + 8 * 16 * 2 // 2
    ks = sorted((c.phase, c.kind, c.axis, c.at) for c in collectives(p))
    assert ks == [
        ("backward", "allreduce", "data", "fc1/kernel"),
        ("backward", "allreduce", "data", "fc2/kernel"),
        ("forward", "allreduce", "model", "fc2"),
    ]
    with pytest.raises(ValueError, match="axis 'pipe' unknown"):
        propagate(g, mesh, {("x", 0): "pipe"})


def test_t5_parameter_count_matches_transformers():
    import torch
    import transformers  # a dependency (pyproject): missing, the test fails rather than skips

    cfg = dict(d_model=32, d_ff=64, d_kv=8, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=100)
    with torch.device("meta"):
        ref = transformers.T5ForConditionalGeneration(transformers.T5Config(**cfg)).num_parameters()
    assert sm.t5(cfg, seq=8, batch=2).num_params() == ref
    bcfg = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=16,
    )
    with torch.device("meta"):
        ref = transformers.BertModel(transformers.BertConfig(**bcfg)).num_parameters()
    assert sm.bert(bcfg, seq=8, batch=2).num_params() == ref
    gcfg = dict(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=100)
    with torch.device("meta"):
        ref = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gcfg)).num_parameters()
    assert sm.gpt(layers=2, hidden=32, heads=4, vocab=100, seq=8, batch=2, positions=16).num_params() == ref


def test_vgg19_parameter_count():
    # Simonyan & Zisserman 2015, Table 2: configuration E has 144M parameters (143,667,240 in Keras)
    assert sm.vgg19(batch=2).num_params() == 143_667_240


def test_an_op_splits_its_work_along_one_label_per_axis():
    # ids split by batch and the table by vocabulary share no tensor, but the lookup would need every
    # vocabulary shard for its batch shard: the op's labels obey the one-split-per-axis rule
    B = sm.Builder()
    ids = B.input("ids", (4, 8))
    B.embedding("lookup", ids, B.param("table", (16, 8)))
    g = B.build()
    c = propagate(g, M4, {("ids", 0): "model", ("table", 0): "model"}).conflict
    assert (
        c is not None
        and c.op == "lookup"
        and "table dim 0" in c.dims
        and "op lookup splitting label 'a'" in c.reason
    )
    # on two axes the same pair is fine: batch over one, vocabulary over the other
    mesh = Mesh((("data", 2), ("model", 4)))
    p = propagate(g, mesh, {("ids", 0): "data", ("table", 0): "model"})
    assert p.conflict is None and p.spec("lookup") == ("data", None, None)
    got = sorted((c.phase, c.kind, c.axis, c.at) for c in collectives(p))
    assert got == [("backward", "allreduce", "data", "table"), ("forward", "allreduce", "model", "lookup")]
