"""Real model graphs from transformers: parameter counts, closed-form flops, TMP slices, backward,
replication, layers."""

import numpy as np
import pytest

from archplace.workloads import layer_graph
from archplace.workloads.backward import derive_backward
from archplace.workloads.models import PRESETS, build_graph, full_model_parameters

# the reference counts, which transformers reports for these configs
REFERENCE_PARAMS = {"bert-large": 335_141_888, "gpt2-xl": 1_557_611_200,
                    "opt-350m": 331_196_416, "llama2-7b": 6_738_415_616}


def gemm_flops(g, mask):
    nd = g.nodes
    return float((2.0 * nd["gemm_b"] * nd["gemm_m"] * nd["gemm_n"] * nd["gemm_k"])[mask].sum())


def graph_params(g):
    """Parameters counted once: a tied embedding's copy at the LM head is left out."""
    return g.totals()["weight_bytes"] // g.meta["bytes_per_element"]


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMS))
def test_parameter_counts_match_transformers(name):
    g = build_graph(name, mbs=1, training=False)
    assert abs(graph_params(g) - REFERENCE_PARAMS[name]) <= 0.005 * REFERENCE_PARAMS[name]
    assert full_model_parameters(name) == REFERENCE_PARAMS[name]


@pytest.mark.parametrize("name", ["bert-base", "t5-base", "megatron-2.5b", "gpt3-175b"])
def test_other_presets_match_transformers_exactly(name):
    g = build_graph(name, seq=128, mbs=1, training=False)
    assert graph_params(g) == full_model_parameters(name)
    assert len(g.meta["layers"]) == sum(PRESETS[name].depths.values()) + (3 if name == "t5-base" else 2)


@pytest.mark.parametrize("b, s", [(1, 512), (2, 512), (4, 128), (8, 64)])
def test_bert_large_layer_gemm_flops_closed_form(b, s):
    h = 1024
    g = build_graph("bert-large", seq=s, mbs=b, training=False)
    layer = g.meta["layers"].index("encoder.layer.5")
    mask = (g.nodes["layer"] == layer) & np.isin(g.nodes["core"], ["tensor", "fused"])
    closed = 2 * b * s * 12 * h * h + 4 * b * s * s * h
    assert gemm_flops(g, mask) == pytest.approx(closed, rel=0.01)
    # the flops column carries the GEMM flops (plus the fused vector part)
    assert g.nodes["flops"][mask].sum() >= closed


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tmp_slice_carries_one_over_t_plus_allreduce(t):
    b, s, h = 2, 256, 1024
    full = build_graph("bert-large", seq=s, mbs=b, tmp=1)
    part = build_graph("bert-large", seq=s, mbs=b, tmp=t)
    i = full.meta["layers"].index("encoder.layer.3")
    assert part.meta["layers"][i] == "encoder.layer.3" and part.meta["tmp"] == t
    for graph, div in ((full, 1), (part, t)):
        fwd = ~graph.nodes["is_backward"]
        layer = graph.nodes["layer"] == i
        mask = layer & fwd & np.isin(graph.nodes["core"], ["tensor", "fused"])
        assert gemm_flops(graph, mask) == pytest.approx((2 * b * s * 12 * h * h + 4 * b * s * s * h) / div)
    nd = part.nodes
    layer = nd["layer"] == i
    ar = layer & (nd["kind"] == "allreduce")
    # Megatron: AllReduce after attention and after the MLP in forward, and of both inputs' grads
    assert (ar & ~nd["is_backward"]).sum() == 2 and (ar & nd["is_backward"]).sum() == 2
    assert set(nd["output_bytes"][ar]) == {b * s * h * 2}
    assert not (full.nodes["kind"] == "allreduce").any()
    # weights of the block split t ways; LayerNorms stay replicated
    wf = full.nodes["weight_bytes"][full.nodes["layer"] == i].sum()
    wp = nd["weight_bytes"][layer].sum()
    ln = 2 * 2 * h * 2  # two LayerNorms, weight + bias, 2 bytes each
    assert wp - ln == (wf - ln) // t


@pytest.mark.parametrize("mbs", [1, 2])
def test_tmp_width_must_divide_heads(mbs):
    """25 heads: no width above 1, whatever the microbatch (2 × 25 attention GEMMs divide by 2)."""
    with pytest.raises(ValueError, match=r"^tmp width 2 does not divide field 'num_attention_heads' = 25 "
                       r"of model 'gpt2-xl'; allowed widths: \[1\]$"):
        build_graph("gpt2-xl", seq=64, mbs=mbs, tmp=2)
    with pytest.raises(ValueError, match="power of two"):
        build_graph("bert-base", seq=64, tmp=3)


@pytest.mark.parametrize("b", [1, 2, 4, 8])
def test_microbatch_scales_activations_not_weights(b):
    one = build_graph("bert-base", seq=128, mbs=1)
    g = build_graph("bert-base", seq=128, mbs=b)
    assert g.num_nodes == one.num_nodes
    assert g.totals()["weight_bytes"] == one.totals()["weight_bytes"]
    # linear in b, up to batch-independent saved inputs (the position-id buffer: 128 × 8 bytes)
    assert g.totals()["activation_bytes"] - b * one.totals()["activation_bytes"] == -(b - 1) * 1024


def test_backward_is_complete_for_every_model_op():
    g = build_graph("llama2-7b", seq=256, mbs=1, tmp=2)
    nd = g.nodes
    fwd = ~nd["is_backward"]
    needs_grad = fwd & (nd["kind"] != "input")
    have = set(nd["fwd_id"][~fwd].tolist())
    assert set(nd["id"][needs_grad].tolist()) == have
    # each GEMM gives exactly two GEMMs with the same flops and transposed shapes
    gemm = needs_grad & np.isin(nd["core"], ["tensor", "fused"])
    bwd_gemm = ~fwd & (nd["core"] == "tensor")
    assert bwd_gemm.sum() == 2 * gemm.sum()
    assert gemm_flops(g, bwd_gemm) == pytest.approx(2 * gemm_flops(g, gemm))
    # every TMP copy-to-region becomes a backward AllReduce, every forward AllReduce an identity
    copies = nd["id"][fwd & (nd["kind"] == "tp_copy")]
    grads = ~fwd & np.isin(nd["fwd_id"], copies)
    assert len(copies) > 0 and (nd["kind"][grads] == "allreduce").all()


def test_backward_rules_on_a_hand_made_graph():
    from test_graph import small

    g = derive_backward(small())
    nd = g.nodes
    bwd = np.flatnonzero(nd["is_backward"])
    names = list(nd["name"][bwd])
    assert names == ["op3/dgrad", "op3/wgrad", "op2/grad", "op1/dgrad", "op1/wgrad"]
    by = {n: i for n, i in zip(names, bwd)}
    # linear y[8x4] = x[8x16] W: dX = dY W^T (m=8, n=16, k=4); dW = X^T dY (m=16, n=4, k=8)
    d, w = by["op3/dgrad"], by["op3/wgrad"]
    assert (nd["gemm_m"][d], nd["gemm_n"][d], nd["gemm_k"][d]) == (8, 16, 4)
    assert (nd["gemm_m"][w], nd["gemm_n"][w], nd["gemm_k"][w]) == (16, 4, 8)
    assert nd["flops"][d] == nd["flops"][w] == 1024
    assert nd["flops"][by["op2/grad"]] == 1.5 * 128  # gelu's gradient factor
    src, dst = g.edge_pos
    pairs = {(nd["name"][s], nd["name"][t]) for s, t in zip(src, dst)}
    assert ("op3/dgrad", "op2/grad") in pairs  # gradient flows against the forward edge
    assert ("op2/grad", "op1/dgrad") in pairs and ("op2/grad", "op1/wgrad") in pairs
    assert ("op3", "op3/wgrad") in pairs  # saved input feeds the weight gradient
    assert ("op3", "op3/dgrad") in pairs  # the output seeds its own gradient
    assert g.topo_order()[-1] in bwd
    with pytest.raises(ValueError, match="forward-only"):
        derive_backward(g)


@pytest.mark.parametrize("name", ["bert-base", "t5-base"])
def test_replicated_blocks_equal_a_full_capture(name):
    """Capturing 3 blocks and replicating gives the same graph as capturing all 12."""
    tmp = 2 if name == "bert-base" else 1
    rep = build_graph(name, seq=64, mbs=2, tmp=tmp)
    full = build_graph(name, seq=64, mbs=2, tmp=tmp, capture_blocks=12)
    a, b = layer_graph(rep), layer_graph(full)
    assert a.names == b.names
    assert a.structural_hash == b.structural_hash
    assert rep.totals() == full.totals()
    for col in ("kind", "core", "gemm_m", "flops", "output_bytes", "is_backward"):
        assert np.array_equal(rep.nodes[col], full.nodes[col])
    assert np.array_equal(rep.edges["bytes"], full.edges["bytes"])


def test_repeated_layers_are_detected():
    g = build_graph("megatron-8.3b", seq=128, tmp=4)
    lg = layer_graph(g)
    groups = lg.repeat_groups()
    biggest = max(groups, key=len)
    # block 0 .. 70 repeat; the last block also feeds the head's final norm differently: it repeats too
    assert len(biggest) >= 71
    assert all(lg.names[i].startswith("transformer.h.") for i in biggest)
    assert len(groups) <= 4


@pytest.mark.parametrize("name", ["bert-large", "gpt2-xl", "opt-350m", "llama2-7b", "t5-base"])
def test_layers_are_contiguous(name):
    """Each layer is convex: no path leaves a layer and comes back (checked on the layer DAG)."""
    g = build_graph(name, seq=64, mbs=1)
    lg = layer_graph(g)
    assert lg.is_linear()
    src, dst = g.edge_pos
    layer = g.nodes["layer"]
    fwd = ~g.nodes["is_backward"]
    e = fwd[src] & fwd[dst]
    assert (layer[src[e]] <= layer[dst[e]]).all()  # forward edges never go to an earlier layer


def test_every_op_is_mapped_and_classified():
    for name in ("bert-large", "llama2-7b", "t5-base", "opt-350m"):
        g = build_graph(name, seq=64, mbs=1, training=False)
        assert g.meta["unmapped_ops"] == []
        nd = g.nodes
        gemm = np.isin(nd["core"], ["tensor", "fused"])
        assert (nd["gemm_m"][gemm] > 0).all() and (nd["gemm_m"][~gemm] == 0).all()
        kinds = set(nd["kind"][nd["core"] == "vector"])
        assert {"softmax", "add"} <= kinds


def test_eager_attention_is_required():
    import torch
    import transformers

    from archplace.workloads.extract import capture_ops

    cfg = transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=128, attn_implementation="sdpa")
    with torch.device("meta"):
        model = transformers.BertModel(cfg)
    ids = torch.zeros((1, 16), dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        capture_ops(model, (ids,), {})


@pytest.mark.parametrize("kwargs, match", [
    (dict(name="bert-huge"), "unknown model 'bert-huge'; known models"),
    (dict(name="bert-base", mbs=0), "mbs must be a positive integer"),
    (dict(name="bert-base", seq=4096), "seq 4096 exceeds bert-base's maximum of 512"),
    (dict(name="bert-base", bytes_per_element=3), "bytes_per_element must be"),
])
def test_bad_build_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_graph(**kwargs)
