"""GPU-cluster co-design (issue 32 item 2, issue 44): the space, the cited price table and the network's
price by hand, each GPU's share of its server's network, a two-shape space whose best design is known by
construction, the memory-fit refusal with its reason, and the trial's iteration time against ``archplace
pipeline --algo dp`` on the equivalent V100 cluster."""

from __future__ import annotations

import math

import numpy as np
import pytest

from archplace import api
from archplace.hardware.cluster_prices import (
    NETWORK_USD_PER_GBPS_HOUR,
    PRICE_TABLE,
    gpu_usd_per_hour_without_network,
    is_listed,
    network_usd_per_hour,
    price_basis,
    price_per_gpu_hour_usd,
    price_per_hour_usd,
)
from archplace.hardware.gpu_cluster_space import (
    CLUSTER_GPUS,
    INTER_CLASSES,
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

# 8 V100 per server on NVLink, one 200 Gb/s port per server: 25 Gb/s per GPU, Auto-MAP's per transfer
V100_A = {"gpu": "v100-sxm2", "gpus_per_server": 8, "num_servers": 2, "intra_class": "nvlink",
          "inter_class": "ib-hdr-200g"}
RATE = (7.2576 - 5.44) / (200 - 50)   # $/Gb/s-h: c6in.32xlarge - c6i.32xlarge, 150 Gb/s apart


# ----------------------------------------------------------------------------------------------- prices
def test_prices_against_the_table_by_hand():
    # 8-GPU instance prices (AWS us-east-1 on-demand) / 8
    assert price_per_gpu_hour_usd("v100-sxm2") == pytest.approx(31.212 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("a100-40gb") == pytest.approx(32.7726 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("a100-80gb") == pytest.approx(40.9657 / 8, rel=1e-12)
    assert price_per_gpu_hour_usd("h100-sxm") == pytest.approx(12.29, rel=1e-12)
    # H200: p5 on-demand x (H200 / H100 Capacity Block rate) = 98.32 x 43.26 / 39.33 = 108.1445 $/h
    assert price_per_gpu_hour_usd("h200") == pytest.approx(108.14450038 / 8, rel=1e-9)
    # listed shapes: servers x the instance (2 x p5, 3 x p4d, 1 x p3dn)
    assert price_per_hour_usd(ClusterShape("h100-sxm", 8, 2, "nvlink", "efa-3200g")) == pytest.approx(196.64)
    assert price_per_hour_usd(ClusterShape("a100-40gb", 8, 3, "nvlink", "efa-400g")) == \
        pytest.approx(3 * 32.7726)
    assert price_per_hour_usd(ClusterShape("v100-sxm2", 8, 1, "nvlink", "efa-100g")) == pytest.approx(31.212)


def test_network_has_a_price_by_hand():
    assert NETWORK_USD_PER_GBPS_HOUR == pytest.approx(RATE, rel=1e-12) == pytest.approx(0.0121173, rel=1e-5)
    gbps = {"eth-25g": 25, "efa-100g": 100, "ib-hdr-200g": 200, "efa-400g": 400, "efa-3200g": 3200}
    assert list(INTER_CLASSES) == list(gbps)
    for c, g in gbps.items():
        assert network_usd_per_hour(c) == pytest.approx(g * RATE, rel=1e-12)
    # a GPU-hour without the network: (instance - its network) / 8
    assert gpu_usd_per_hour_without_network("a100-40gb") == pytest.approx((32.7726 - 400 * RATE) / 8)
    assert gpu_usd_per_hour_without_network("h100-sxm") == pytest.approx((98.32 - 3200 * RATE) / 8)
    assert gpu_usd_per_hour_without_network("v100-sxm2") == pytest.approx((31.212 - 100 * RATE) / 8)
    # a built shape: GPUs without network + servers x its network; 12 V100 on PCIe, 3 servers, 25 GbE
    assert price_per_hour_usd(ClusterShape("v100-sxm2", 4, 3, "pcie", "eth-25g")) == pytest.approx(
        12 * (31.212 - 100 * RATE) / 8 + 3 * 25 * RATE)
    # 2 A100 servers with a p5's network: the p4d's GPUs plus 3,200 Gb/s per server
    assert price_per_hour_usd(ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-3200g")) == pytest.approx(
        2 * (32.7726 - 400 * RATE) + 2 * 3200 * RATE)
    # the network changes the price; the intra-server class does not
    slow, fast = (ClusterShape("h200", 2, 4, "nvlink", c) for c in ("eth-25g", "efa-400g"))
    assert price_per_hour_usd(fast) - price_per_hour_usd(slow) == pytest.approx(4 * (400 - 25) * RATE)
    assert price_per_hour_usd(ClusterShape("h200", 2, 4, "pcie", "efa-400g")) == price_per_hour_usd(fast)
    # on a listed shape the built price is the listed one (one function of the shape)
    for g, row in PRICE_TABLE.items():
        built = 8 * gpu_usd_per_hour_without_network(g) + network_usd_per_hour(row.network)
        assert built == pytest.approx(row.usd_per_hour, rel=1e-12)
    # the rate as a parameter: 0 is the old free network (the instance's per-GPU rate for every shape)
    assert price_per_hour_usd(ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-3200g"), 0.0) == \
        pytest.approx(2 * 32.7726)
    with pytest.raises(ValueError, match="network_usd_per_gbps_hour is -1"):
        price_per_hour_usd(slow, -1)
    with pytest.raises(ValueError, match="inter_class is 'eth-1g'; allowed"):
        network_usd_per_hour("eth-1g")


def test_listed_only_when_the_shape_is_the_instance():
    p4d = ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-400g")
    assert is_listed(p4d)
    assert price_basis(p4d).startswith("listed: 2 x Amazon EC2 p4d.24xlarge us-east-1")
    # GPU model, GPUs per node, intra-node link and network must all match
    for other in (ClusterShape("a100-80gb", 8, 2, "nvlink", "efa-400g"),   # is a p4de: listed as that
                  ClusterShape("a100-40gb", 4, 2, "nvlink", "efa-400g"),
                  ClusterShape("a100-40gb", 8, 2, "pcie", "efa-400g"),
                  ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-3200g"),
                  ClusterShape("a100-40gb", 8, 2, "nvlink", "ib-hdr-200g")):
        assert is_listed(other) == (other.gpu == "a100-80gb")
    assert price_basis(ClusterShape("a100-80gb", 8, 2, "nvlink", "efa-400g")).startswith(
        "listed: 2 x Amazon EC2 p4de.24xlarge")


def test_price_table_is_cited_and_basis_says_how():
    assert sorted(PRICE_TABLE) == sorted(CLUSTER_GPUS)
    for row in PRICE_TABLE.values():
        assert row.provider and row.instance_type and row.region and row.date and row.source
        assert row.gpus == 8 and row.usd_per_hour > 0 and row.network in INTER_CLASSES
    assert {g: r.network for g, r in PRICE_TABLE.items()} == {
        "v100-sxm2": "efa-100g", "a100-40gb": "efa-400g", "a100-80gb": "efa-400g", "h100-sxm": "efa-3200g",
        "h200": "efa-3200g"}
    assert [g for g, r in PRICE_TABLE.items() if r.derived] == ["h200"]
    assert price_basis(ClusterShape("h100-sxm", 8, 1, "nvlink", "efa-3200g")).startswith(
        "listed: Amazon EC2 p5.48xlarge us-east-1")
    assert price_basis(ClusterShape("h100-sxm", 8, 3, "nvlink", "efa-3200g")).startswith("listed: 3 x ")
    b = price_basis(ClusterShape("a100-80gb", 4, 2, "nvlink", "eth-25g"))
    assert b.startswith("built (shape not listed): 8 GPU x $4.5148/GPU-h (Amazon EC2 p4de.24xlarge")
    assert "less its efa-400g network) + 2 server x $0.3029/h (eth-25g, 25 Gb/s" in b
    assert "derived" in price_basis(ClusterShape("h200", 8, 1, "nvlink", "efa-3200g"))
    with pytest.raises(ValueError, match="shape must be a ClusterShape"):
        price_per_hour_usd(V100_A)


def test_inter_server_bandwidth_is_a_gpus_share_of_its_servers_network():
    # p4d: 4 x 100 Gb/s EFA for 8 GPUs = 50 Gb/s = 6.25 GB/s per GPU (not 400 Gb/s per transfer)
    assert ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-400g").inter_server_bytes_per_s == 6.25e9
    # p5: 3,200 Gb/s for 8 = 50 GB/s; p3dn: 100 Gb/s for 8 = 1.5625 GB/s
    assert ClusterShape("h100-sxm", 8, 2, "nvlink", "efa-3200g").inter_server_bytes_per_s == 50e9
    assert ClusterShape("v100-sxm2", 8, 2, "nvlink", "efa-100g").inter_server_bytes_per_s == 1.5625e9
    # fewer GPUs per server share it among fewer: 400 Gb/s for 2 = 25 GB/s
    assert ClusterShape("a100-40gb", 2, 2, "nvlink", "efa-400g").inter_server_bytes_per_s == 25e9
    # never more than the GPU's PCIe x16 (the NIC is reached over it): 3,200 Gb/s for 1 A100 -> 32 GB/s
    assert ClusterShape("a100-40gb", 1, 2, "nvlink", "efa-3200g").inter_server_bytes_per_s == 32e9
    assert ClusterShape("h100-sxm", 2, 2, "nvlink", "efa-3200g").inter_server_bytes_per_s == 64e9
    d = ClusterShape("a100-40gb", 8, 2, "nvlink", "efa-400g").to_dict()
    assert d["network_gbps_per_server"] == 400.0 and d["inter_server_bytes_per_s"] == 6.25e9


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
    s = shape_from_config({**V100_A, "num_servers": 3, "inter_class": "efa-3200g", "extra": 1})
    c = cluster_of_shape(s)
    assert (c.num_devices, c.devices_per_server, c.topology) == (24, 8, "servers")
    # 3,200 Gb/s / 8 GPUs = 50 GB/s, above the V100's PCIe Gen3 x16: 16 GB/s
    assert c.link_bw == 150e9 and c.inter_server_bw == 16e9 and c.device.hbm_gb == 32.0
    p = cluster_of_shape(ClusterShape("h100-sxm", 4, 1, "pcie", "eth-25g"))
    assert p.link_bw == 64e9 and p.inter_server_bw == 25e9 / 8 / 4 and p.device.hbm_gb == 80.0


@pytest.mark.parametrize("bad, match", [
    ({"gpu": "p100-pcie"}, "field 'gpu' is 'p100-pcie'; allowed: \\['v100-sxm2'"),
    ({"gpus_per_server": 0}, "field 'gpus_per_server' is 0; allowed: integers 1..8"),
    ({"gpus_per_server": True}, "field 'gpus_per_server' is True"),
    ({"num_servers": 2.0}, "field 'num_servers' is 2.0; allowed: integers 1..64"),
    ({"intra_class": "fabric"}, "field 'intra_class' is 'fabric'; allowed: \\['pcie', 'nvlink'\\]"),
    ({"inter_class": "eth-1g"}, "field 'inter_class' is 'eth-1g'; allowed: \\['eth-25g', 'efa-100g'"),
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
    """A shape of 8 V100 per server on NVLink with one 200 Gb/s port per server gives each GPU 25 Gb/s
    between servers, Auto-MAP's v100-server cluster: under the roofline (``pipeline``'s op times) the
    trial's plan and time are ``archplace pipeline --cluster A --algo dp``'s exactly (and, for 3 servers,
    those of the DP that command runs on cluster B)."""
    from archplace.algorithms.rl.pipeline_plan import model_profile
    from archplace.algorithms.solvers.pipeline_dp import solve_dp

    for cluster, servers in (("A", 2), ("B", 3)):
        shape = shape_from_config({**V100_A, "num_servers": servers})
        c = cluster_of_shape(shape)
        ref = v100_cluster(cluster)
        assert (c.num_devices, c.link_bw, c.inter_server_bw, c.device.hbm_gb) == \
            (ref.num_devices, ref.link_bw, ref.inter_server_bw, ref.device.hbm_gb)
        row = evaluate_cluster(shape, ["bert-48"], stages="servers", op_model="roofline")
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
        price = servers * (31.212 - 100 * RATE + 200 * RATE)   # p3dn's GPUs, a 200 Gb/s port per server
        assert row["price_per_hour_usd"] == pytest.approx(price)
        assert row["listed"] is False and row["network_usd_per_hour"] == pytest.approx(servers * 200 * RATE)
        assert row["op_model"] == "roofline"
        assert row["bert-48.cost_per_step_usd"] == pytest.approx(length * price / 3600, rel=1e-12)
        assert row["bert-48.samples_per_step"] == 256
        assert row["iteration_time_s"] == row["bert-48.iteration_time_s"]


def test_two_shape_space_best_known_by_construction(tmp_path):
    """Same GPUs, count, network and price (the intra-server class is not priced); one has NVLink inside
    the servers, the other PCIe. Every stage holds 8 GPUs of one server and all-reduces over that link,
    so the NVLink one is strictly faster and strictly cheaper per step: it alone is the Pareto front and
    the best on each axis. The default op model is the calibrated one."""
    f = tmp_path / "two.yaml"
    f.write_text("cluster: {gpu: [a100-40gb], gpus_per_server: [8], num_servers: [2], "
                 "intra_class: [pcie, nvlink], inter_class: [efa-400g]}\n")
    pts = grid_points(load_space(str(f)))
    assert len(pts) == 2
    rows = [evaluate_cluster(shape_from_config(p), ["bert-large", "bert-48"]) for p in pts]
    slow, fast = rows
    assert slow["intra_class"] == "pcie" and fast["intra_class"] == "nvlink"
    assert fast["listed"] and not slow["listed"] and fast["op_model"] == "calibrated"
    assert slow["price_per_hour_usd"] == pytest.approx(fast["price_per_hour_usd"], rel=1e-12)
    assert fast["price_per_hour_usd"] == pytest.approx(2 * 32.7726)
    for m in ("bert-large", "bert-48"):
        assert fast[f"{m}.iteration_time_s"] < slow[f"{m}.iteration_time_s"]
    assert fast["iteration_time_s"] == pytest.approx(
        fast["bert-large.iteration_time_s"] + fast["bert-48.iteration_time_s"], rel=1e-12)
    assert pareto_front(rows) == [fast]
    assert min(rows, key=lambda r: r["cost_per_step_usd"]) is fast
    assert min(rows, key=lambda r: r["iteration_time_s"]) is fast


def test_faster_network_costs_more_and_is_faster_across_servers():
    """Two servers of 8 A100 whose pipeline cut crosses them: the p4d's 400 Gb/s (6.25 GB/s per GPU)
    against 25 GbE (0.39 GB/s per GPU). The faster one costs 2 x 375 Gb/s x the rate more per hour and
    is faster; each is on the time-vs-cost front unless one is also cheaper per step."""
    rows = [evaluate_cluster(ClusterShape("a100-40gb", 8, 2, "nvlink", c), ["bert-48"], stages="servers")
            for c in ("eth-25g", "efa-400g")]
    slow, fast = rows
    assert fast["price_per_hour_usd"] - slow["price_per_hour_usd"] == pytest.approx(2 * 375 * RATE)
    assert fast["inter_server_bytes_per_s"] == 6.25e9 and slow["inter_server_bytes_per_s"] == 25e9 / 64
    assert fast["bert-48.iteration_time_s"] < slow["bert-48.iteration_time_s"]
    front = pareto_front(rows)
    assert fast in front and (slow in front) == (slow["cost_per_step_usd"] < fast["cost_per_step_usd"])


def test_memory_fit_refusal_with_reason():
    """megatron-2.5b with Adam: 2.5e9 parameters x 16 bytes ≈ 40 GB on one 32 GiB V100. One GPU cannot
    hold it under any plan; two GPUs in one server can, as two pipeline stages (servers+fit)."""
    one = evaluate_cluster(ClusterShape("v100-sxm2", 1, 1, "nvlink", "eth-25g"), ["megatron-2.5b"])
    assert one["op_model"] == "calibrated"
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
    s8 = ClusterShape("h100-sxm", 8, 8, "nvlink", "efa-3200g")
    assert stage_counts(s8, "servers") == [8] and stage_counts(s8, "servers+fit") == [8]
    s1 = ClusterShape("h100-sxm", 8, 1, "nvlink", "efa-3200g")
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
