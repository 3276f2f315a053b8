"""GPU-cluster co-design (issue 32 item 2): the space, the cited price table by hand, a two-shape space whose
best design is known by construction, the memory-fit refusal with its reason, and the trial's iteration
time against ``archplace pipeline --algo dp`` on the equivalent V100 cluster."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archplace import api
from archplace.hardware.cluster_prices import (
    PRICE_TABLE,
    price_basis,
    price_per_gpu_hour_usd,
    price_per_hour_usd,
)
from archplace.hardware.gpu_cluster_space import (
    CLUSTER_GPUS,
    SHAPE_FIELDS,
    ClusterShape,
    cluster_of_shape,
    grid_points,
    load_space,
    sample_points,
    shape_from_config,
)
from archplace.hardware.presets import v100_cluster
from archplace.platform.gpu_cluster_trial import evaluate_cluster, pareto_front, stage_counts

V100_A = {"gpu": "v100-sxm2", "gpus_per_server": 8, "num_servers": 2, "intra_class": "nvlink",
          "inter_class": "eth-25g"}


# ----------------------------------------------------------------------------------------------- prices
def test_prices_against_the_table_by_hand():
    # 8-GPU instance prices (AWS us-east-1 on-demand) / 8, times the shape's GPUs
    assert price_per_gpu_hour_usd("v100-sxm2") == pytest.approx(31.212 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("a100-40gb") == pytest.approx(32.7726 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("a100-80gb") == pytest.approx(40.9657 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("h100-sxm") == pytest.approx(12.29, rel=1e-12)
    # H200: p5 on-demand x (H200 / H100 Capacity Block rate) = 98.32 x 43.26 / 39.33 = 108.1445 $/h
    assert price_per_gpu_hour_usd("h200") == pytest.approx(108.14450038 / 8, rel=1e-9)
    h100 = ClusterShape("h100-sxm", 8, 2, "nvlink", "ib-ndr-400g")
    assert price_per_hour_usd(h100) == pytest.approx(196.64)
    assert price_per_hour_usd(ClusterShape("v100-sxm2", 4, 3, "pcie", "eth-10g")) == pytest.approx(
        12 * 3.9015)
    assert price_per_hour_usd(ClusterShape("a100-40gb", 1, 1, "nvlink", "eth-25g")) == pytest.approx(4.096575)
    # the link classes do not change the price
    assert price_per_hour_usd(ClusterShape("h200", 2, 4, "pcie", "eth-10g")) == \
        price_per_hour_usd(ClusterShape("h200", 2, 4, "nvlink", "ib-ndr-400g"))


def test_price_table_is_cited_and_basis_says_how():
    assert sorted(PRICE_TABLE) == sorted(CLUSTER_GPUS)
    for row in PRICE_TABLE.values():
        assert row.provider and row.instance_type and row.region and row.date and row.source
        assert row.gpus == 8 and row.usd_per_hour > 0
    assert [g for g, r in PRICE_TABLE.items() if r.derived] == ["h200"]
    assert price_basis(ClusterShape("h100-sxm", 8, 1, "nvlink", "ib-ndr-400g")).startswith(
        "listed: Amazon EC2 p5.48xlarge us-east-1")
    assert price_basis(ClusterShape("h100-sxm", 8, 3, "nvlink", "eth-25g")).startswith("listed: 3 x ")
    b = price_basis(ClusterShape("a100-80gb", 4, 2, "nvlink", "eth-25g"))
    assert b.startswith("per-GPU rate of Amazon EC2 p4de.24xlarge") and "8 x $5.1207/GPU-h" in b
    assert "derived" in price_basis(ClusterShape("h200", 8, 1, "nvlink", "ib-ndr-400g"))
    with pytest.raises(ValueError, match="shape must be a ClusterShape"):
        price_per_hour_usd(V100_A)


# ------------------------------------------------------------------------------------------------ space
def test_default_space_and_grid():
    space = load_space()
    assert list(space["cluster"]) == list(SHAPE_FIELDS)
    pts = grid_points(space)
    assert len(pts) == 5 * 4 * 6 * 2 * 5 == 1200
    assert len({tuple(p.values()) for p in pts}) == 1200
    shapes = [shape_from_config(p) for p in pts]
    assert {s.gpu for s in shapes} == set(CLUSTER_GPUS)
    a = sample_points(space, 50, seed=3)
    assert a == sample_points(space, 50, seed=3) and a != sample_points(space, 50, seed=4)
    assert len({tuple(p.values()) for p in a}) == 50
    assert len(sample_points(space, 5000)) == 1200


def test_shape_to_cluster():
    s = shape_from_config({**V100_A, "num_servers": 3, "inter_class": "ib-hdr-200g", "extra": 1})
    c = cluster_of_shape(s)
    assert (c.num_devices, c.devices_per_server, c.topology) == (24, 8, "servers")
    assert c.link_bw == 150e9 and c.inter_server_bw == 25e9 and c.device.hbm_gb == 32.0
    p = cluster_of_shape(ClusterShape("h100-sxm", 4, 1, "pcie", "eth-10g"))
    assert p.link_bw == 64e9 and p.inter_server_bw == 1.25e9 and p.device.hbm_gb == 80.0


@pytest.mark.parametrize("bad, match", [
    ({"gpu": "p100-pcie"}, "field 'gpu' is 'p100-pcie'; allowed: \\['v100-sxm2'"),
    ({"gpus_per_server": 0}, "field 'gpus_per_server' is 0; allowed: integers 1..8"),
    ({"gpus_per_server": True}, "field 'gpus_per_server' is True"),
    ({"num_servers": 2.0}, "field 'num_servers' is 2.0; allowed: integers 1..64"),
    ({"intra_class": "fabric"}, "field 'intra_class' is 'fabric'; allowed: \\['pcie', 'nvlink'\\]"),
    ({"inter_class": "eth-1g"}, "field 'inter_class' is 'eth-1g'; allowed: \\['eth-10g'"),
])
def test_shape_errors_name_the_field(bad, match):
    with pytest.raises(ValueError, match=match):
        shape_from_config({**V100_A, **bad})


def test_shape_config_and_space_file_errors(tmp_path):
    with pytest.raises(ValueError, match="missing field\\(s\\) \\['inter_class'\\]"):
        shape_from_config({k: v for k, v in V100_A.items() if k != "inter_class"})
    assert shape_from_config({**V100_A, "num_servers": np.int64(4)}).num_servers == 4
    f = tmp_path / "s.yaml"
    f.write_text("cluster: {gpu: [h100-sxm], gpus_per_server: [8, 16], num_servers: [1], "
                 "intra_class: [nvlink], inter_class: [eth-25g]}\n")
    with pytest.raises(ValueError, match="cluster.gpus_per_server: gpu-cluster field 'gpus_per_server' is 1"):
        load_space(str(f))
    f.write_text("cluster: {gpu: [h100-sxm], num_servers: [1], intra_class: [nvlink], "
                 "inter_class: [eth-25g], gpus_per_server: [8], racks: [2]}\n")
    with pytest.raises(ValueError, match="unknown field\\(s\\) cluster.\\['racks'\\]"):
        load_space(str(f))
    with pytest.raises(ValueError, match="does not exist"):
        load_space(str(tmp_path / "none.yaml"))
    # the content itself (what a search ships to its trials) is checked the same way
    content = load_space()
    assert load_space(content) == content
    with pytest.raises(ValueError, match="gpu-cluster space: cluster.num_servers: .* is 0"):
        load_space({**content, "cluster": {**content["cluster"], "num_servers": [0, 1]}})


# ------------------------------------------------------------------------------------------------ trial
def test_iteration_time_equals_pipeline_dp_on_v100_cluster():
    """A shape of 8 V100 per server on NVLink and 25 Gb/s between servers is Auto-MAP's v100-server
    cluster: the trial's plan and time are ``archplace pipeline --cluster A --algo dp``'s exactly (and, for
    3 servers, those of the DP that command runs on cluster B)."""
    from archplace.algorithms.rl.pipeline_plan import model_profile
    from archplace.algorithms.solvers.pipeline_dp import solve_dp

    for cluster, servers in (("A", 2), ("B", 3)):
        shape = shape_from_config({**V100_A, "num_servers": servers})
        c = cluster_of_shape(shape)
        ref = v100_cluster(cluster)
        assert (c.num_devices, c.link_bw, c.inter_server_bw, c.device.hbm_gb) == \
            (ref.num_devices, ref.link_bw, ref.inter_server_bw, ref.device.hbm_gb)
        row = evaluate_cluster(shape, ["bert-48"], stages="servers")
        if cluster == "A":
            res = api.pipeline(api.PipelineRequest("bert-48", cluster=cluster, algo="dp"))
            length, cuts, devices, k = res.length_s, res.cuts, res.plan["devices"], res.stages
        else:
            plan = solve_dp(model_profile("bert-48"), ref, servers)
            length, cuts, devices, k = plan.length_s, plan.cuts.tolist(), plan.devices.tolist(), servers
        assert row["bert-48.iteration_time_s"] == length
        assert row["bert-48.cuts"] == cuts and row["bert-48.devices"] == devices
        assert row["bert-48.stages"] == k == servers and row["bert-48.proven_optimal"]
        assert row["bert-48.memory_fit"] and row["memory_fit"]
        price = servers * 31.212
        assert row["price_per_hour_usd"] == pytest.approx(price)
        assert row["bert-48.cost_per_step_usd"] == pytest.approx(length * price / 3600, rel=1e-12)
        assert row["bert-48.samples_per_step"] == 256
        assert row["iteration_time_s"] == row["bert-48.iteration_time_s"]


def test_two_shape_space_best_known_by_construction(tmp_path):
    """Same GPUs, same count, same price; one has the faster network. The pipeline's cut crosses the
    servers, so the faster one is strictly faster and strictly cheaper per step: it alone is the Pareto
    front and the best on each axis."""
    f = tmp_path / "two.yaml"
    f.write_text("cluster: {gpu: [a100-40gb], gpus_per_server: [8], num_servers: [2], "
                 "intra_class: [nvlink], inter_class: [eth-25g, ib-hdr-200g]}\n")
    pts = grid_points(load_space(str(f)))
    assert len(pts) == 2
    rows = [evaluate_cluster(shape_from_config(p), ["bert-large", "bert-48"]) for p in pts]
    slow, fast = rows
    assert slow["inter_class"] == "eth-25g" and fast["inter_class"] == "ib-hdr-200g"
    assert slow["price_per_hour_usd"] == fast["price_per_hour_usd"] == pytest.approx(2 * 32.7726)
    for m in ("bert-large", "bert-48"):
        assert fast[f"{m}.iteration_time_s"] < slow[f"{m}.iteration_time_s"]
    assert fast["iteration_time_s"] == pytest.approx(
        fast["bert-large.iteration_time_s"] + fast["bert-48.iteration_time_s"], rel=1e-12)
    assert pareto_front(rows) == [fast]
    assert min(rows, key=lambda r: r["cost_per_step_usd"]) is fast
    assert min(rows, key=lambda r: r["iteration_time_s"]) is fast


def test_memory_fit_refusal_with_reason():
    """megatron-2.5b with Adam: 2.5e9 parameters x 16 bytes ≈ 40 GB on one 32 GiB V100. One GPU cannot
    hold it under any plan; two GPUs in one server can, as two pipeline stages (servers+fit)."""
    one = evaluate_cluster(ClusterShape("v100-sxm2", 1, 1, "nvlink", "eth-25g"), ["megatron-2.5b"])
    assert one["megatron-2.5b.memory_fit"] is False and one["memory_fit"] is False
    assert one["megatron-2.5b.iteration_time_s"] is None and one["megatron-2.5b.cost_per_step_usd"] is None
    assert one["iteration_time_s"] is None and one["cost_per_step_usd"] is None
    assert one["megatron-2.5b.oom_plan_length_s"] > 0
    from archplace.platform.gpu_cluster_trial import pipeline_profile

    prof, _ = pipeline_profile("megatron-2.5b", "v100-sxm2")
    params = prof.param_bytes_prefix[-1] / prof.bytes_per_element
    assert params == pytest.approx(2.5e9, rel=0.05)
    assert one["megatron-2.5b.peak_memory_gib"] > params * 16 / 2**30 > 32
    reason = one["megatron-2.5b.memory_reason"]
    assert reason.startswith("no cut set into 1 stage(s) fits") and "> 32 GiB HBM of v100-sxm2" in reason
    assert f"{one['megatron-2.5b.peak_memory_gib']:.2f} GiB" in reason
    two_shape = ClusterShape("v100-sxm2", 2, 1, "nvlink", "eth-25g")
    strict = evaluate_cluster(two_shape, ["megatron-2.5b"], stages="servers")
    assert strict["megatron-2.5b.memory_fit"] is False  # one stage: both GPUs hold every parameter
    two = evaluate_cluster(two_shape, ["megatron-2.5b"])
    assert two["megatron-2.5b.memory_fit"] and two["megatron-2.5b.stages"] == 2
    # K = 1 is not even solved: the parameters with Adam state alone (≈ 40 GB) exceed one 32 GiB GPU
    assert two["megatron-2.5b.stages_skipped"] == [1] and two["megatron-2.5b.stages_tried"] == [2]
    assert two["megatron-2.5b.memory_reason"] == ""
    assert two["megatron-2.5b.peak_memory_gib"] <= 32
    # rows with and without a fit go into one Parquet table (the search's evaluations.parquet)
    import pyarrow as pa

    t = pa.Table.from_pylist([one, two])
    col = t.column("megatron-2.5b.iteration_time_s").to_pylist()
    assert col == [None, two["megatron-2.5b.iteration_time_s"]]
    assert t.column("megatron-2.5b.devices").to_pylist() == [[1], two["megatron-2.5b.devices"]]


def test_stage_rules_and_bad_input():
    s8 = ClusterShape("h100-sxm", 8, 8, "nvlink", "ib-ndr-400g")
    assert stage_counts(s8, "servers") == [8] and stage_counts(s8, "servers+fit") == [8]
    s1 = ClusterShape("h100-sxm", 8, 1, "nvlink", "ib-ndr-400g")
    assert stage_counts(s1, "servers+fit") == [1, 2, 4, 8]
    assert stage_counts(ClusterShape("h100-sxm", 3, 1, "nvlink", "eth-25g"), "servers+fit") == [1, 2, 3]
    assert stage_counts(s1, [4, 2, 4]) == [2, 4]
    with pytest.raises(ValueError, match="stages 9 exceeds the 8 GPUs"):
        stage_counts(s1, 9)
    with pytest.raises(ValueError, match="stages is 'auto'; allowed"):
        stage_counts(s1, "auto")
    with pytest.raises(ValueError, match="models must be a non-empty list"):
        evaluate_cluster(s1, "bert-48")
    with pytest.raises(ValueError, match="unknown option\\(s\\) \\['budget'\\]"):
        evaluate_cluster(s1, ["bert-48"], budget=3)
    with pytest.raises(ValueError, match="op_model is 'profiled'"):
        evaluate_cluster(s1, ["bert-48"], op_model="profiled")


def test_pareto_front_of_rows():
    rows = [{"c": 1.0, "t": 5.0}, {"c": 2.0, "t": 3.0}, {"c": 2.0, "t": 4.0}, {"c": 3.0, "t": 3.0},
            {"c": 0.5, "t": None}, {"c": math.nan, "t": 0.1}, {"c": 4.0, "t": 1.0}, {"c": 1.0, "t": 5.0}]
    front = pareto_front(rows, "c", "t")
    assert front == [rows[0], rows[7], rows[1], rows[6]]
    assert front[0] is rows[0] and front[1] is rows[7]
    assert pareto_front([], "c", "t") == []
