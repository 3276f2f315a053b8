"""Synthetic generators: determinism, structure, sizes derived from shapes, layers, Parquet."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from archplace.workloads.graph import OpGraph
from archplace.workloads.ops import OP_KINDS, TENSOR_KINDS
from archplace.workloads.synthetic import cnn_graph, layered_dag, rnn_graph

BPE = 2

# (id, factory taking a seed)
GENERATORS: list[tuple[str, Callable[[int], OpGraph]]] = [
    ("dag10", lambda s: layered_dag(10, 3, s)),
    ("dag120", lambda s: layered_dag(120, 6, s)),
    ("dag500", lambda s: layered_dag(500, 12, s)),
    ("dag_chain", lambda s: layered_dag(30, 1, s)),
    ("cnn0", lambda s: cnn_graph(0, s)),
    ("cnn3", lambda s: cnn_graph(3, s)),
    ("cnn12", lambda s: cnn_graph(12, s)),
    ("cnn40", lambda s: cnn_graph(40, s)),
    ("rnn2", lambda s: rnn_graph(2, 64, s, cell="rnn")),
    ("rnn50", lambda s: rnn_graph(50, 256, s, cell="rnn")),
    ("lstm1", lambda s: rnn_graph(1, 128, s)),
    ("lstm8", lambda s: rnn_graph(8, 512, s)),
    ("lstm22", lambda s: rnn_graph(22, 1024, s, input_size=512)),
]
IDS = [g[0] for g in GENERATORS]
FACTORIES = [g[1] for g in GENERATORS]
# sizes where two seeds must give different graphs (tiny ones may coincide by chance)
VARIED = [f for i, f in zip(IDS, FACTORIES, strict=True) if i not in ("cnn0", "rnn2", "lstm1")]


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_deterministic_for_a_seed(make):
    g1, g2 = make(7), make(7)
    assert g1.equals(g2)
    assert g1.content_hash() == g2.content_hash()


@pytest.mark.parametrize("make", VARIED, ids=[i for i in IDS if i not in ("cnn0", "rnn2", "lstm1")])
def test_different_seeds_differ(make):
    graphs = [make(s) for s in (0, 1, 2)]
    hashes = {g.content_hash() for g in graphs}
    assert len(hashes) == 3
    assert not graphs[0].equals(graphs[1])


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_acyclic_forward_only_and_topological_ids(make):
    g = make(3)
    assert g.num_nodes >= 7
    assert len(g.topo_order()) == g.num_nodes
    assert np.array_equal(g.nodes["id"], np.arange(g.num_nodes))
    assert (g.edges["src"] < g.edges["dst"]).all()  # ids are a topological order
    assert not g.nodes["is_backward"].any()
    assert (g.nodes["fwd_id"] == -1).all()
    assert set(g.nodes["tp_role"]) == {""}
    assert g.meta["source"] == "synthetic"
    assert g.meta["bytes_per_element"] == 2
    assert isinstance(g.meta["model"], str) and g.meta["model"]
    assert len(set(g.nodes["name"])) == g.num_nodes  # names are unique


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_gemm_flops_and_shapes(make):
    g = make(5)
    nd = g.nodes
    tensor = np.isin(nd["kind"], list(TENSOR_KINDS))
    assert tensor.any()
    b, m, n, k = (nd[c] for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))
    for r in np.flatnonzero(tensor):
        assert min(b[r], m[r], n[r], k[r]) >= 1
        assert nd["flops"][r] == 2 * int(b[r]) * int(m[r]) * int(n[r]) * int(k[r])  # exact
        assert nd["vector_flops"][r] == 0
        assert nd["output_bytes"][r] == b[r] * m[r] * n[r] * BPE  # output is [b, m, n]
        if nd["kind"][r] in ("linear", "conv"):
            assert nd["weight_bytes"][r] == k[r] * n[r] * BPE
        if nd["kind"][r] == "linear":
            assert nd["input_bytes"][r] == b[r] * m[r] * k[r] * BPE  # one [m, k] activation
        if nd["kind"][r] == "matmul":  # of two activations, no weights
            assert nd["weight_bytes"][r] == 0
    for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"):
        assert (nd[c][~tensor] == 0).all()


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_bytes_consistent_with_edges(make):
    g = make(11)
    nd = g.nodes
    src, dst = g.edge_pos
    # an edge carries the producer's output
    assert np.array_equal(g.edges["bytes"], nd["output_bytes"][src])
    # an op with predecessors reads exactly its in-edges (sources read an external tensor)
    in_sum = np.bincount(dst, weights=g.edges["bytes"], minlength=g.num_nodes)
    has_pred = np.bincount(dst, minlength=g.num_nodes) > 0
    assert np.array_equal(nd["input_bytes"][has_pred], in_sum[has_pred].astype(np.int64))
    # arguments are numbered 0.. at every consumer
    for v in np.unique(dst):
        assert sorted(g.edges["arg"][dst == v].tolist()) == list(range(int((dst == v).sum())))
    for c in ("input_bytes", "output_bytes", "weight_bytes", "saved_bytes"):
        assert (nd[c] % BPE == 0).all()
    assert (nd["output_bytes"] > 0).all()
    # vector flops = output elements x flops per element; saved activations follow the op kind
    for r in range(g.num_nodes):
        info = OP_KINDS[nd["kind"][r]]
        if info.core == "vector":
            assert nd["flops"][r] == nd["output_bytes"][r] // BPE * info.flops_per_element
            assert nd["vector_flops"][r] == nd["flops"][r]
        elif info.core == "none":
            assert nd["flops"][r] == 0
        want = {"input": nd["input_bytes"][r], "output": nd["output_bytes"][r], "none": 0}[info.saves]
        assert nd["saved_bytes"][r] == want
        if nd["kind"][r] in ("add", "mul", "relu", "tanh", "sigmoid", "batchnorm", "dropout"):
            # element-wise: every input has the output's shape
            assert (g.edges["bytes"][dst == r] == nd["output_bytes"][r]).all()
        if nd["kind"][r] == "cat":
            assert nd["output_bytes"][r] == nd["input_bytes"][r]


def _check_layers(g: OpGraph) -> None:
    layer = g.nodes["layer"]
    nl = len(g.meta["layers"])
    assert nl >= 1
    assert ((layer >= 0) & (layer < nl)).all()
    assert set(layer.tolist()) == set(range(nl))  # no empty layer
    src, dst = g.edge_pos
    assert (layer[src] <= layer[dst]).all()
    # hence sorting a topological order by layer keeps it topological: each layer is a contiguous run
    topo = g.topo_order()
    order = topo[np.argsort(layer[topo], kind="stable")]
    pos = np.empty(g.num_nodes, dtype=np.int64)
    pos[order] = np.arange(g.num_nodes)
    assert (pos[src] < pos[dst]).all()
    # ids are generated layer by layer
    assert (np.diff(layer) >= 0).all()


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_layers_are_contiguous(make):
    _check_layers(make(2))


@pytest.mark.parametrize("make", FACTORIES, ids=IDS)
def test_parquet_round_trip(make, tmp_path: Path):
    g = make(4)
    g2 = OpGraph.from_parquet(g.to_parquet(tmp_path / "g.parquet"))
    assert g2.equals(g)
    assert g2.meta == g.meta


# ------------------------------------------------------------------------------------------ sizes
@pytest.mark.parametrize(("num_nodes", "width"), [(1, 1), (10, 3), (10, 10), (57, 4), (200, 9), (500, 16)])
def test_layered_dag_sizes(num_nodes: int, width: int):
    g = layered_dag(num_nodes, width, seed=num_nodes)
    assert g.num_nodes == num_nodes
    levels = math.ceil(num_nodes / width)
    assert g.meta["layers"] == [f"level{i}" for i in range(levels)]
    counts = np.bincount(g.nodes["layer"], minlength=levels)
    assert counts[:-1].tolist() == [width] * (levels - 1)
    assert counts[-1] == num_nodes - width * (levels - 1)
    src, dst = g.edge_pos
    layer = g.nodes["layer"]
    assert (layer[src] < layer[dst]).all()  # only from earlier to later levels
    has_pred = np.bincount(dst, minlength=g.num_nodes) > 0
    assert not has_pred[layer == 0].any()
    assert has_pred[layer > 0].all()
    indeg = np.bincount(dst, minlength=g.num_nodes)
    assert indeg.max(initial=0) <= 3
    # every non-source op has a predecessor in the level right before it
    for v in np.flatnonzero(layer > 0):
        assert (layer[src[dst == v]] == layer[v] - 1).any()


def test_layered_dag_kind_mix():
    g = layered_dag(400, 10, seed=0)
    kinds = set(g.nodes["kind"])
    assert {"linear", "matmul", "add"} <= kinds
    assert len(kinds & {"relu", "gelu", "silu", "tanh", "sigmoid", "softmax", "layernorm", "dropout"}) >= 4
    g = layered_dag(50, 5, seed=0, max_in=1)
    assert (np.bincount(g.edge_pos[1], minlength=50) <= 1).all()


def test_layered_dag_linear_shapes():
    g = layered_dag(60, 4, seed=3, batch=2, seq=128, hidden=256)
    nd = g.nodes
    lin = nd["kind"] == "linear"
    assert (nd["gemm_m"][lin] == 2 * 128).all()
    assert set(nd["gemm_n"][lin].tolist()) <= {256, 1024}
    mm = nd["kind"] == "matmul"
    assert (nd["gemm_b"][mm] == 2).all() and (nd["gemm_m"][mm] == 128).all()


@pytest.mark.parametrize("num_blocks", [0, 1, 2, 5, 16, 40])
def test_cnn_sizes(num_blocks: int):
    g = cnn_graph(num_blocks, seed=num_blocks)
    assert g.meta["layers"] == ["stem"] + [f"block{i}" for i in range(num_blocks)] + ["head"]
    assert len(g.meta["block_kinds"]) == num_blocks
    assert 7 + 7 * num_blocks <= g.num_nodes <= 7 + 26 * num_blocks
    kinds = g.nodes["kind"]
    assert kinds[0] == "input" and kinds[-1] == "linear"
    assert g.nodes["gemm_n"][-1] == 1000
    # block i's first ops read the output of block i-1 only: one op ends each block
    layer = g.nodes["layer"]
    src, dst = g.edge_pos
    for i in range(1, num_blocks + 2):
        crossing = np.unique(src[(layer[src] < i) & (layer[dst] >= i)])
        assert len(crossing) == 1


def test_cnn_branches_and_conv_dims():
    g = cnn_graph(24, seed=1, batch=8)
    kinds = set(g.meta["block_kinds"])
    assert "inception" in kinds and kinds & {"basic", "bottleneck"}
    nd = g.nodes
    src, dst = g.edge_pos
    for kind in ("add", "cat"):
        rows = np.flatnonzero(nd["kind"] == kind)
        assert len(rows)
        for r in rows:
            assert (dst == r).sum() >= 2  # joins parallel branches
    assert {"relu", "pool", "batchnorm"} <= set(nd["kind"])
    stem = 1  # 7x7/2 conv on 224x224x3
    assert (nd["gemm_m"][stem], nd["gemm_n"][stem], nd["gemm_k"][stem]) == (8 * 112 * 112, 64, 3 * 7 * 7)
    conv = nd["kind"] == "conv"
    hw = nd["gemm_m"][conv] // 8
    side = np.rint(np.sqrt(hw)).astype(np.int64)
    assert (side * side == hw).all()  # m = N * Hout * Wout with square maps
    assert set(side.tolist()) <= {112, 56, 28, 14, 7}
    # convs downsample in 4 stages down to 7x7 and the channels double
    assert side.min() == 7
    assert nd["gemm_n"][conv].max() == 512


@pytest.mark.parametrize(("cell", "per_step", "state"), [("lstm", 22, 2), ("rnn", 5, 1)])
@pytest.mark.parametrize("num_steps", [1, 2, 10, 20])
def test_rnn_sizes(cell: str, per_step: int, state: int, num_steps: int):
    g = rnn_graph(num_steps, 96, seed=num_steps, cell=cell)
    dropped = g.meta["dropout_steps"]
    assert g.num_nodes == state + per_step * num_steps + len(dropped)
    assert g.meta["layers"] == [f"step{t}" for t in range(num_steps)]
    layer = g.nodes["layer"]
    src, dst = g.edge_pos
    assert (layer[dst] - layer[src] <= 1).all()  # a chain: each step feeds only the next one
    assert int((g.nodes["kind"] == "linear").sum()) == num_steps * (8 if cell == "lstm" else 2)
    assert int((g.nodes["kind"] == "dropout").sum()) == len(dropped)
    lin = g.nodes["kind"] == "linear"
    assert (g.nodes["gemm_m"][lin] == 64).all() and (g.nodes["gemm_n"][lin] == 96).all()


def test_rnn_lstm_step_structure():
    g = rnn_graph(3, 32, seed=0, batch=4, input_size=16, dropout_prob=0.0)
    assert g.meta["dropout_steps"] == []
    kinds = g.nodes["kind"][g.nodes["layer"] == 1].tolist()
    assert sorted(kinds) == sorted(["input"] + ["linear"] * 8 + ["add"] * 5 + ["sigmoid"] * 3 + ["tanh"] * 2
                                   + ["mul"] * 3)
    names = g.nodes["name"].tolist()
    lx = names.index("t1.i.linear_x")
    assert (g.nodes["gemm_b"][lx], g.nodes["gemm_m"][lx], g.nodes["gemm_n"][lx], g.nodes["gemm_k"][lx]) \
        == (1, 4, 32, 16)
    assert g.nodes["flops"][lx] == 2 * 4 * 32 * 16
    # the hidden-state linear of step 1 reads step 0's h
    lh = names.index("t1.i.linear_h")
    src, dst = g.edge_pos
    assert g.nodes["name"][src[dst == lh]].tolist() == ["t0.h"]
    assert g.nodes["weight_bytes"][lh] == 32 * 32 * BPE
    assert g.meta["weights_shared_across_steps"] is True
    g = rnn_graph(6, 32, seed=0, dropout_prob=1.0)
    assert g.meta["dropout_steps"] == list(range(6))


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_nodes"):
        layered_dag(0, 3, 0)
    with pytest.raises(ValueError, match="width"):
        layered_dag(10, 0, 0)
    with pytest.raises(ValueError, match="num_blocks"):
        cnn_graph(-1, 0)
    with pytest.raises(ValueError, match="cell"):
        rnn_graph(3, 8, 0, cell="gru")
    with pytest.raises(ValueError, match="hidden"):
        rnn_graph(3, 0, 0)
