"""The dnn-partitioning loader: every published file, field values, Parquet, and bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import DNN_DATA

from archplace.workloads.dnn_partitioning import ExpertSplit, load_dnn_partitioning, load_expert_split
from archplace.workloads.graph import OpGraph

DATA = DNN_DATA
GRAPH_FILES = sorted((DATA / "throughput-inputs").glob("*/*.json"))
EXPERT_FILES = sorted((DATA / "human-experts").glob("*.json"))

# no skip when the files are missing: they are package data, so their absence is a failure
# (test_all_files_present), not a reason to pass the module by

def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _row(g: OpGraph, node_id: int) -> int:
    rows = np.flatnonzero(g.nodes["id"] == node_id)
    assert len(rows) == 1
    return int(rows[0])


def test_all_files_present():
    assert len(GRAPH_FILES) == 16
    assert len(EXPERT_FILES) == 6


@pytest.mark.parametrize("path", GRAPH_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_file_loads_with_json_values(path: Path):
    d = _json(path)
    g = load_dnn_partitioning(path)
    assert g.num_nodes == len(d["nodes"])
    assert g.num_edges == len(d["edges"])
    assert g.meta == {"model": path.stem, "source": "dnn-partitioning",
                      "max_bytes_per_acc": float(d["maxSizePerFPGA"]), "max_accs": d["maxFPGAs"],
                      "max_cpus": d["maxCPUs"]}
    assert set(g.nodes["kind"]) == {"profiled"}
    assert set(g.nodes["core"]) == {"none"}
    assert (g.nodes["layer"] == -1).all()
    assert (g.edges["bytes"] == 0).all()
    assert g.extra_nodes["cpu_latency"].dtype == np.float64
    assert g.extra_nodes["supported_on_acc"].dtype == np.bool_
    assert g.extra_nodes["color_class"].dtype == np.int64
    # every node field, by id
    for nd in d["nodes"]:
        r = _row(g, nd["id"])
        assert g.nodes["name"][r] == nd["name"]
        assert g.nodes["is_backward"][r] == bool(nd["isBackwardNode"])
        assert g.extra_nodes["cpu_latency"][r] == nd["cpuLatency"]
        assert g.extra_nodes["acc_latency"][r] == nd["fpgaLatency"]
        assert g.extra_nodes["supported_on_acc"][r] == bool(nd["supportedOnFpga"])
        assert g.extra_nodes["mem_bytes"][r] == nd.get("size", 0.0)
        assert g.extra_nodes["color_class"][r] == nd.get("colorClass", -1)
        assert g.extra_nodes["layer_id"][r] == nd.get("layerId", -1)
    # every edge, as a multiset of (src, dst, cost, size)
    want = sorted((e["sourceId"], e["destId"], e["cost"], e["size"]) for e in d["edges"])
    got = sorted(zip(g.edges["src"].tolist(), g.edges["dst"].tolist(), g.extra_edges["cost"].tolist(),
                     g.extra_edges["size_bytes"].tolist(), strict=True))
    assert got == want


@pytest.mark.parametrize("path", GRAPH_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_parquet_round_trip_keeps_extra_columns(path: Path, tmp_path: Path):
    g = load_dnn_partitioning(path)
    g2 = OpGraph.from_parquet(g.to_parquet(tmp_path / "g.parquet"))
    assert g2.equals(g)
    assert g2.meta == g.meta  # equals() compares meta only after str()-ing non-JSON values
    assert set(g2.extra_nodes) == {"cpu_latency", "acc_latency", "supported_on_acc", "color_class",
                                   "mem_bytes", "layer_id"}
    assert set(g2.extra_edges) == {"cost", "size_bytes"}
    assert g2.content_hash() == g.content_hash()


def test_specific_layer_graph_values():
    g = load_dnn_partitioning(DATA / "throughput-inputs/LayerGraphs/inceptionv3_inference.json")
    assert g.num_nodes == 326 and g.num_edges == 363
    r = _row(g, 77)
    assert g.nodes["name"][r] == "node77"
    assert g.extra_nodes["cpu_latency"][r] == 13.700000000000001
    assert g.extra_nodes["acc_latency"][r] == 1.37
    assert g.extra_nodes["mem_bytes"][r] == 60432384.0
    assert g.extra_nodes["color_class"][r] == 77
    e = np.flatnonzero((g.edges["src"] == 77) & (g.edges["dst"] == 78))
    assert len(e) == 1
    assert g.extra_edges["cost"][e[0]] == 0.02803802490234375
    assert g.extra_edges["size_bytes"][e[0]] == 60211200.0

    g = load_dnn_partitioning(DATA / "throughput-inputs/LayerGraphs/gnmt_training.json")
    # isBackwardNode is 0/1 for some nodes and true/false for others in this file
    assert g.nodes["is_backward"].sum() == 96
    assert g.meta["max_accs"] == 6 and g.meta["max_cpus"] == 1
    assert g.meta["max_bytes_per_acc"] == 17185374208.0


def test_specific_operator_graph_values():
    g = load_dnn_partitioning(DATA / "throughput-inputs/OperatorGraphs/bert_L-12_training.json")
    assert (g.num_nodes, g.num_edges) == (2012, 2751)
    r = _row(g, 0)
    assert g.nodes["name"][r] == "99"
    assert g.extra_nodes["color_class"][r] == 160
    assert g.extra_nodes["layer_id"][r] == 6
    assert g.extra_nodes["mem_bytes"][r] == 3072.0
    assert g.extra_nodes["cpu_latency"][r] == 0.0
    r = _row(g, 208)  # no colorClass in the file
    assert g.nodes["name"][r] == "Shape1"
    assert g.extra_nodes["color_class"][r] == -1
    assert g.extra_nodes["cpu_latency"][r] == 1.0024611790974934e-05

    g = load_dnn_partitioning(DATA / "throughput-inputs/OperatorGraphs/resnet50_training.json")
    r = _row(g, 638)
    assert g.nodes["name"][r] == "AccumulateGrad_gpu_0/res5_1_branch2c_bn_3_grad"
    assert g.nodes["is_backward"][r]
    assert g.extra_nodes["cpu_latency"][r] == 9.202006168154762
    assert g.extra_nodes["color_class"][r] == -1

    g = load_dnn_partitioning(DATA / "throughput-inputs/OperatorGraphs/bert_l-3_inference.json")
    assert g.meta["max_accs"] == 3
    assert g.nodes["id"].max() == 246 and g.num_nodes == 235  # ids have gaps


# ---------------------------------------------------------------------------------------------- bad input
def _good() -> dict:
    return {
        "maxSizePerFPGA": 1000.0, "maxFPGAs": 2, "maxCPUs": 1,
        "nodes": [
            {"id": 1, "name": "a", "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 0.5,
             "isBackwardNode": 0, "colorClass": 1, "size": 10.0},
            {"id": 2, "supportedOnFpga": True, "cpuLatency": 2, "fpgaLatency": 1.0,
             "isBackwardNode": False, "size": 20},
            {"id": 17, "name": "c", "supportedOnFpga": 0, "cpuLatency": 3.0, "fpgaLatency": 1.5,
             "isBackwardNode": 0, "colorClass": 17},
        ],
        "edges": [
            {"sourceId": 1, "destId": 2, "cost": 0.25, "size": 8.0},
            {"sourceId": 1, "destId": 17, "cost": 0.25},
            {"sourceId": 2, "destId": 17, "cost": 0.5},
        ],
    }


def _write(tmp_path: Path, d: dict, name: str = "tiny.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


def test_tiny_good_file(tmp_path: Path):
    g = load_dnn_partitioning(_write(tmp_path, _good()))
    assert g.meta["model"] == "tiny"
    assert g.nodes["id"].tolist() == [1, 2, 17]
    assert g.nodes["name"].tolist() == ["a", "op2", "c"]
    assert g.extra_nodes["color_class"].tolist() == [1, -1, 17]
    assert g.extra_nodes["mem_bytes"].tolist() == [10.0, 20.0, 0.0]
    assert g.extra_nodes["supported_on_acc"].tolist() == [True, True, False]
    assert g.extra_nodes["cpu_latency"].tolist() == [1.0, 2.0, 3.0]
    assert g.extra_edges["size_bytes"].tolist() == [8.0, -1.0, -1.0]
    assert g.extra_edges["cost"].tolist() == [0.25, 0.25, 0.5]


def _mutate(path_fn):
    d = _good()
    path_fn(d)
    return d


BAD_CASES = [
    # (id, mutation, regex the message must match)
    ("node missing fpgaLatency", lambda d: d["nodes"][2].pop("fpgaLatency"),
     r"node 17: field 'fpgaLatency' is missing"),
    ("node missing cpuLatency", lambda d: d["nodes"][0].pop("cpuLatency"),
     r"node 1: field 'cpuLatency' is missing"),
    ("node missing supportedOnFpga", lambda d: d["nodes"][1].pop("supportedOnFpga"),
     r"node 2: field 'supportedOnFpga' is missing"),
    ("node missing isBackwardNode", lambda d: d["nodes"][1].pop("isBackwardNode"),
     r"node 2: field 'isBackwardNode' is missing"),
    ("node missing id", lambda d: d["nodes"][1].pop("id"), r"node #1: field 'id' is missing"),
    ("latency is a string", lambda d: d["nodes"][0].__setitem__("cpuLatency", "fast"),
     r"node 1: field 'cpuLatency' is 'fast' \(str\), expected a number"),
    ("id is a float", lambda d: d["nodes"][0].__setitem__("id", 1.5),
     r"node #0: field 'id' .*expected an integer"),
    ("isBackwardNode is 2", lambda d: d["nodes"][0].__setitem__("isBackwardNode", 2),
     r"node 1: field 'isBackwardNode' is 2"),
    ("colorClass is a string", lambda d: d["nodes"][0].__setitem__("colorClass", "red"),
     r"node 1: field 'colorClass'.*expected an integer"),
    ("name is a number", lambda d: d["nodes"][0].__setitem__("name", 5),
     r"node 1: field 'name'.*expected a string"),
    ("negative size", lambda d: d["nodes"][1].__setitem__("size", -4.0),
     r"node 2: field 'size' is -4.0, must be non-negative"),
    ("negative latency", lambda d: d["nodes"][2].__setitem__("fpgaLatency", -1),
     r"node 17: field 'fpgaLatency' is -1, must be non-negative"),
    ("node is not an object", lambda d: d["nodes"].__setitem__(1, [2]), r"node #1: expected a JSON object"),
    ("duplicate id", lambda d: d["nodes"][2].__setitem__("id", 1), r"node 1: field 'id' is not unique"),
    ("edge missing cost", lambda d: d["edges"][1].pop("cost"),
     r"edge #1 \(1 -> 17\): field 'cost' is missing"),
    ("edge missing destId", lambda d: d["edges"][0].pop("destId"), r"edge #0: field 'destId' is missing"),
    ("edge to unknown node", lambda d: d["edges"][2].__setitem__("destId", 99),
     r"edge #2 \(2 -> 99\): field 'destId' names node 99, which does not exist"),
    ("edge from unknown node", lambda d: d["edges"][0].__setitem__("sourceId", 5),
     r"edge #0 \(5 -> 2\): field 'sourceId' names node 5"),
    ("edge cost is a string", lambda d: d["edges"][0].__setitem__("cost", "1"),
     r"edge #0 \(1 -> 2\): field 'cost'.*expected a number"),
    ("negative edge cost", lambda d: d["edges"][2].__setitem__("cost", -0.5),
     r"edge #2 \(2 -> 17\): field 'cost' is -0.5, must be non-negative"),
    ("out-edge costs differ", lambda d: d["edges"][1].__setitem__("cost", 0.75),
     r"edge #1 \(1 -> 17\): field 'cost' is 0.75, but edge #0 out of the same node 1 has cost 0.25"),
    ("self loop", lambda d: d["edges"].append({"sourceId": 2, "destId": 2, "cost": 0.5}),
     r"edge #3 \(2 -> 2\): fields 'sourceId' and 'destId' are equal"),
    ("cycle", lambda d: d["edges"].append({"sourceId": 17, "destId": 1, "cost": 0.0}),
     r"tiny: node \d+ \(.*\): lies on a cycle"),
    ("missing maxFPGAs", lambda d: d.pop("maxFPGAs"), r"tiny: field 'maxFPGAs' is missing"),
    ("maxCPUs is a float", lambda d: d.__setitem__("maxCPUs", 1.0),
     r"tiny: field 'maxCPUs'.*expected an integer"),
    ("negative maxSizePerFPGA", lambda d: d.__setitem__("maxSizePerFPGA", -1),
     r"tiny: field 'maxSizePerFPGA' is -1, must be non-negative"),
    ("missing edges", lambda d: d.pop("edges"), r"tiny: field 'edges' is missing"),
    ("nodes is not a list", lambda d: d.__setitem__("nodes", {}),
     r"tiny: field 'nodes' is dict, expected a list"),
]


@pytest.mark.parametrize(("mutation", "pattern"), [c[1:] for c in BAD_CASES], ids=[c[0] for c in BAD_CASES])
def test_bad_input_raises_naming_the_field(tmp_path: Path, mutation, pattern):
    p = _write(tmp_path, _mutate(mutation))
    with pytest.raises(ValueError, match=pattern):
        load_dnn_partitioning(p)


def test_bad_input_not_json(tmp_path: Path):
    p = tmp_path / "broken.json"
    p.write_text('{"nodes": [')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_dnn_partitioning(p)
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object at the top level"):
        load_dnn_partitioning(p)


# ---------------------------------------------------------------------------------------------- experts
@pytest.mark.parametrize("path", EXPERT_FILES, ids=lambda p: p.name)
def test_expert_split_loads_and_covers_its_graph(path: Path):
    d = _json(path)
    s = load_expert_split(path)
    assert isinstance(s, ExpertSplit)
    assert s.model == path.stem.removesuffix("_expert")
    assert s.accs == [dev["nodes"] for dev in d["fpgas"]]
    assert s.cpus == [dev["nodes"] for dev in d["cpus"]]
    assert s.num_accs == 6 and len(s.cpus) == 1
    assert s.max_load is None  # -1 in every published file
    assert s.acc_loads == [None] * 6 and s.cpu_loads == [0.0]
    g = load_dnn_partitioning(DATA / "throughput-inputs/LayerGraphs" / f"{s.model}.json")
    dev = s.device_array(g)
    assert (dev >= 0).all()
    assert np.bincount(dev, minlength=7).tolist() == [len(x) for x in s.accs + s.cpus]
    # a training graph takes the inference split: backward nodes follow their colour class
    train = DATA / "throughput-inputs/LayerGraphs" / f"{s.model.replace('inference', 'training')}.json"
    gt = load_dnn_partitioning(train)
    dt = s.device_array(gt)
    cc = gt.extra_nodes["color_class"]
    fwd = ~gt.nodes["is_backward"]
    cc_dev = dict(zip(cc[fwd].tolist(), dt[fwd].tolist(), strict=True))
    assert all(cc_dev[c] == d_ for c, d_ in zip(cc[~fwd].tolist(), dt[~fwd].tolist(), strict=True))


def test_expert_split_specific():
    s = load_expert_split(DATA / "human-experts/bert24_inference_expert.json")
    assert s.accs[0] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert s.accs[5] == [25, 26, 27, 28, 29, 30, 31, 32]
    assert s.cpus == [[]]
    assert s.device_of()[9] == 1


def test_expert_split_bad(tmp_path: Path):
    p = tmp_path / "x_expert.json"
    p.write_text(json.dumps({"fpgas": [{"load": -1, "nodes": [1, 2]}, {"load": -1, "nodes": [2]}],
                             "cpus": [], "maxLoad": -1}))
    with pytest.raises(ValueError, match=r"field 'nodes': node 2 is listed in fpgas\[0\] and fpgas\[1\]"):
        load_expert_split(p)
    p.write_text(json.dumps({"fpgas": [{"load": -1, "nodes": [1, "2"]}], "cpus": []}))
    with pytest.raises(ValueError, match=r"fpgas\[0\]: field 'nodes' is '2'"):
        load_expert_split(p)
    p.write_text(json.dumps({"fpgas": [{"load": -1}], "cpus": []}))
    with pytest.raises(ValueError, match=r"fpgas\[0\]: field 'nodes' is missing"):
        load_expert_split(p)
    p.write_text(json.dumps({"fpgas": []}))
    with pytest.raises(ValueError, match=r"field 'cpus' is missing"):
        load_expert_split(p)
    p.write_text(json.dumps({"fpgas": [{"load": 3.5, "nodes": [1, 99]}], "cpus": [], "maxLoad": 3.5}))
    s = load_expert_split(p)
    assert s.max_load == 3.5 and s.acc_loads == [3.5] and s.model == "x"
    g = load_dnn_partitioning(_write(tmp_path, _good()))
    with pytest.raises(ValueError, match="node 99 is not in graph tiny"):
        s.device_array(g)
    s.accs = [[1, 2]]
    with pytest.raises(ValueError, match=r"node 17 \(c\) is placed on no device"):
        s.device_array(g)


def test_bundled_graphs_are_named_by_their_stem(tmp_path):
    """``archplace solve-dp gnmt_training`` from any folder: a bare stem is the layer graph, a folder
    prefix picks the operator graph, an existing path wins over a bundled name, an unknown name is None."""
    from archplace.api.graphs import load_graph
    from archplace.workloads.dnn_partitioning import DATA_DIR, load_dnn_partitioning, resolve_graph_file

    inputs = DATA_DIR / "throughput-inputs"
    assert resolve_graph_file("gnmt_training") == inputs / "LayerGraphs" / "gnmt_training.json"
    assert resolve_graph_file("gnmt_training.json") == inputs / "LayerGraphs" / "gnmt_training.json"
    assert resolve_graph_file("resnet50_training") == inputs / "LayerGraphs" / "resnet50_training.json"
    assert resolve_graph_file("OperatorGraphs/resnet50_training") == \
        inputs / "OperatorGraphs" / "resnet50_training.json"
    assert resolve_graph_file("bert_l-3_training") == inputs / "OperatorGraphs" / "bert_l-3_training.json"
    assert resolve_graph_file("no_such_graph") is None
    own = tmp_path / "gnmt_training.json"
    own.write_text((inputs / "LayerGraphs" / "bert24_inference.json").read_text())
    assert resolve_graph_file(str(own)) == own
    g = load_graph("bert24_inference", None, None, 1)
    ref = load_dnn_partitioning(inputs / "LayerGraphs" / "bert24_inference.json")
    assert g.num_nodes == ref.num_nodes == 32 and g.num_edges == ref.num_edges


def test_solve_dp_refuses_an_unknown_name_listing_the_bundled_ones():
    from archplace import api

    with pytest.raises(ValueError, match="'no_such_graph' does not exist and is not a bundled graph .*gnmt_"):
        api.SolveDpRequest("no_such_graph").validate()
