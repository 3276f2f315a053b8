"""Max-load placement for the dnn-partitioning format (archplace.algorithms.solvers.maxload).

* brute force on small random instances (every assignment, checked and scored by ``evaluate_split``)
  against the DP (pruned and unpruned) and the CP-SAT model;
* the README's reference optimum on every layer graph that has one, and the InceptionV3 optima;
* the human-expert splits, infeasible inputs and bad input.
"""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from conftest import DNN_DATA

from archplace.algorithms.solvers import maxload
from archplace.algorithms.solvers.maxload import (
    REFERENCE_MAX_LOADS,
    evaluate_split,
    solve_dp_command,
    solve_max_load,
)
from archplace.workloads.dnn_partitioning import (
    load_dnn_partitioning,
    load_expert_split,
    parse_dnn_partitioning,
)
from archplace.workloads.graph import OpGraph

LAYERS = DNN_DATA / "throughput-inputs" / "LayerGraphs"
EXPERTS = DNN_DATA / "human-experts"

# optima this implementation computed for the inputs without a reference value (the reference DP did
# not finish); the DP and CP-SAT agree on them (see test_inception_dp_and_milp_agree)
INCEPTION_OPTIMA = {
    "inceptionv3_inference.json": 51.551863586425775,
    "inceptionv3_training.json": 122.76161621093745,
}


# ------------------------------------------------------------------------------------ random instances
def random_instance(rng: np.random.Generator, n_fwd: int, n_bwd: int, k: int, cpus: int,
                    tight_memory: bool = False) -> dict:
    """A random dnn-partitioning JSON object: a forward DAG, optional backward nodes (mirrored edges,
    forward->backward edges, colour classes shared with forward nodes, sometimes an orphan), shared
    colour classes, zero-latency nodes, CPU-only nodes and a memory limit."""
    nodes, edges = [], []
    cc_of = {}
    for i in range(n_fwd):
        acc = 0.0 if rng.random() < 0.2 else float(rng.integers(1, 40)) / 4
        cc = i if rng.random() < 0.75 or i == 0 else int(rng.integers(0, i))  # sometimes shared
        cc_of[i] = cc
        nodes.append({"id": i, "supportedOnFpga": int(rng.random() > 0.06), "cpuLatency": acc * float(
            rng.integers(2, 8)), "fpgaLatency": acc, "isBackwardNode": 0, "colorClass": cc,
            "size": float(rng.integers(0, 10))})
    cost = {i: float(rng.integers(0, 6)) / 8 for i in range(n_fwd + n_bwd)}
    fwd_edges = [(i, j) for i in range(n_fwd) for j in range(i + 1, n_fwd) if rng.random() < 0.45]
    for i, j in fwd_edges:
        edges.append({"sourceId": i, "destId": j, "cost": cost[i]})
    # backward nodes: mirror a forward node (same colour class), or an orphan (a class of its own)
    mirrors = list(rng.permutation(n_fwd)[:n_bwd])
    bwd_of = {}
    for b in range(n_bwd):
        nid = n_fwd + b
        f = int(mirrors[b]) if b < len(mirrors) else None
        orphan = f is None or rng.random() < 0.15
        node = {"id": nid, "supportedOnFpga": 1, "cpuLatency": 0.0, "fpgaLatency": 0.0,
                "isBackwardNode": 1, "size": float(rng.integers(0, 5))}
        lat = float(rng.integers(0, 40)) / 4
        node["fpgaLatency"], node["cpuLatency"] = lat, lat * 3
        if orphan:
            if rng.random() < 0.5:
                node["colorClass"] = 1000 + b
        else:
            node["colorClass"] = cc_of[f]
            bwd_of[f] = nid
        nodes.append(node)
    bwd_ids = [n_fwd + b for b in range(n_bwd)]
    for i, j in fwd_edges:  # mirrored backward edges
        if i in bwd_of and j in bwd_of:
            edges.append({"sourceId": bwd_of[j], "destId": bwd_of[i], "cost": cost[bwd_of[j]]})
    for f, b in bwd_of.items():  # saved activations
        if rng.random() < 0.5:
            edges.append({"sourceId": f, "destId": b, "cost": cost[f]})
    for b in bwd_ids:  # orphans hang off a random backward/forward node
        if b not in bwd_of.values() and len(bwd_ids) > 1 and rng.random() < 0.8:
            other = int(rng.choice([x for x in bwd_ids if x != b]))
            s, d = (other, b) if rng.random() < 0.5 else (b, other)
            edges.append({"sourceId": s, "destId": d, "cost": cost[s]})
    # the format wants one cost per source node
    seen = {}
    for e in edges:
        e["cost"] = seen.setdefault(e["sourceId"], e["cost"])
    # drop duplicate edges, and any orphan edge that would close a cycle
    uniq: dict[tuple[int, int], dict] = {}
    succ: dict[int, set[int]] = {}

    def reaches(a: int, b: int) -> bool:
        stack, seen_ = [a], {a}
        while stack:
            x = stack.pop()
            if x == b:
                return True
            for y in succ.get(x, ()):
                if y not in seen_:
                    seen_.add(y)
                    stack.append(y)
        return False

    for e in edges:
        s, d = e["sourceId"], e["destId"]
        if (s, d) in uniq or reaches(d, s):
            continue
        uniq[(s, d)] = e
        succ.setdefault(s, set()).add(d)
    total_size = sum(nd["size"] for nd in nodes)
    mem = max(nd["size"] for nd in nodes) + (total_size / 3 if tight_memory else total_size)
    return {"maxSizePerFPGA": mem, "maxFPGAs": k, "maxCPUs": cpus, "nodes": nodes,
            "edges": list(uniq.values())}


def brute_force(g: OpGraph) -> tuple[float, np.ndarray | None]:
    """The best valid split by enumeration: colour classes move together, and accelerators (and
    CPUs) are interchangeable, so only one labelling per symmetry class is tried. Every candidate is
    checked and scored by evaluate_split."""
    k, cpus = g.meta["max_accs"], g.meta["max_cpus"]
    cc = g.extra_nodes["color_class"]
    unit_of = {}
    units = np.array([unit_of.setdefault(int(c) if c >= 0 else -1 - r, len(unit_of))
                      for r, c in enumerate(cc)])
    nu = len(unit_of)
    best, best_dev = math.inf, None

    def rec(u: int, assign: list[int], n_acc: int, n_cpu: int):
        nonlocal best, best_dev
        if u == nu:
            dev = np.asarray(assign)[units]
            ev = evaluate_split(g, dev)
            if ev.valid and ev.max_load < best:
                best, best_dev = ev.max_load, dev
            return
        for d in range(min(n_acc + 1, k)):
            rec(u + 1, assign + [d], max(n_acc, d + 1), n_cpu)
        for j in range(min(n_cpu + 1, cpus)):
            rec(u + 1, assign + [k + j], n_acc, max(n_cpu, j + 1))

    rec(0, [], 0, 0)
    return best, best_dev


CASES = []
_rng = np.random.default_rng(20201206)
for _case in range(120):
    n_fwd = int(_rng.integers(3, 9))
    n_bwd = int(_rng.integers(1, min(4, 9 - n_fwd) + 1)) if _case % 2 and n_fwd < 9 else 0
    _cpus = int(np.searchsorted([0.15, 0.85], _rng.random()))  # 0, 1 or 2 CPUs
    CASES.append((_case, n_fwd, n_bwd, int(_rng.integers(1, 4)), _cpus, _case % 3 == 0))


@pytest.mark.parametrize("case,n_fwd,n_bwd,k,cpus,tight", CASES, ids=[f"case{c[0]}" for c in CASES])
def test_dp_matches_brute_force(case, n_fwd, n_bwd, k, cpus, tight, monkeypatch):
    rng = np.random.default_rng(case)
    g = parse_dnn_partitioning(random_instance(rng, n_fwd, n_bwd, k, cpus, tight), model=f"rand{case}")
    best, _ = brute_force(g)
    res = solve_max_load(g, method="dp")
    if math.isinf(best):
        assert res.status == "infeasible"
        assert math.isinf(res.max_load) and (res.device_of == -1).all()
        return
    assert res.status == "optimal"
    assert res.max_load == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert res.lower_bound == pytest.approx(best, rel=1e-9, abs=1e-12)
    ev = evaluate_split(g, res.device_of)
    assert ev.valid and ev.max_load == res.max_load
    assert ev.loads == res.loads
    # the pruned DP (thresholds growing from the lower bound, or straight at a known split's value)
    monkeypatch.setattr(maxload, "_SMALL_LATTICE", 0)
    for straight in (1.0, 1e9):
        monkeypatch.setattr(maxload, "_STRAIGHT_TO_UB", straight)
        pruned = solve_max_load(g, method="dp")
        assert pruned.status == "optimal"
        assert pruned.max_load == pytest.approx(best, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("case", [c[0] for c in CASES[:24]])
def test_milp_matches_brute_force(case):
    _, n_fwd, n_bwd, k, cpus, tight = CASES[case]
    rng = np.random.default_rng(case)
    g = parse_dnn_partitioning(random_instance(rng, n_fwd, n_bwd, k, cpus, tight), model=f"rand{case}")
    best, _ = brute_force(g)
    res = solve_max_load(g, method="milp", time_limit_s=60)
    if math.isinf(best):
        assert res.status == "infeasible"
        return
    assert res.status == "optimal"
    assert res.max_load == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert res.lower_bound <= res.max_load and res.gap <= 1e-6


def test_brute_force_sees_the_cases_it_should():
    """The random cases cover training graphs, orphans, CPU-only nodes, shared classes, infeasible."""
    kinds = set()
    for case, n_fwd, n_bwd, k, cpus, tight in CASES:
        d = random_instance(np.random.default_rng(case), n_fwd, n_bwd, k, cpus, tight)
        g = parse_dnn_partitioning(d)
        kinds.add("training" if n_bwd else "inference")
        if any(not nd["supportedOnFpga"] for nd in d["nodes"]):
            kinds.add("cpu-only")
        ccs = [nd.get("colorClass") for nd in d["nodes"] if not nd["isBackwardNode"]]
        if len(set(ccs)) < len(ccs):
            kinds.add("shared-class")
        fwd_cc = set(ccs)
        if any(nd["isBackwardNode"] and nd.get("colorClass") not in fwd_cc for nd in d["nodes"]):
            kinds.add("orphan")
        if not cpus:
            kinds.add("no-cpu")
        if solve_max_load(g, method="dp").status == "infeasible":  # brute force agrees (test above)
            kinds.add("infeasible")
    assert kinds >= {"training", "inference", "cpu-only", "shared-class", "orphan", "no-cpu", "infeasible"}


# ------------------------------------------------------------------------------------ evaluator
def _graph(nodes: list[dict], edges: list[tuple[int, int, float]], k: int = 2, cpus: int = 1,
           mem: float = 100.0) -> OpGraph:
    full = []
    for nd in nodes:
        d = {"supportedOnFpga": 1, "cpuLatency": 10.0, "fpgaLatency": 1.0, "isBackwardNode": 0, "size": 1.0}
        d.update(nd)
        full.append(d)
    return parse_dnn_partitioning({"maxSizePerFPGA": mem, "maxFPGAs": k, "maxCPUs": cpus, "nodes": full,
                                   "edges": [{"sourceId": s, "destId": t, "cost": c} for s, t, c in edges]})


def test_evaluate_split_accounting():
    # 0 -> 1, 0 -> 2, 1 -> 3, 2 -> 3; node 0's output goes to two other devices
    g = _graph([{"id": i} for i in range(4)], [(0, 1, 0.5), (0, 2, 0.5), (1, 3, 0.25), (2, 3, 0.125)],
               k=3, cpus=1)
    ev = evaluate_split(g, [0, 1, 2, 3])  # node 3 on the CPU
    assert ev.valid
    # acc 0: latency 1 + node 0's output sent once; acc 1: 1 + receives 0's + sends 1's; acc 2 alike
    assert ev.loads == pytest.approx([1.5, 1 + 0.5 + 0.25, 1 + 0.5 + 0.125, 10.0])
    assert ev.max_load == 10.0
    ev = evaluate_split(g, [0, 1, 1, 0])
    assert ev.loads == pytest.approx([2 + 0.5 + 0.25 + 0.125, 2 + 0.5 + 0.25 + 0.125, 0.0, 0.0])
    # a mapping id -> device works too
    assert evaluate_split(g, {0: 0, 1: 1, 2: 1, 3: 0}).loads == ev.loads


def test_evaluate_split_flags_each_violation():
    g = _graph([{"id": 0, "colorClass": 7}, {"id": 1}, {"id": 2, "colorClass": 7},
                {"id": 3, "supportedOnFpga": 0, "size": 500.0}], [(0, 1, 0.1), (1, 2, 0.1), (2, 3, 0.1)])
    assert evaluate_split(g, [0, 0, 0, 2]).valid
    v = evaluate_split(g, [0, 1, 0, 2]).violations  # 0 and 2 together but 1 elsewhere: 0->1->2 cycle
    assert any("not contiguous" in x for x in v)
    v = evaluate_split(g, [0, 0, 1, 2]).violations
    assert any("colour class 7" in x for x in v)
    v = evaluate_split(g, [0, 0, 0, 1]).violations
    assert any("not supported on an accelerator" in x for x in v)
    assert any("max_bytes_per_acc" in x for x in v)
    v = evaluate_split(g, [0, 0, 0, 3]).violations
    assert any("out of range" in x for x in v)


def test_contiguity_is_an_orderable_chain_not_just_convex_pieces():
    # a -> b and c -> d with A = {a, d} and B = {b, c}: each piece is convex, but A feeds B and B feeds A
    g = _graph([{"id": i} for i in range(4)], [(0, 1, 0.0), (2, 3, 0.0)])
    ev = evaluate_split(g, [0, 1, 1, 0])
    assert not ev.valid and "not contiguous" in ev.violations[0]
    assert evaluate_split(g, [0, 1, 0, 1]).valid


def test_training_graph_judged_on_forward_part():
    # forward 0 -> 1 -> 2; backward 5 -> 4 -> 3 mirror it; backward nodes follow their classes
    nodes = [{"id": i, "colorClass": i} for i in range(3)]
    nodes += [{"id": 3 + i, "colorClass": i, "isBackwardNode": 1, "fpgaLatency": 2.0} for i in range(3)]
    g = _graph(nodes, [(0, 1, 0.1), (1, 2, 0.1), (5, 4, 0.2), (4, 3, 0.2), (2, 5, 0.3)], k=3)
    assert evaluate_split(g, [0, 1, 2, 0, 1, 2]).valid  # backward pieces run the other way: fine
    assert not evaluate_split(g, [0, 1, 2, 1, 1, 2]).valid  # node 3 left its class
    res = solve_max_load(g, method="dp")
    assert res.status == "optimal"
    assert res.max_load == pytest.approx(brute_force(g)[0], rel=1e-12)


# ------------------------------------------------------------------------------------ reference values
@pytest.mark.parametrize("name", sorted(REFERENCE_MAX_LOADS), ids=lambda n: n.split("/")[-1])
def test_reference_value(name):
    g = load_dnn_partitioning(DNN_DATA / "throughput-inputs" / name)
    res = solve_max_load(g)
    ref = REFERENCE_MAX_LOADS[name]
    assert res.status == "optimal" and res.method == "dp"
    assert res.max_load == pytest.approx(ref, rel=1e-6)
    ev = evaluate_split(g, res.device_of)
    assert ev.valid and ev.max_load == res.max_load
    assert res.gap == 0.0 and res.lower_bound == res.max_load


@pytest.mark.parametrize("name", sorted(INCEPTION_OPTIMA))
def test_inception_optimum(name):
    g = load_dnn_partitioning(LAYERS / name)
    res = solve_max_load(g, method="dp")
    assert res.status == "optimal"
    assert res.stats["ideals"] == 36596
    assert res.max_load == pytest.approx(INCEPTION_OPTIMA[name], rel=1e-9)
    assert evaluate_split(g, res.device_of).valid


def test_inception_dp_and_milp_agree():
    """An independent proof for the value the reference DP could not compute: CP-SAT's bound."""
    g = load_dnn_partitioning(LAYERS / "inceptionv3_inference.json")
    res = solve_max_load(g, method="milp", time_limit_s=120)
    assert res.status == "optimal"
    opt = INCEPTION_OPTIMA["inceptionv3_inference.json"]
    assert res.lower_bound <= opt * (1 + 1e-12) <= res.max_load * (1 + 1e-9)
    assert res.max_load == pytest.approx(opt, rel=1e-6)
    assert res.gap < 1e-6  # the bound is corrected for the rounding of the scaled times


@pytest.mark.parametrize("name", ["bert24_training.json", "resnet50_inference.json",
                                  "gnmt_inference.json"])
def test_milp_reproduces_reference(name):
    g = load_dnn_partitioning(LAYERS / name)
    res = solve_max_load(g, method="milp", time_limit_s=120)
    assert res.status == "optimal"
    assert res.max_load == pytest.approx(REFERENCE_MAX_LOADS[f"LayerGraphs/{name}"], rel=1e-6)
    assert res.gap < 1e-6


def test_operator_graph_dp_and_milp_agree():
    g = load_dnn_partitioning(DNN_DATA / "throughput-inputs" / "OperatorGraphs" / "bert_l-3_training.json")
    dp = solve_max_load(g, method="dp")
    mi = solve_max_load(g, method="milp", time_limit_s=120)
    assert dp.status == mi.status == "optimal"
    assert mi.max_load == pytest.approx(dp.max_load, rel=1e-9)
    assert mi.lower_bound <= dp.max_load * (1 + 1e-12)


# ------------------------------------------------------------------------------------ experts
EXPERT_CASES = [("bert24_inference", "bert24_inference"), ("bert24_inference", "bert24_training"),
                ("bert24_training", "bert24_training"), ("gnmt_inference", "gnmt_inference"),
                ("gnmt_training", "gnmt_training"), ("resnet50_inference", "resnet50_inference"),
                ("inceptionv3_inference", "inceptionv3_inference")]


@pytest.mark.parametrize("expert,graph", EXPERT_CASES, ids=[f"{e}->{g}" for e, g in EXPERT_CASES])
def test_expert_split(expert, graph):
    ex = load_expert_split(EXPERTS / f"{expert}_expert.json")
    g = load_dnn_partitioning(LAYERS / f"{graph}.json")
    k = g.meta["max_accs"]
    dev = ex.device_array(g)  # expert numbering: its accelerators, then its CPUs
    dev = np.where(dev >= ex.num_accs, k + dev - ex.num_accs, dev)
    ev = evaluate_split(g, dev)
    assert ev.valid, ev.violations
    assert math.isfinite(ev.max_load) and ev.max_load > 0
    ref = REFERENCE_MAX_LOADS.get(f"LayerGraphs/{graph}.json", INCEPTION_OPTIMA.get(f"{graph}.json"))
    assert ev.max_load >= ref * (1 - 1e-12)


def test_expert_values():
    """The expert splits' max-loads (the reference program's -expert accounting)."""
    expected = {"bert24_inference": 20.083953125, "gnmt_inference": 46.208451171875,
                "resnet50_inference": 43.91825781250001, "inceptionv3_inference": 102.48207604980468}
    for name, value in expected.items():
        ex = load_expert_split(EXPERTS / f"{name}_expert.json")
        g = load_dnn_partitioning(LAYERS / f"{name}.json")
        ev = evaluate_split(g, ex.device_of())
        assert ev.max_load == pytest.approx(value, rel=1e-12)


# ------------------------------------------------------------------------------------ infeasible, CLI
def test_infeasible_memory():
    g = _graph([{"id": 0, "size": 60.0}, {"id": 1, "size": 60.0}, {"id": 2, "size": 60.0}],
               [(0, 1, 0.1), (1, 2, 0.1)], k=2, cpus=0, mem=100.0)
    for method in ("dp", "milp", "auto"):
        res = solve_max_load(g, method=method)
        assert res.status == "infeasible", method
        assert math.isinf(res.max_load) and (res.device_of == -1).all()
    # with a CPU the third node goes there
    g = _graph([{"id": 0, "size": 60.0}, {"id": 1, "size": 60.0}, {"id": 2, "size": 60.0}],
               [(0, 1, 0.1), (1, 2, 0.1)], k=2, cpus=1, mem=100.0)
    res = solve_max_load(g)
    assert res.status == "optimal" and res.max_load == pytest.approx(10.0)


def test_infeasible_node_too_big_and_cpu_only_without_cpu():
    g = _graph([{"id": 0, "size": 1000.0}, {"id": 1}], [(0, 1, 0.1)], k=3, cpus=0)
    assert solve_max_load(g).status == "infeasible"
    g = _graph([{"id": 0, "supportedOnFpga": 0}, {"id": 1}], [(0, 1, 0.1)], k=3, cpus=0)
    assert solve_max_load(g, method="milp").status == "infeasible"


def test_solve_dp_command(tmp_path):
    out = solve_dp_command(str(LAYERS / "bert24_inference.json"), "auto", 60.0)
    json.dumps(out, allow_nan=False)  # strict JSON
    assert out["status"] == "optimal"
    assert out["reference"] == REFERENCE_MAX_LOADS["LayerGraphs/bert24_inference.json"]
    assert abs(out["rel_diff"]) < 1e-9
    assert out["max_load"] == pytest.approx(out["reference"], rel=1e-9)
    assert len(out["devices"]) == 7 and out["devices"][6]["kind"] == "cpu"
    placed = sorted(i for d in out["devices"] for i in d["nodes"])
    assert placed == sorted(load_dnn_partitioning(LAYERS / "bert24_inference.json").nodes["id"].tolist())
    assert max(d["load"] for d in out["devices"]) == out["max_load"]
    out = solve_dp_command(str(DNN_DATA / "throughput-inputs" / "OperatorGraphs" / "resnet50_inference.json"),
                           "dp", 60.0)
    assert out["reference"] is None and out["rel_diff"] is None and out["status"] == "optimal"
    json.dumps(out, allow_nan=False)
    # an infeasible input: no exception, strict JSON
    path = tmp_path / "tiny.json"
    node = {"id": 0, "supportedOnFpga": 1, "cpuLatency": 1.0, "fpgaLatency": 1.0, "isBackwardNode": 0,
            "size": 2.0}
    path.write_text(json.dumps({"maxSizePerFPGA": 1.0, "maxFPGAs": 1, "maxCPUs": 0, "edges": [],
                                "nodes": [node]}))
    out = solve_dp_command(str(path), "auto", 10.0)
    assert out["status"] == "infeasible" and out["max_load"] is None
    json.dumps(out, allow_nan=False)


# ------------------------------------------------------------------------------------ bad input
def test_bad_method_and_limits():
    g = _graph([{"id": 0}], [])
    with pytest.raises(ValueError, match="method"):
        solve_max_load(g, method="greedy")
    with pytest.raises(ValueError, match="time_limit_s"):
        solve_max_load(g, time_limit_s=0)
    with pytest.raises(ValueError, match="max_ideals"):
        solve_max_load(g, max_ideals=0)


def test_too_many_ideals():
    # 12 independent nodes: 4096 ideals
    g = _graph([{"id": i} for i in range(12)], [], k=2, cpus=1)
    with pytest.raises(ValueError, match="max_ideals"):
        solve_max_load(g, method="dp", max_ideals=100)
    res = solve_max_load(g, method="auto", max_ideals=100)
    assert res.method == "milp" and res.status == "optimal"
    assert res.max_load == pytest.approx(solve_max_load(g, method="dp").max_load, rel=1e-9)


def test_missing_columns_and_meta():
    g = _graph([{"id": 0}, {"id": 1}], [(0, 1, 0.1)])
    bare = OpGraph.from_columns({"id": np.array([0, 1]), "kind": np.array(["profiled"] * 2, dtype=object)},
                                meta=dict(g.meta))
    with pytest.raises(ValueError, match="cpu_latency"):
        solve_max_load(bare)
    no_meta = OpGraph(g.nodes, g.edges, {"model": "x"}, g.extra_nodes, g.extra_edges)
    with pytest.raises(ValueError, match="max_accs"):
        solve_max_load(no_meta)
    neg = OpGraph(g.nodes, g.edges, dict(g.meta), dict(g.extra_nodes, acc_latency=np.array([1.0, -1.0])),
                  g.extra_edges)
    with pytest.raises(ValueError, match="acc_latency"):
        solve_max_load(neg)
    bad_meta = OpGraph(g.nodes, g.edges, dict(g.meta, max_accs=-1), g.extra_nodes, g.extra_edges)
    with pytest.raises(ValueError, match="max_accs"):
        evaluate_split(bad_meta, [0, 0])


def test_bad_device_of():
    g = _graph([{"id": 0}, {"id": 1}], [(0, 1, 0.1)])
    with pytest.raises(ValueError, match="device_of"):
        evaluate_split(g, [0])
    with pytest.raises(ValueError, match="device_of"):
        evaluate_split(g, [0.5, 1])
    with pytest.raises(ValueError, match="device_of"):
        evaluate_split(g, {0: 0})
    with pytest.raises(ValueError, match="device_of"):
        evaluate_split(g, {0: 0, 1: 0, 9: 1})


def test_empty_and_single_node_graphs():
    g = parse_dnn_partitioning({"maxSizePerFPGA": 1.0, "maxFPGAs": 2, "maxCPUs": 1, "nodes": [], "edges": []})
    res = solve_max_load(g)
    assert res.status == "optimal" and res.max_load == 0.0
    g = _graph([{"id": 5, "fpgaLatency": 3.0, "cpuLatency": 2.0}], [], k=1, cpus=1)
    res = solve_max_load(g)
    assert res.max_load == pytest.approx(2.0) and res.device_of.tolist() == [1]


@pytest.mark.parametrize("a,b", list(itertools.combinations(range(3), 2)))
def test_parallel_pair_symmetry(a, b):
    """Swapping which of two identical parallel nodes is named first does not change the optimum."""
    nodes = [{"id": i, "fpgaLatency": float(1 + i)} for i in range(3)]
    base = solve_max_load(_graph(nodes, [], k=2, cpus=0), method="dp").max_load
    nodes[a]["fpgaLatency"], nodes[b]["fpgaLatency"] = nodes[b]["fpgaLatency"], nodes[a]["fpgaLatency"]
    assert solve_max_load(_graph(nodes, [], k=2, cpus=0), method="dp").max_load == pytest.approx(base)
