"""GDP's workloads (archplace.workloads.gdp_models): parameter counts against closed forms derived by
hand (and torchvision's published Inception-v3 count), GEMMs per unrolled time step, the training
graph's structure, co-location groups and the policy's node features.

Only the small presets are captured here (a few seconds each); 8-layer GNMT (25,183 ops, over the
issue's 20,000) takes 14 s and is built by bench/gdp/gdp_scaling.py, which records its op count."""

import numpy as np
import pytest
import torch

from archplace.workloads.gdp_models import (
    GDP_PRESETS,
    LSTMCell,
    build_module,
    gdp_graph,
    gdp_preset,
    lstm_cell_params,
    node_features,
    num_parameters,
)
from archplace.workloads.graph import OpGraph
from archplace.workloads.inception_v3 import Inception3
from archplace.workloads.ops import OP_KINDS

SMALL = ["rnnlm-2", "gnmt-2", "txl-2", "inception-v3", "amoebanet", "wavenet-2x18"]
GEMM_KINDS = ("linear", "matmul", "conv")

# GDP Table 1's device counts; the 8-layer RNNLM (appendix Table 3 only) takes 8 like its siblings
PAPER_DEVICES = {"rnnlm-2": 2, "rnnlm-4": 4, "rnnlm-8": 8, "gnmt-2": 2, "gnmt-4": 4, "gnmt-8": 8, "txl-2": 2,
                 "txl-4": 4, "txl-8": 8, "inception-v3": 2, "amoebanet": 4, "wavenet-2x18": 2,
                 "wavenet-4x36": 4}


def n_ops(g, layer=None, kinds=GEMM_KINDS, backward=False):
    nd = g.nodes
    mask = np.isin(nd["kind"], kinds) & (nd["is_backward"] == backward)
    if layer is not None:
        mask &= nd["layer"] == g.meta["layers"].index(layer)
    return int(mask.sum())


# ------------------------------------------------------------------------------ presets and input checks
def test_presets_carry_the_papers_device_counts():
    assert {n: p.devices for n, p in GDP_PRESETS.items()} == PAPER_DEVICES
    assert {p.family for p in GDP_PRESETS.values()} == {"rnnlm", "gnmt", "txl", "inception", "amoebanet",
                                                        "wavenet"}
    w = gdp_preset("wavenet-4x36").sizes
    assert (w.stacks, w.stacks * w.blocks_per_stack) == (4, 36)


def test_bad_input_names_the_field_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"unknown GDP preset 'gnmt-3'.*allowed.*'gnmt-8'"):
        gdp_graph("gnmt-3")
    with pytest.raises(ValueError, match="batch must be an integer >= 1, got 0"):
        gdp_graph("txl-2", batch=0)
    with pytest.raises(ValueError, match="training must be True or False"):
        gdp_graph("txl-2", training="yes")


# ------------------------------------------------------------------------------ parameter counts
@pytest.mark.parametrize("x, h", [(1024, 1024), (2048, 1024), (2048, 2048)])
def test_lstm_cell_parameters_closed_form(x, h):
    with torch.device("meta"):
        cell = LSTMCell(x, h)
    n = sum(p.numel() for p in cell.parameters())
    assert n == lstm_cell_params(x, h) == 4 * (h * (x + h) + h)


def test_rnnlm_parameters():
    for name in ("rnnlm-2", "rnnlm-4", "rnnlm-8"):
        s = gdp_preset(name).sizes
        h, v, layers = s.hidden_units, s.vocab_tokens, s.lstm_layers
        # embedding, L cells of 4·(h·2h + h), softmax projection with bias
        assert num_parameters(name) == v * h + layers * 4 * (h * 2 * h + h) + (h * v + v)
    assert num_parameters("rnnlm-2") == 198_229_248


def test_gnmt_parameters():
    for name in ("gnmt-2", "gnmt-4", "gnmt-8"):
        s = gdp_preset(name).sizes
        h, v, layers = s.hidden_units, s.vocab_tokens, s.lstm_layers

        def cell(x, h=h):
            return 4 * (h * (x + h) + h)
        encoder = 2 * cell(h) + cell(2 * h) + (layers - 2) * cell(h)  # bidirectional, 2h input, the rest
        attention = h * h + (h * h + h) + h  # keys, query (with bias), v
        decoder = layers * cell(2 * h)  # [input ; context]
        assert num_parameters(name) == 2 * v * h + encoder + attention + decoder + (h * v + v)


def test_txl_parameters():
    for name in ("txl-2", "txl-4", "txl-8"):
        s = gdp_preset(name).sizes
        d, nh, dh, di, v = s.model_units, s.heads, s.head_units, s.ffn_units, s.vocab_tokens
        attn = 3 * nh * dh * d + nh * dh * d + nh * dh * d + 2 * nh * dh + 2 * d  # qkv, r, o, u and v, LN
        ff = (d * di + di) + (di * d + d) + 2 * d
        assert num_parameters(name) == v * d + s.transformer_layers * (attn + ff) + (d * v + v)


def test_wavenet_parameters_and_dilations():
    for name, blocks in (("wavenet-2x18", 18), ("wavenet-4x36", 36)):
        s = gdp_preset(name).sizes
        q, r, g, sk, k, k0 = (s.quantization_levels, s.residual_channels, s.dilation_channels,
                              s.skip_channels, s.filter_taps, s.initial_filter_taps)
        block = 2 * (g * r * k + g) + (r * g + r) + (sk * g + sk)  # filter, gate, residual 1x1, skip 1x1
        expected = (q * r * k0 + r) + blocks * block - (r * g + r) + (sk * sk + sk) + (q * sk + q)
        assert num_parameters(name) == expected
        m = build_module(gdp_preset(name))
        assert [b.filter.dilation[0] for b in m.blocks] == [2 ** i for i in range(9)] * s.stacks
    assert num_parameters("wavenet-2x18") == 1_053_120


def test_amoebanet_parameters_from_the_genotype():
    s = gdp_preset("amoebanet").sizes
    n, c, classes = s.normal_cells_per_stage, s.initial_channels, s.classes

    def bn(ch):
        return 2 * ch

    def sep(ch, k):  # two (depthwise k×k, pointwise 1×1, BN)
        return 2 * (ch * k * k + ch * ch + bn(ch))

    # the AmoebaNet-A cells' parameterised operations; pools and identities have none
    normal = lambda ch: 3 * sep(ch, 3) + sep(ch, 5)  # noqa: E731
    reduce = lambda ch: 2 * sep(ch, 3) + 2 * sep(ch, 7) + (2 * 7 * ch * ch + bn(ch))  # noqa: E731
    total = (3 * (c // 2) * 9 + bn(c // 2)) + ((c // 2) * c * 9 + bn(c)) + (c * c * 9 + bn(c))  # stems
    c_pp, c_p, cur = c, c, c
    for i in range(3 * n + 2):
        red = i in (n, 2 * n + 1)
        cur = 2 * cur if red else cur
        # preprocessing: FactorizedReduce (two half-width 1x1) or ReLU-1x1-BN have the same count
        total += (c_pp * cur + bn(cur)) + (c_p * cur + bn(cur))
        total += reduce(cur) if red else normal(cur)
        c_pp, c_p = c_p, 3 * cur  # three states concatenated
    total += c_p * classes + classes
    assert num_parameters("amoebanet") == total == 19_413_800


def test_inception_v3_matches_torchvision():
    """torchvision's inception_v3 has 27,161,264 parameters with its auxiliary classifier (the count
    its model card publishes); the graph is built without it: 27,161,264 - 3,326,696 = 23,834,568."""
    with torch.device("meta"):
        with_aux = Inception3(aux_logits=True)
    aux = sum(p.numel() for p in with_aux.AuxLogits.parameters())
    assert aux == (768 * 128 + 2 * 128) + (128 * 768 * 25 + 2 * 768) + (768 * 1000 + 1000) == 3_326_696
    assert sum(p.numel() for p in with_aux.parameters()) == 27_161_264
    assert num_parameters("inception-v3") == 23_834_568


# ------------------------------------------------------------------------------ training graphs
@pytest.mark.parametrize("name", SMALL)
def test_training_graph_structure(name):
    g = gdp_graph(name)
    p = gdp_preset(name)
    nd = g.nodes
    assert 200 <= g.num_nodes <= 5000
    assert len(g.topo_order()) == g.num_nodes  # a DAG (construction raises on a cycle)
    fwd, bwd = ~nd["is_backward"], nd["is_backward"]
    assert fwd.any() and bwd.any() and g.meta["training"]
    assert g.meta["unmapped_ops"] == []
    assert {k: g.meta[k] for k in ("model", "family", "devices", "batch")} == {
        "model": name, "family": p.family, "devices": p.devices, "batch": p.batch_examples}
    assert g.meta["sizes"] == {k: getattr(p.sizes, k) for k in g.meta["sizes"]}
    # weights: every parameter charged once, to a forward op
    bpe = g.meta["bytes_per_element"]
    assert int(nd["weight_bytes"][fwd].sum()) // bpe == num_parameters(name)
    # one loss, and every forward op leads to it: it is the forward part's only sink
    f = g.forward()
    sinks = np.setdiff1d(np.arange(f.num_nodes), f.edge_pos[0])
    assert f.nodes["kind"][sinks].tolist() == ["cross_entropy"]
    # every forward GEMM has its two backward GEMMs (data and weight gradient)
    assert n_ops(g, backward=True) == 2 * n_ops(g)
    # backward ops point at a forward op
    assert np.isin(nd["fwd_id"][bwd], nd["id"][fwd]).all()


def test_rnnlm_gemms_per_time_step():
    g = gdp_graph("rnnlm-2")
    s = gdp_preset("rnnlm-2").sizes
    t = s.time_steps
    assert g.meta["layers"] == ["embedding", "lstm_layers.0", "lstm_layers.1", "softmax"]
    for i in range(s.lstm_layers):  # per step and layer: W_x·x and W_h·h, and their 2 gradients each
        assert n_ops(g, f"lstm_layers.{i}", ("linear",)) == 2 * t
        assert n_ops(g, f"lstm_layers.{i}", ("linear",), backward=True) == 4 * t
        assert n_ops(g, f"lstm_layers.{i}", ("sigmoid",)) == 3 * t
        assert n_ops(g, f"lstm_layers.{i}", ("tanh",)) == 2 * t
    assert n_ops(g) == 2 * s.lstm_layers * t + 1  # + the softmax projection


def test_gnmt_gemms_per_time_step():
    g = gdp_graph("gnmt-2")
    s = gdp_preset("gnmt-2").sizes
    src, tgt, layers = s.source_steps, s.target_steps, s.lstm_layers
    assert n_ops(g, "encoder_layers.0") == 4 * src  # forward and backward direction
    assert n_ops(g, "encoder_layers.1") == 2 * src
    for i in range(layers):
        assert n_ops(g, f"decoder_layers.{i}") == 2 * tgt
    # per decoder step: query projection, v·tanh(.), probs @ memory; the keys once per sentence
    assert n_ops(g, "attention", ("linear",)) == 2 * tgt + 1
    assert n_ops(g, "attention", ("matmul",)) == tgt
    assert n_ops(g, "attention", ("softmax",)) == tgt
    assert n_ops(g) == 2 * (layers + 1) * src + (2 * layers + 3) * tgt + 2


def test_txl_gemms_per_layer():
    g = gdp_graph("txl-2")
    for i in range(2):  # qkv, r_net, o_net, fc1, fc2; (q+u)·kᵀ, (q+v)·rᵀ, probs·v
        assert n_ops(g, f"layers.{i}", ("linear",)) == 5
        assert n_ops(g, f"layers.{i}", ("matmul",)) == 3
        assert n_ops(g, f"layers.{i}", ("softmax",)) == 1
        assert n_ops(g, f"layers.{i}", ("where",)) == 1  # the causal mask over memory + segment
    # the memories are model inputs: one per layer, [batch, memory, d_model] in fp32
    s = gdp_preset("txl-2").sizes
    mem = (g.nodes["kind"] == "input") & (g.nodes["output_bytes"] == 32 * s.memory_tokens * s.model_units * 4)
    assert int(mem.sum()) == 2


def test_cnn_gemm_counts():
    inc = gdp_graph("inception-v3")
    assert (n_ops(inc, kinds=("conv",)), n_ops(inc, kinds=("batchnorm",)), n_ops(inc, kinds=("linear",))) == (
        94, 94, 1)
    w = gdp_graph("wavenet-2x18")
    # causal conv; per block filter, gate, skip 1x1 and (all but the last block) residual 1x1; 2 post
    assert n_ops(w, kinds=("conv",)) == 1 + 4 * 18 - 1 + 2
    assert [n_ops(w, f"blocks.{i}", ("tanh",)) for i in range(18)] == [1] * 18
    assert len(w.meta["layers"]) == 18 + 3


@pytest.mark.parametrize("name, groups", [("rnnlm-2", 2 * 2 + 2), ("gnmt-2", 4 * 2 + 8), ("txl-2", 9 * 2 + 2),
                                          ("inception-v3", 94 * 2 + 1), ("wavenet-2x18", 4 * 18 + 2)])
def test_colocation_groups(name, groups):
    g = gdp_graph(name)
    nd = g.nodes
    cg = g.extra_nodes["coloc_group"]
    assert cg.dtype == np.int64 and cg.min() == -1
    assert cg.max() + 1 == groups  # one per weight-owning op, closed form per model
    readers = ~nd["is_backward"] & (nd["weight_bytes"] > 0)
    shared = ~nd["is_backward"] & ~readers & (cg >= 0)  # later readers of a weight owned elsewhere
    assert (cg[readers] >= 0).all() and (shared.sum() == 0) == (name not in ("rnnlm-2", "gnmt-2"))
    assert set(nd["kind"][shared]) <= {"linear", "matmul"}
    fwd_sizes = []
    for gid in range(groups):
        members = np.flatnonzero(cg == gid)
        fwd = members[~nd["is_backward"][members]]
        assert (nd["weight_bytes"][fwd] > 0).sum() == 1  # one owner of the weights ...
        fwd_sizes.append(len(fwd))  # ... and every other op that reads them
        bwd_ids = set(nd["id"][nd["is_backward"] & np.isin(nd["fwd_id"], nd["id"][fwd])].tolist())
        assert set(nd["id"][members].tolist()) == set(nd["id"][fwd].tolist()) | bwd_ids and bwd_ids
    # an unrolled RNN reads each LSTM weight once per time step; the other models read a weight once
    steps = getattr(gdp_preset(name).sizes, "time_steps", None)
    if name == "rnnlm-2":
        assert sorted(fwd_sizes)[-2 * 2:] == [steps] * 4  # W and U of 2 layers: every step
    elif name != "gnmt-2":
        assert fwd_sizes == [1] * groups
    # backward ops of forward ops in no group are in no group
    weightless = set(nd["id"][~nd["is_backward"] & (cg == -1)].tolist())
    bwd = nd["is_backward"]
    assert (cg[bwd][np.isin(nd["fwd_id"][bwd], list(weightless))] == -1).all()


def test_node_features():
    g = gdp_graph("rnnlm-2")
    x, names = node_features(g)
    kinds = sorted(k for k in OP_KINDS if k != "attention")  # GDP graphs hold no fused attention
    k = len(kinds)
    assert x.dtype == np.float32 and x.shape == (g.num_nodes, k + 9) and len(names) == k + 9
    assert names[:k] == [f"kind={n}" for n in kinds]
    assert np.array_equal(x[:, :k].sum(1), np.ones(g.num_nodes, np.float32))
    kinds = np.array(names[:k])[x[:, :k].argmax(1)]
    assert np.array_equal(kinds, np.char.add("kind=", g.nodes["kind"].astype(str)))
    col = {n: x[:, i].astype(np.float64) for i, n in enumerate(names)}
    src, dst = g.edge_pos

    def z(v):
        v = np.asarray(v, np.float64)
        return (v - v.mean()) / v.std()

    # sizes and degrees: log1p, standardised over the graph (mean 0, std 1)
    np.testing.assert_allclose(col["z_log1p_weight_bytes"], z(np.log1p(g.nodes["weight_bytes"])), atol=1e-5)
    np.testing.assert_allclose(col["z_log1p_flops"], z(np.log1p(g.nodes["flops"])), atol=1e-5)
    np.testing.assert_allclose(col["z_log1p_in_degree"], z(np.log1p(np.bincount(dst, minlength=g.num_nodes))),
                               atol=1e-5)
    for name in ("z_log1p_output_bytes", "z_log1p_flops", "z_log1p_weight_bytes", "z_log1p_in_degree",
                 "z_log1p_out_degree"):
        assert abs(col[name].mean()) < 1e-5 and col[name].std() == pytest.approx(1.0, abs=1e-5)
    assert np.array_equal(col["is_backward"], g.nodes["is_backward"].astype(np.float64))
    rank = col["topo_rank"]
    assert rank.min() == 0.0 and rank.max() == 1.0 and (rank[src] < rank[dst]).all()
    # depth / height: longest path from a source / to a sink, over the longest path (brute force below)
    depth, height = col["topo_depth"], col["topo_height"]
    assert depth.min() == 0.0 and depth.max() == 1.0 and height.min() == 0.0 and height.max() == 1.0
    assert (depth[src] < depth[dst]).all() and (height[src] > height[dst]).all()
    longest = np.zeros(g.num_nodes)
    for _ in range(g.num_nodes):  # Bellman-Ford style relaxation to the fixed point
        nxt = longest.copy()
        np.maximum.at(nxt, dst, longest[src] + 1)
        if np.array_equal(nxt, longest):
            break
        longest = nxt
    np.testing.assert_allclose(depth, longest / longest.max(), atol=1e-6)
    # deterministic, and the same after a Parquet round trip (which keeps the co-location column)
    back = OpGraph.from_arrow(g.to_arrow())
    assert back.equals(g) and np.array_equal(node_features(back)[0], x)


def test_forward_only_fused_and_rebatched_graphs():
    f = gdp_graph("txl-2", training=False)
    assert not f.nodes["is_backward"].any() and "cross_entropy" not in f.nodes["kind"]
    assert (f.extra_nodes["coloc_group"] >= 0).sum() == 9 * 2 + 2
    fused = gdp_graph("txl-2", fuse=True)
    assert (fused.nodes["core"] == "fused").any() and fused.num_nodes < gdp_graph("txl-2").num_nodes
    b4 = gdp_graph("txl-2", batch=4, training=False)
    s = gdp_preset("txl-2").sizes
    ids = b4.nodes["name"] == "ids"
    assert b4.meta["batch"] == 4 and b4.nodes["output_bytes"][ids].tolist() == [4 * s.segment_tokens * 8]
    assert b4.num_nodes == f.num_nodes
