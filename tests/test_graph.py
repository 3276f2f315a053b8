"""The OpGraph IR: validation errors, Parquet round-trips, structure helpers."""

import numpy as np
import pytest

from archplace.workloads import OpGraph, layer_graph, layer_subgraph
from archplace.workloads.backward import derive_backward


def small(**over):
    """x -> linear -> gelu -> linear -> out, two layers."""
    nodes = dict(id=[0, 1, 2, 3], kind=["input", "linear", "gelu", "linear"], layer=[0, 0, 1, 1],
                 gemm_b=[0, 1, 0, 1], gemm_m=[0, 8, 0, 8], gemm_n=[0, 16, 0, 4],
                 gemm_k=[0, 4, 0, 16], flops=[0, 1024, 128, 1024], vector_flops=[0, 0, 128, 0],
                 input_bytes=[0, 64, 256, 256], output_bytes=[64, 256, 256, 64],
                 weight_bytes=[0, 128, 0, 128], saved_bytes=[0, 64, 256, 256])
    nodes.update(over.pop("nodes", {}))
    edges = dict(src=[0, 1, 2], dst=[1, 2, 3], bytes=[64, 256, 256])
    edges.update(over.pop("edges", {}))
    return OpGraph.from_columns(nodes, edges, dict(model="small", layers=["a", "b"],
                                                   bytes_per_element=2))


def test_valid_graph_builds_with_defaults():
    g = small()
    assert g.num_nodes == 4 and g.num_edges == 3
    assert list(g.nodes["core"]) == ["none", "tensor", "vector", "tensor"]
    assert list(g.nodes["fwd_id"]) == [-1] * 4
    assert list(g.topo_order()) == [0, 1, 2, 3]


@pytest.mark.parametrize("over, match", [
    (dict(edges=dict(src=[0, 1, 2, 3], dst=[1, 2, 3, 1], bytes=[1, 1, 1, 1])), r"node \d+ .*cycle"),
    (dict(edges=dict(src=[0, 1, 2], dst=[1, 2, 9], bytes=[1, 1, 1])),
     r"field 'dst' names node 9.*dangling"),
    (dict(nodes=dict(output_bytes=[64, -1, 256, 64])), r"node 1 .*field 'output_bytes' is -1"),
    (dict(nodes=dict(flops=[0, np.nan, 128, 1024])), r"node 1 .*field 'flops' is nan"),
    (dict(nodes=dict(kind=["input", "linear", "frobnicate", "linear"])),
     r"node 2 .*field 'kind' is 'frobnicate'"),
    (dict(nodes=dict(core=["none", "tensor", "gpu", "tensor"])), r"node 2 .*field 'core' is 'gpu'"),
    (dict(nodes=dict(layer=[0, 0, 1, 5])), r"node 3: field 'layer' is 5"),
    (dict(nodes=dict(id=[0, 1, 1, 3])), r"node 1: field 'id' is not unique"),
    (dict(edges=dict(src=[0, 1, 2], dst=[1, 2, 3], bytes=[1, -5, 1])), r"edge 1 .*field 'bytes' is -5"),
    (dict(edges=dict(src=[0, 1, 2, 2], dst=[1, 2, 3, 2], bytes=[1, 1, 1, 1])), r"node 2: .*itself"),
])
def test_validation_errors_name_node_and_field(over, match):
    with pytest.raises(ValueError, match=match):
        small(**over)


def test_unknown_column_is_rejected():
    with pytest.raises(ValueError, match="unknown node columns"):
        OpGraph.from_columns(dict(id=[0], kind=["add"], colour=[1]))


def test_edges_are_canonically_ordered():
    a = small(edges=dict(src=[2, 0, 1], dst=[3, 1, 2], bytes=[256, 64, 256]))
    b = small()
    assert a.equals(b) and a.content_hash() == b.content_hash()


def test_parquet_round_trip_is_lossless(tmp_path):
    g = derive_backward(small())
    g.extra_nodes["note"] = np.arange(g.num_nodes, dtype=np.float32)
    g.validate()
    path = g.to_parquet(tmp_path / "g.parquet")
    h = OpGraph.from_parquet(path)
    assert h.equals(g)
    assert h.content_hash() == g.content_hash()
    assert h.nodes["name"].dtype == object and h.edges["arg"].dtype == np.int16


def test_parquet_rejects_foreign_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="not an archplace operator graph"):
        OpGraph.from_parquet(tmp_path / "x.parquet")


def test_layer_view_of_small_graph():
    g = derive_backward(small())
    lg = layer_graph(g, optimizer="adam")
    assert lg.names == ("a", "b")
    assert list(lg.param_bytes) == [128, 128]
    # 64 parameters of 2 bytes each: fp32 master (4) + two fp32 moments (8) = 12 bytes per parameter
    assert g.meta["bytes_per_element"] == 2 and list(lg.optimizer_bytes) == [64 * 12, 64 * 12]
    assert list(layer_graph(g, optimizer="adafactor").optimizer_bytes) == [64 * 4, 64 * 4]
    assert list(layer_graph(g, optimizer="sgd").optimizer_bytes) == [0, 0]
    assert list(lg.activation_bytes) == [64, 512]
    assert list(zip(lg.edge_src, lg.edge_dst, lg.edge_bytes)) == [(0, 1, 256)]
    assert lg.is_linear()
    sub = layer_subgraph(g, 1)
    assert list(sub.nodes["kind"]) == ["gelu", "linear"]
    assert sub.num_edges == 1
    assert layer_subgraph(g, 1, backward=True).nodes["is_backward"].all()
    with pytest.raises(ValueError, match=r"optimizer must be one of .*'adafactor'\], got 'lamb'"):
        layer_graph(g, optimizer="lamb")
    with pytest.raises(ValueError, match="layer 7 out of range"):
        layer_subgraph(g, 7)


def test_nan_extras_and_numpy_meta_survive_parquet(tmp_path):
    g = small()
    g.extra_nodes["lat"] = np.array([0.5, np.nan, 1.0, 2.0])
    g.meta["k"] = np.int64(3)
    h = OpGraph.from_parquet(g.to_parquet(tmp_path / "g.parquet"))
    assert h.equals(g) and g.equals(g)
    assert h.meta["k"] == 3 and isinstance(h.meta["k"], int)
