"""``archplace search --target mcm`` (issue 32): the chiplet cost model against hand-computed yield and
cost, the MCM trial's placers, a 2-point space whose best design is known by construction, every
partition in best.json valid under the simulator's ``check``, the searchers, and resume after a killed
driver."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from archplace import api
from archplace.hardware import constants as C
from archplace.hardware.chiplet_cost import (
    CostParams,
    chiplet_area_mm2,
    die_yield,
    dies_per_wafer,
    package_cost,
)
from archplace.platform.codesign import pareto_mask
from archplace.platform.mcm_trial import (
    MCMDesign,
    PlacerOptions,
    evaluate_design,
    index_of,
    load_policy,
    load_space,
    mcm_graph,
    mesh_chip_latency_s,
    mesh_grid,
    point,
    space_size,
)
from archplace.simulators.mcm import MCMProblem, check, chip_latency_s, evaluate

REPO = Path(__file__).resolve().parents[1]
GPT2 = "hf:" + str(REPO / "tests/data/small_gpt2_config.json")
LLAMA = "hf:" + str(REPO / "tests/data/tiny_llama_config.json")


def _space(**axes) -> dict:
    base = {"num_chiplets": [4], "pe": [64], "clock_mhz": [480], "sram_mb": [32], "link_gbs": [32],
            "link_pj_per_bit": [0.5], "topology": ["ring"]}
    return {"axes": {**base, **axes}, "cost": {}}


# ---------------------------------------------------------------------- the cost model
def test_yield_and_dies_per_wafer_by_hand():
    # 100 mm² = 1 cm², D0 0.1/cm², alpha 1: Y = 1 / (1 + 0.1) ; alpha -> inf tends to Poisson exp(-0.1)
    assert die_yield(100.0, 0.1, 1.0) == pytest.approx(1 / 1.1, rel=1e-12)
    assert die_yield(100.0, 0.1, 1e9) == pytest.approx(math.exp(-0.1), rel=1e-6)
    # 300 mm wafer: pi 150² / 100 - pi 300 / sqrt(200) = 706.858 - 66.643 = 640.215
    want = math.pi * 225 - math.pi * 300 / math.sqrt(200)
    assert dies_per_wafer(100.0, 300.0) == pytest.approx(want, rel=1e-12)
    assert dies_per_wafer(100.0, 300.0) == pytest.approx(640.215, abs=1e-3)
    with pytest.raises(ValueError, match="does not fit"):
        dies_per_wafer(80_000.0, 300.0)


def test_package_cost_by_hand():
    """Four 64x64 chiplets with 32 MiB SRAM on a ring, round constants: every step recomputed here."""
    p = CostParams(wafer_usd=5000.0, defect_density_per_cm2=0.2, clustering_alpha=2.0, test_usd_per_die=1.0,
                   substrate_usd_per_mm2=0.01, substrate_area_factor=2.0, substrate_yield=0.95,
                   bond_usd_per_chiplet=2.0, bond_yield=0.9, d2d_phy_mm2_per_gbs=0.05)
    sram = C.SRAM_UM2_PER_BYTE
    core = (64 * 64 * C.MAC_AREA_UM2 + 64 * 1024 * sram + C.CORE_CONTROL_AREA_UM2   # l2_tc 2^(6+6-6) KB
            + 64 * C.VECTOR_LANE_AREA_UM2 + 1 * 1024 * sram + C.CORE_CONTROL_AREA_UM2  # l2_vc 1 KB
            + 32 * 2**20 * sram) / 1e6
    phy = 2 * 32 * 0.05                      # ring: 2 ports of 32 GB/s
    a = core + phy
    assert chiplet_area_mm2(64, 32, 32, "ring", p) == pytest.approx((a, phy), rel=1e-12)
    n_wafer = math.pi * 150**2 / a - math.pi * 300 / math.sqrt(2 * a)
    y = (1 + a / 100 * 0.2 / 2) ** -2
    kgd = (5000 / n_wafer + 1.0) / y
    total = (4 * kgd + 4 * a * 2.0 * 0.01 + 4 * 2.0) / (0.95 * 0.9**4)
    pc = package_cost(4, 64, 32, 32, "ring", p)
    assert pc.die_yield == pytest.approx(y, rel=1e-12) and pc.kgd_usd == pytest.approx(kgd, rel=1e-12)
    assert pc.package_usd == pytest.approx(total, rel=1e-12)
    assert pc.package_yield == pytest.approx(0.95 * 0.9**4, rel=1e-12)
    # a mesh chiplet pays for 4 ports: larger, so dearer
    assert package_cost(4, 64, 32, 32, "mesh", p).package_usd > total
    with pytest.raises(ValueError, match="cost field 'bond_yield' must be in"):
        CostParams(bond_yield=1.5)


def test_space_checks_and_indexing():
    sp = load_space()
    assert space_size(sp) == 5 * 3 * 3 * 4 * 3 * 1 * 2
    for i in (0, 7, space_size(sp) - 1):
        assert index_of(sp, point(sp, i)) == i
    with pytest.raises(ValueError, match=r"unknown axis \['cores'\]"):
        load_space({"axes": {**_space()["axes"], "cores": [1]}})
    with pytest.raises(ValueError, match="axes.num_chiplets value 65 must be an integer in"):
        load_space(_space(num_chiplets=[65]))
    with pytest.raises(ValueError, match="axes.topology value 'torus' unknown"):
        load_space(_space(topology=["torus"]))
    with pytest.raises(ValueError, match="a dnn-partitioning graph has profiled op times"):
        mcm_graph("x.json")


def test_request_checks_name_the_field():
    ok = dict(models=(GPT2,), target="mcm")
    cases = [(dict(placer="sa"), "placer must be one of"),
             (dict(accelerators=8), "accelerators applies to --target accelerator, not mcm"),
             (dict(searcher="phaze2"), "searcher must be one of"),
             (dict(finetune_subsolves=4), "finetune_subsolves applies to placer ppo-pretrained"),
             (dict(target="tpu"), "target must be one of")]
    for extra, msg in cases:
        with pytest.raises(ValueError, match=msg):
            api.SearchRequest(**{**ok, **extra}).validate()
    api.SearchRequest(**ok).validate()


# ---------------------------------------------------------------------- the 2-D mesh link model
def test_mesh_links_by_hand():
    """2 x 2 mesh, snake 0 (0,0) 1 (0,1) 2 (1,1) 3 (1,0); ops 0->1->2->3 and 0->3, one per chip,
    out_bytes 10, 20, 30, 40 at 10 B/s, 1 s each. Ring: op 0 crosses links 0, 1, 2 -> loads 10, 30, 40.
    Mesh: op 0 goes 0->1 and 0->3 (one hop down), op 1 1->2, op 2 2->3: busiest out-links 10, 20, 30."""
    p = MCMProblem.from_arrays(4, [0, 1, 2, 0], [1, 2, 3, 3], [1.0] * 4, out_bytes=[10.0, 20.0, 30.0, 40.0],
                               link_bw_bytes_per_s=10.0)
    f = np.arange(4)
    assert mesh_grid(4) == (2, 2) and mesh_grid(32) == (4, 8) and mesh_grid(7) == (1, 7)
    assert chip_latency_s(p, f)[0].tolist() == [2.0, 4.0, 5.0, 1.0]
    lat, total = mesh_chip_latency_s(p, f)
    assert lat.tolist() == [2.0, 3.0, 4.0, 1.0] and total == 70.0


def test_a_one_row_mesh_is_the_ring_and_a_mesh_is_never_slower():
    """1 x C (C prime): the snake is the chain and the routes are chain spans, so the mesh model is the
    simulator's ring model exactly; on 2-D meshes no chip is slower than on the ring (random DAGs and
    monotone partitions)."""
    rng = np.random.default_rng(0)
    for c in (3, 5, 7, 4, 8, 16, 32, 8, 16, 32):
        n = 40
        src, dst = zip(*[(int(u), v) for v in range(1, n) for u in rng.choice(v, min(v, 2), replace=False)])
        p = MCMProblem.from_arrays(c, src, dst, rng.random(n), out_bytes=rng.integers(1, 99, n) * 1.0,
                                   link_bw_bytes_per_s=7.0)
        f = np.zeros(n, dtype=np.int64)
        f[p.topo] = np.sort(rng.integers(0, c, n))
        mesh, ring = mesh_chip_latency_s(p, f)[0], chip_latency_s(p, f)[0]
        if mesh_grid(c)[0] == 1:
            assert np.allclose(mesh, ring, rtol=1e-12)
        else:
            assert np.all(mesh <= ring * (1 + 1e-12))


# ---------------------------------------------------------------------- the placers (no Ray)
@pytest.fixture(scope="module")
def gpt2_graph():
    return mcm_graph(GPT2)


def test_every_placer_gives_a_valid_partition_no_worse_than_greedy(gpt2_graph):
    design = MCMDesign.from_config(point(_space(num_chiplets=[8], sram_mb=[16]), 0))
    problem = MCMProblem.from_graph(gpt2_graph, design.package())
    policy = load_policy()
    tps = {}
    for placer in ("greedy", "greedy+lns", "cpsat", "ppo-pretrained"):
        opts = PlacerOptions(placer=placer, subsolves=3, det_time=0.1)
        row = evaluate_design(design, {"m": gpt2_graph}, opts, policy_state=policy)[0]
        part = np.array(json.loads(row["partition_json"]))
        assert check(problem, part) == [], placer
        assert row["throughput"] == pytest.approx(float(evaluate(problem, part).throughput[0]), rel=1e-12)
        assert row["throughput"] >= row["greedy_throughput"] * (1 - 1e-12) > 0
        assert row["status"] == "ok" and row["chips_used"] == int(part.max()) + 1
        tps[placer] = row["throughput"]
        # deterministic budgets: the same call gives the same partition
        again = evaluate_design(design, {"m": gpt2_graph}, opts, policy_state=policy)[0]
        assert again["partition_json"] == row["partition_json"], placer
    assert tps["greedy+lns"] >= tps["greedy"]
    # the same chain on a mesh: the same partition, never slower (skips take shortcuts), dearer (4 ports)
    ring = evaluate_design(design, {"m": gpt2_graph}, PlacerOptions(placer="greedy"))[0]
    mesh_design = MCMDesign.from_config({**design.to_dict(), "topology": "mesh"})
    mesh = evaluate_design(mesh_design, {"m": gpt2_graph}, PlacerOptions(placer="greedy"))[0]
    assert mesh["partition_json"] == ring["partition_json"]
    assert mesh["throughput"] >= ring["throughput"] and mesh["package_usd"] > ring["package_usd"]
    assert mesh["link_bytes"] <= ring["link_bytes"]


# ---------------------------------------------------------------------- searches (one Ray)
def _search(tmp, name, space, **kw):
    req = api.SearchRequest(models=kw.pop("models", (GPT2,)), target="mcm", out_dir=str(tmp / name),
                            space=space, **kw)
    return api.search(req).to_dict()


def _check_partitions(best: dict, graphs: dict) -> int:
    """Every partition best.json holds passes the simulator's check and has its recorded throughput."""
    n = 0
    for entry in [best["common"], *best["per_model"].values()]:
        design = MCMDesign.from_config(entry["hardware"])
        for m, p in entry["per_model"].items():
            problem = MCMProblem.from_graph(graphs[m], design.package())
            part = np.array(p["partition"])
            assert check(problem, part) == []
            lat = (mesh_chip_latency_s(problem, part)[0] if design.topology == "mesh"
                   else evaluate(problem, part).latency_s[0])
            assert p["throughput"] == pytest.approx(1.0 / float(lat.max()), rel=1e-12)
            n += 1
    return n


def test_two_point_space_best_known_by_construction(ray_session, tmp_path, gpt2_graph):
    """The same package at 480 and 960 MHz: the cost model prices area, not clock, so both cost the
    same; every op time halves (cycles / clock, and the SRAM bandwidth is bytes per cycle), so greedy
    (which splits by time proportions) gives the same partition, and the faster package is strictly
    faster: it is the best design and the whole Pareto front."""
    res = _search(tmp_path, "two", _space(clock_mhz=[480, 960]), searcher="grid", budget=2, placer="greedy")
    assert res["evaluated"] == 2 and res["failed"] == 0 and res["searcher"] == "grid"
    rows = pq.read_table(tmp_path / "two" / "evaluations.parquet").to_pylist()
    by = {r["clock_mhz"]: r for r in rows}
    assert by[960.0]["partition_json"] == by[480.0]["partition_json"]
    assert by[960.0]["package_usd"] == by[480.0]["package_usd"]
    assert by[960.0]["throughput"] > by[480.0]["throughput"] > 0
    assert res["common"]["hardware"]["clock_mhz"] == 960
    assert [p["arch_key"] for p in res["pareto"]] == [by[960.0]["arch_key"]]
    best = json.loads((tmp_path / "two" / "best.json").read_text())
    assert _check_partitions(best, {GPT2: gpt2_graph}) == 2
    report = (tmp_path / "two" / "report.md").read_text()
    assert "Pareto front" in report and (tmp_path / "two" / "plots" / "pareto_cost.png").stat().st_size > 0


# optuna (TPE) goes through the same OptunaSearch path as pareto (NSGA-II); the suite runs the two ends
@pytest.mark.parametrize("searcher", ["random", "pareto"])
def test_searchers_and_the_pareto_front(ray_session, tmp_path, searcher, gpt2_graph):
    """Each searcher evaluates 4 distinct points of an 8-point space; best.json's front is exactly the
    non-dominated evaluated designs (brute force) and its best design has the top throughput per k$."""
    space = _space(num_chiplets=[4, 8], sram_mb=[16, 32], link_gbs=[16, 64])
    res = _search(tmp_path, searcher, space, searcher=searcher, budget=4, placer="greedy", seed=1)
    rows = pq.read_table(tmp_path / searcher / "evaluations.parquet").to_pylist()
    designs = {r["arch_key"]: (r["throughput"], r["cost_usd"]) for r in rows if r["status"] == "ok"}
    assert res["evaluated"] == len({r["arch_key"] for r in rows}) == 4
    front = {k for k, (t, c) in designs.items()
             if not any(t2 >= t and c2 <= c and (t2 > t or c2 < c) for t2, c2 in designs.values())}
    assert {p["arch_key"] for p in res["pareto"]} == front
    top = max(designs, key=lambda k: designs[k][0] / designs[k][1])
    assert res["common"]["arch_key"] == top
    assert _check_partitions(json.loads((tmp_path / searcher / "best.json").read_text()), {GPT2: gpt2_graph})
    # resumed with a larger budget: the 4 are told to the searcher and 2 new packages are evaluated (a
    # resumed seeded Optuna sampler draws its first points again: they are told, not re-evaluated)
    more = _search(tmp_path, searcher, space, searcher=searcher, budget=6, placer="greedy", seed=1,
                   resume=True)
    assert more["evaluated"] == 6 and more["stats"]["resumed"] == 4 and more["stats"]["new_trials"] == 2


def test_pareto_mask_brute_force():
    rng = np.random.default_rng(0)
    tp, cost = rng.integers(1, 6, 40).astype(float), rng.integers(1, 6, 40).astype(float)
    want = [not any(tp[j] >= tp[i] and cost[j] <= cost[i] and (tp[j] > tp[i] or cost[j] < cost[i])
                    for j in range(40)) for i in range(40)]
    assert pareto_mask(tp, cost).tolist() == want


# ---------------------------------------------------------------------- resume after a killed driver
# ---------------------------------------------------------------------- a target: mcm study (the service)
def test_mcm_study_through_the_service(tmp_path):
    """Two replicas over one database: a ``target: mcm`` grid study hands out the 4 packages of its space
    once each; the client partitions bert-base on each (the MCM trial) and reports (throughput, cost);
    the study's Pareto front is the brute-force one."""
    from service_core_util import ask, replicas

    from archplace.service.schemas import CompleteRequest, StudyCreate

    a, b = replicas(tmp_path / "studies.sqlite", n=2)
    space = _space(num_chiplets=[8, 16], sram_mb=[64], topology=["ring", "mesh"])
    req = StudyCreate(name="pkg", models=["bert-base"], target="mcm", searcher="grid", space=space,
                      objectives=[{"name": "throughput"}, {"name": "cost_usd", "goal": "minimize"}])
    study, created = a.create("alice", req)
    assert created and study.space_size == 4 and study.config["target"] == "mcm"
    got = ask(b, "alice", "pkg", count=2, client_id="w1").trials + ask(a, "alice", "pkg", count=2,
                                                                        client_id="w2").trials
    assert sorted(t.arch_index for t in got) == [0, 1, 2, 3]
    assert ask(a, "alice", "pkg", count=1, client_id="w3").done
    graph = {"bert-base": mcm_graph("bert-base")}
    values = {}
    for t in got:
        design = MCMDesign.from_config(t.params)
        assert t.params["label"] == design.label()
        row = evaluate_design(design, graph, PlacerOptions(placer="greedy"))[0]
        assert row["package_usd"] == pytest.approx(t.params["package_usd"], rel=1e-12)
        values[t.number] = {"throughput": row["throughput"], "cost_usd": row["package_usd"]}
        (a if t.number % 2 else b).complete("alice", "pkg", t.number,
                                            CompleteRequest(values=values[t.number]))
    front = {n for n, v in values.items()
             if not any(w["throughput"] >= v["throughput"] and w["cost_usd"] <= v["cost_usd"] and w != v
                        for w in values.values())}
    pareto = a.pareto("alice", "pkg")
    assert {t.number for t in pareto.trials} == front
    # Optuna (TPE over the axes as categories) on the same space: 4 distinct packages, then done
    by_index = {t.arch_index: values[t.number]["throughput"] for t in got}
    a.create("alice", StudyCreate(name="tpe", models=["bert-base"], target="mcm", searcher="optuna",
                                  space=space, seed=3))
    tpe = [ask(b, "alice", "tpe", client_id=f"c{i}").trials[0] for i in range(4)]
    assert sorted(t.arch_index for t in tpe) == [0, 1, 2, 3]
    for t in tpe:
        b.complete("alice", "tpe", t.number, CompleteRequest(value=by_index[t.arch_index]))
    assert a.best("alice", "tpe").value == max(by_index.values())
    with pytest.raises(ValueError, match="target mcm: searcher must be random, grid or optuna"):
        StudyCreate(name="x", models=["bert-base"], target="mcm", space=space)
    with pytest.raises(ValueError, match="axes.topology value 'torus' unknown"):
        StudyCreate(name="x", models=["bert-base"], target="mcm", searcher="grid",
                    space=_space(topology=["torus"]))
