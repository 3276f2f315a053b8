"""Pipeline-parallel cost model on GPU servers (archplace.simulators.pipeline) and the exact solver over
pruned pivots (archplace.algorithms.solvers.pipeline_exact), checked against hand arithmetic from the
module docstrings and against brute force. Profiles are built by hand from small prefix arrays."""

import itertools

import numpy as np
import pytest

from archplace.algorithms.solvers.pipeline_exact import candidate_pivots, centre_device_cuts, solve_exact
from archplace.hardware.presets import V100, Cluster, v100_cluster
from archplace.simulators.pipeline import (
    BYTES_PER_PARAM,
    PipelineProfile,
    PipelineSetup,
    allocate_devices,
    evaluate,
    gpu_op_time_s,
    pipeline_length_s,
    profile_from_graph,
)
from archplace.workloads.backward import derive_backward
from archplace.workloads.graph import OpGraph

GiB = 2.0**30
NV, NET = 100e9, 10e9  # the small cluster's in-server and between-server bandwidths
# 4 V100 in 2 servers of 2: devices 0, 1 in server 0 and 2, 3 in server 1
T4 = Cluster("t4", 4, V100, NV, "servers", 2, NET)
SETUP = PipelineSetup(micro_batch=2, num_micro_batches=4)
M = SETUP.num_micro_batches


def _prefix(x) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(np.asarray(x, dtype=float))])


def make_profile(compute, params, saved=None, ckpt=None, cross=None, *, max_layer=0.0, setup=SETUP,
                 trainable=None) -> PipelineProfile:
    """Per-op lists → the prefix arrays of a PipelineProfile (fp16, 2 bytes per element)."""
    n = len(compute)
    params = np.asarray(params, dtype=float)
    zeros = np.zeros(n)
    cross = np.zeros(n + 1) if cross is None else np.asarray(cross, dtype=float)
    assert cross.shape == (n + 1,)
    return PipelineProfile(
        model="hand", op_names=np.array([f"op{i}" for i in range(n)], dtype=object),
        op_layers=np.array([""] * n, dtype=object), compute_s_prefix=_prefix(compute),
        param_bytes_prefix=_prefix(params), saved_bytes_prefix=_prefix(zeros if saved is None else saved),
        ckpt_bytes_prefix=_prefix(zeros if ckpt is None else ckpt),
        trainable_prefix=_prefix(params > 0 if trainable is None else trainable), cross_bytes=cross,
        max_layer_saved_bytes=float(max_layer), bytes_per_element=2, setup=setup)


# six ops used by the hand-computed cases
COMPUTE = [0.01, 0.01, 0.02, 0.04, 0.02, 0.02]  # seconds per micro-batch, forward + backward
PARAMS = [5e5, 1e6, 2e6, 0, 3e6, 1e6]  # fp16 parameter bytes
CROSS = [0, 3e6, 5e6, 300e6, 1e6, 5e5, 0]  # bytes crossing the cut at each pivot


# ---------------------------------------------------------------------------------------------- 1. L
def test_two_stage_by_hand_one_device_stage_and_stage_spanning_servers():
    prof = make_profile(COMPUTE, PARAMS, cross=CROSS)
    r = evaluate(prof, T4, np.array([[2]]))
    # stage compute: ops [0, 2) = 0.02 s, ops [2, 6) = 0.10 s; devices 4·(1/6, 5/6) = (0.67, 3.33) → (1, 3)
    assert r.devices.tolist() == [[1, 3]]
    assert r.device_cuts.tolist() == [[1]]
    t0, t1 = 0.02 / 1, 0.10 / 3
    # stage 0 = device 0 (server 0), stage 1 = devices 1..3 (servers 0 and 1): not one server → 25G-like
    a0 = 2 * 5e6 / NET
    ar0 = 0.0  # one device: no AllReduce
    ar1 = 2 * (3 - 1) / 3 * (2e6 + 0 + 3e6 + 1e6) / NET  # stage 1 spans servers → slowest link
    length = (t0 + t1) + a0 + (M - 1) * max(t0, t1, a0) + max(ar0, ar1)
    assert r.stage_time_s[0] == pytest.approx([t0, t1], rel=1e-12)
    assert r.transfer_s[0] == pytest.approx([a0], rel=1e-12)
    assert r.allreduce_s[0] == pytest.approx([ar0, ar1], rel=1e-12, abs=0)
    assert r.allreduce_s[0, 0] == 0.0
    assert r.length_s[0] == pytest.approx(length, rel=1e-12)
    assert length == pytest.approx(0.02 + 0.1 / 3 + 1e-3 + 0.1 + 8e-4, rel=1e-12)  # the numbers
    assert r.trainable_ops.tolist() == [[2, 3]]
    assert not r.oom[0]
    assert pipeline_length_s(prof, T4, [2]) == pytest.approx(length, rel=1e-12)


def test_three_stage_by_hand_nvlink_and_network_boundaries():
    prof = make_profile(COMPUTE, PARAMS, cross=CROSS)
    r = evaluate(prof, T4, np.array([[1, 3]]))
    # stage compute 0.01, 0.03, 0.08 → raw 4·(1/12, 3/12, 8/12) = (0.33, 1, 2.67)
    # → floor (0, 1, 2) → at least one each: (1, 1, 2)
    assert r.devices.tolist() == [[1, 1, 2]]
    assert r.device_cuts.tolist() == [[1, 2]]
    t = [0.01 / 1, 0.03 / 1, 0.08 / 2]
    a0 = 2 * 3e6 / NV  # stages 0 (device 0) and 1 (device 1) both in server 0: NVLink
    a1 = 2 * 300e6 / NET  # stage 1 (device 1) → stage 2 (devices 2, 3): crosses servers
    ar = [0.0, 0.0, 2 * (2 - 1) / 2 * (0 + 3e6 + 1e6) / NV]  # stage 2 inside server 1
    length = sum(t) + a0 + a1 + (M - 1) * max(max(t), a0, a1) + max(ar)
    assert a1 > max(t)  # the slow link, not a stage, sets the steady-state pace
    assert r.stage_time_s[0] == pytest.approx(t, rel=1e-12)
    assert r.transfer_s[0] == pytest.approx([a0, a1], rel=1e-12)
    assert r.allreduce_s[0] == pytest.approx(ar, rel=1e-12, abs=0)
    assert r.length_s[0] == pytest.approx(length, rel=1e-12)
    assert length == pytest.approx(0.08 + 6e-5 + 0.06 + 0.18 + 4e-5, rel=1e-12)
    assert r.trainable_ops.tolist() == [[1, 2, 2]]

    # a batch of cut sets gives each row what it gives alone
    rb = evaluate(prof, T4, np.array([[1, 3], [2, 4]]))
    assert rb.length_s[0] == pytest.approx(length, rel=1e-12)
    assert rb.length_s[1] == pytest.approx(pipeline_length_s(prof, T4, [2, 4]), rel=1e-12)

    # on a flat cluster every link is link_bw
    flat = Cluster("f4", 4, V100, 50e9)
    rf = evaluate(prof, flat, np.array([[1, 3]]))
    af = [2 * 3e6 / 50e9, 2 * 300e6 / 50e9]
    arf = 2 * (2 - 1) / 2 * 4e6 / 50e9
    assert rf.transfer_s[0] == pytest.approx(af, rel=1e-12)
    assert rf.length_s[0] == pytest.approx(sum(t) + sum(af) + (M - 1) * max(max(t), *af) + arf, rel=1e-12)


def test_one_stage_is_data_parallel_over_all_devices():
    prof = make_profile(COMPUTE, PARAMS, cross=CROSS)
    plan = solve_exact(prof, T4, candidate_pivots(prof, T4, 1))
    c, g = sum(COMPUTE), sum(PARAMS)
    # M micro-batches of C/4 each, then a ring AllReduce across both servers
    assert plan.cuts.tolist() == [] and plan.devices.tolist() == [4]
    assert plan.length_s == pytest.approx(M * c / 4 + 2 * 3 / 4 * g / NET, rel=1e-12)


# ----------------------------------------------------------------------------------------- 2. memory
MEM_COMPUTE = COMPUTE  # cut at 2 → devices (1, 3); K = 2 → in flight min(4, 2 - s) = (2, 1)
MEM_PARAMS = [0, 1 * GiB, 0, 0, 3 * GiB, 0]  # stage 0: 2^29 params, stage 1: 1.5 · 2^30 params


def _mem(saved, *, optimizer="adam", recompute=False, ckpt=None, max_layer=0.0):
    setup = PipelineSetup(micro_batch=2, num_micro_batches=4, optimizer=optimizer, recompute=recompute)
    prof = make_profile(MEM_COMPUTE, MEM_PARAMS, saved=saved, ckpt=ckpt, max_layer=max_layer, setup=setup)
    r = evaluate(prof, T4, np.array([[2]]))
    assert r.devices.tolist() == [[1, 3]]
    return r


def test_optimizer_bytes_per_param():
    assert BYTES_PER_PARAM == {"adam": 16.0, "adafactor": 8.0}


def test_memory_no_recompute_fits_and_oom():
    p0, p1 = 1 * GiB / 2, 3 * GiB / 2  # parameters = fp16 bytes / 2
    # fits: stage 0 = 16·P0 + 2·S0/1 = 8 + 20 = 28 GiB; stage 1 = 16·P1 + 1·S1/3 = 24 + 12/3 = 28 GiB
    r = _mem([0, 10 * GiB, 0, 0, 6 * GiB, 6 * GiB])
    assert r.memory_bytes[0] == pytest.approx([16 * p0 + 2 * 10 * GiB, 16 * p1 + 12 * GiB / 3], rel=1e-12)
    assert r.memory_bytes[0] == pytest.approx([28 * GiB, 28 * GiB], rel=1e-12)
    assert not r.oom[0]
    # OOM: S0 = 13 GiB → stage 0 = 8 + 26 = 34 GiB > 32 GiB
    r = _mem([0, 13 * GiB, 0, 0, 6 * GiB, 6 * GiB])
    assert r.memory_bytes[0] == pytest.approx([34 * GiB, 28 * GiB], rel=1e-12)
    assert r.oom[0]
    # the same model under Adafactor (8 B/param): 4 + 26 = 30 GiB and 12 + 4 = 16 GiB → fits
    r = _mem([0, 13 * GiB, 0, 0, 6 * GiB, 6 * GiB], optimizer="adafactor")
    assert r.memory_bytes[0] == pytest.approx([8 * p0 + 26 * GiB, 8 * p1 + 4 * GiB], rel=1e-12)
    assert r.memory_bytes[0] == pytest.approx([30 * GiB, 16 * GiB], rel=1e-12)
    assert not r.oom[0]


def test_memory_limit_is_hbm_gb_read_as_gib():
    # stage 0 = 8 + 2·12 = exactly 32 GiB (> 32e9 bytes): not over a 32 GiB device
    r = _mem([0, 12 * GiB, 0, 0, 0, 0])
    assert r.memory_bytes[0, 0] == 32 * GiB and r.memory_bytes[0, 0] > 32e9
    assert not r.oom[0]
    r = _mem([0, 12 * GiB + 1, 0, 0, 0, 0])  # two more bytes than 32 GiB
    assert r.memory_bytes[0, 0] == 32 * GiB + 2
    assert r.oom[0]


def test_memory_recompute_fits_and_oom():
    saved = [0, 13 * GiB, 0, 0, 6 * GiB, 6 * GiB]  # OOM without recomputation (above)
    ckpt = [0, 1 * GiB, 0, 0, 2 * GiB, 0]  # X0 = 1 GiB, X1 = 2 GiB
    # fits: stage 0 = 8 + 2·1/1 + 6/1 = 16 GiB; stage 1 = 24 + 1·2/3 + 6/3 = 26.67 GiB
    r = _mem(saved, recompute=True, ckpt=ckpt, max_layer=6 * GiB)
    assert r.memory_bytes[0] == pytest.approx([16 * GiB, (24 + 2 / 3 + 2) * GiB], rel=1e-12)
    assert not r.oom[0]
    # OOM: the largest layer saves 23 GiB → 8 + 2 + 23 = 33 GiB and 24 + 2/3 + 23/3 = 32.33 GiB
    r = _mem(saved, recompute=True, ckpt=ckpt, max_layer=23 * GiB)
    assert r.memory_bytes[0] == pytest.approx([33 * GiB, (24 + 2 / 3 + 23 / 3) * GiB], rel=1e-12)
    assert r.oom[0]
    # adafactor halves the parameter part: 4 + 2 + 23 = 29 GiB, 12 + 2/3 + 23/3 = 20.33 GiB → fits
    r = _mem(saved, optimizer="adafactor", recompute=True, ckpt=ckpt, max_layer=23 * GiB)
    assert r.memory_bytes[0] == pytest.approx([29 * GiB, (12 + 2 / 3 + 23 / 3) * GiB], rel=1e-12)
    assert not r.oom[0]


def test_in_flight_is_min_of_micro_batches_and_stages_left():
    # 3 stages, M = 2: in flight min(2, 3 - s) = (2, 2, 1); no parameters, 1 GiB saved per op
    setup = PipelineSetup(micro_batch=2, num_micro_batches=2)
    prof = make_profile([1.0] * 6, [0] * 6, saved=[GiB] * 6, trainable=[1] * 6, setup=setup)
    r = evaluate(prof, Cluster("f3", 3, V100, 50e9), np.array([[2, 4]]))
    assert r.devices.tolist() == [[1, 1, 1]]
    assert r.memory_bytes[0] == pytest.approx([2 * 2 * GiB, 2 * 2 * GiB, 1 * 2 * GiB], rel=1e-12)


# ------------------------------------------------------------------------------ 3. allocate_devices
@pytest.mark.parametrize("compute, d, expected", [
    ([1, 1, 1, 1], 8, [2, 2, 2, 2]),
    ([1, 2, 1], 8, [2, 4, 2]),
    ([5, 3, 2], 7, [4, 2, 1]),  # raw 3.5, 2.1, 1.4: the one left over goes to the largest remainder (.5)
    ([1, 1, 8], 4, [1, 1, 2]),  # raw .4, .4, 3.2: the small ones are lifted to 1, the big one pays
    ([1e-6, 3, 5], 8, [1, 3, 4]),  # tiny stage still gets one device; raw 3.0-, 5.0- → remainder to #1
    ([0, 0, 0, 0], 8, [2, 2, 2, 2]),  # no compute at all: an even split
    ([3], 5, [5]),
])
def test_allocate_devices_by_hand(compute, d, expected):
    got = allocate_devices(np.array(compute, dtype=float), d)
    assert got.shape == (1, len(compute))
    assert got[0].tolist() == expected


def test_allocate_devices_properties_random():
    rng = np.random.default_rng(3)
    c = rng.uniform(0.0, 1.0, (200, 5)) ** 3  # skewed: many tiny stages
    plain_rows = 0
    for devices in (5, 8, 16, 24, 32):
        d = allocate_devices(c, devices)
        assert d.shape == c.shape and d.dtype.kind == "i"
        assert (d.sum(axis=1) == devices).all()
        assert (d >= 1).all()
        raw = devices * c / c.sum(axis=1, keepdims=True)
        # rows where no stage was lifted to 1: plain largest remainder (each floor or ceil of raw,
        # and the ceilings go to the largest remainders)
        plain = (raw >= 1).all(axis=1)
        plain_rows += int(plain.sum())
        for row in np.flatnonzero(plain):
            fl = np.floor(raw[row])
            assert ((d[row] == fl) | (d[row] == fl + 1)).all()
            up = d[row] > fl
            frac = raw[row] - fl
            if up.any() and (~up).any():
                assert frac[up].min() >= frac[~up].max() - 1e-12
    assert plain_rows > 20
    # a batch row gives what it gives alone
    assert allocate_devices(c[:2], 8)[1].tolist() == allocate_devices(c[1], 8)[0].tolist()


def test_allocate_devices_too_many_stages():
    with pytest.raises(ValueError, match="stages"):
        allocate_devices(np.ones(5), 4)


# -------------------------------------------------------------------------- 4. profile_from_graph
# forward graph: 0 input → 1 linear → 2 gelu → 3 add(2, 1) → 4 add(3, 1) → 5 linear; op 1 feeds 2, 3, 4
OUT = [10, 100, 1000, 10000, 100000, 1000000]  # output bytes: powers of ten, so sums read off
IDS = [100, 101, 102, 103, 104, 105]  # ids unlike row numbers


def _tiny_graph(mbs=2) -> OpGraph:
    nodes = dict(
        id=IDS, kind=["input", "linear", "gelu", "add", "add", "linear"], layer=[-1, 0, 0, 1, 1, 1],
        gemm_b=[0, 1, 0, 0, 0, 1], gemm_m=[0, 64, 0, 0, 0, 64], gemm_n=[0, 128, 0, 0, 0, 32],
        gemm_k=[0, 32, 0, 0, 0, 128], flops=[0, 2 * 64 * 128 * 32, 4096, 512, 512, 2 * 64 * 32 * 128],
        vector_flops=[0, 0, 4096, 512, 512, 0], input_bytes=[0, 10, 100, 1100, 10100, 100000],
        output_bytes=OUT, weight_bytes=[0, 8192, 0, 0, 0, 8192], saved_bytes=[0, 10, 100, 0, 0, 100000])
    e = [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (1, 4), (4, 5)]
    edges = dict(src=[IDS[s] for s, _ in e], dst=[IDS[d] for _, d in e], bytes=[OUT[s] for s, _ in e],
                 arg=[0, 0, 0, 1, 0, 1, 0])
    fwd = OpGraph.from_columns(nodes, edges, dict(model="tiny", layers=["blk0", "blk1"], mbs=mbs,
                                                  bytes_per_element=2))
    return derive_backward(fwd)


def _roofline(nd, i) -> float:
    comp = (nd["flops"][i] - nd["vector_flops"][i]) / V100.peak_tensor_flops \
        + nd["vector_flops"][i] / V100.peak_vector_flops
    traffic = nd["input_bytes"][i] + nd["output_bytes"][i] + nd["weight_bytes"][i]
    return max(comp, traffic / V100.hbm_bw)


def test_gpu_op_time_is_the_v100_roofline():
    g = _tiny_graph()
    t = gpu_op_time_s(g.nodes, V100)
    assert t.shape == (g.num_nodes,)
    for i in range(g.num_nodes):
        assert t[i] == pytest.approx(_roofline(g.nodes, i), rel=1e-12, abs=0)
    # op 1 (64·128·32 GEMM, 2^19 flops) is compute-bound: 2^19 / 125e12 > (10 + 100 + 8192) / 900e9 ?
    assert t[1] == pytest.approx(max(2 * 64 * 128 * 32 / 125e12, 8302 / 900e9), rel=1e-12)


def test_cross_bytes_count_each_producer_once():
    prof = profile_from_graph(_tiny_graph(), V100, SETUP)
    assert prof.num_ops == 6
    # brute force from the forward edges: producers before p with a consumer at or after p
    e = [(0, 1), (1, 2), (2, 3), (1, 3), (3, 4), (1, 4), (4, 5)]
    brute = [sum(OUT[u] for u in range(p) if any(s == u and d >= p for s, d in e)) for p in range(7)]
    assert brute == [0, 10, 100, 1100, 10100, 100000, 0]
    assert prof.cross_bytes.tolist() == brute
    # op 1 has three consumers (2, 3, 4), two of them (3 and 4) beyond pivot 3: counted once there,
    # and the skip connection 1 → 4 is counted at pivots 2, 3 and 4 alike
    assert prof.cross_bytes[3] == OUT[1] + OUT[2]
    assert prof.cross_bytes[4] == OUT[1] + OUT[3]


def test_profile_compute_is_forward_plus_backward_roofline():
    g = _tiny_graph()
    nd = g.nodes
    n = 6
    assert nd["is_backward"].sum() > 0 and not nd["is_backward"][:n].any()
    t = gpu_op_time_s(nd, V100)
    per_op = np.zeros(n)
    for i in range(n):
        bwd = (nd["fwd_id"] == IDS[i]) & nd["is_backward"]
        per_op[i] = t[i] + t[bwd].sum()
    assert per_op[0] == t[0]  # the input has no gradient op
    assert (nd["fwd_id"][nd["is_backward"]] >= IDS[1]).all()  # every backward op has its owner
    prof = profile_from_graph(g, V100, SETUP)
    assert prof.compute_s_prefix == pytest.approx(_prefix(per_op), rel=1e-12)
    assert prof.compute_s_prefix[-1] == pytest.approx(t.sum(), rel=1e-12)  # all of forward + backward
    # with recomputation the forward runs twice
    rec = profile_from_graph(g, V100, PipelineSetup(micro_batch=2, num_micro_batches=4, recompute=True))
    assert rec.compute_s_prefix == pytest.approx(_prefix(per_op + t[:n]), rel=1e-12)
    assert rec.setup.recompute


def test_profile_other_prefixes():
    prof = profile_from_graph(_tiny_graph(), V100, SETUP)
    assert prof.param_bytes_prefix.tolist() == _prefix([0, 8192, 0, 0, 0, 8192]).tolist()
    assert prof.trainable_prefix.tolist() == [0, 0, 1, 1, 1, 1, 2]
    assert prof.saved_bytes_prefix.tolist() == _prefix([0, 10, 100, 0, 0, 100000]).tolist()
    # layer inputs: the cut in front of each layer's first op (ops 1 and 3)
    assert prof.ckpt_bytes_prefix.tolist() == _prefix([0, 10, 0, 1100, 0, 0]).tolist()
    assert prof.max_layer_saved_bytes == 100000.0  # blk0 saves 110, blk1 100000
    assert prof.op_layers.tolist() == ["", "blk0", "blk0", "blk1", "blk1", "blk1"]
    assert prof.op_names.tolist() == ["op100", "op101", "op102", "op103", "op104", "op105"]
    assert prof.bytes_per_element == 2 and prof.model == "tiny" and prof.setup == SETUP


def test_profile_rejects_wrong_micro_batch_and_backward_rows_first():
    with pytest.raises(ValueError, match="micro-batch"):
        profile_from_graph(_tiny_graph(mbs=8), V100, SETUP)
    g = _tiny_graph()
    perm = np.r_[g.num_nodes - 1, 0:g.num_nodes - 1]  # a backward row first
    shuffled = OpGraph({k: v[perm] for k, v in g.nodes.items()}, dict(g.edges), dict(g.meta))
    with pytest.raises(ValueError, match="forward ops must come first"):
        profile_from_graph(shuffled, V100, SETUP)


# ---------------------------------------------------------------------------------------- 5. pruning
@pytest.mark.parametrize("config, servers", [("A", 2), ("B", 3), ("C", 4)])
def test_centre_cuts_on_server_boundaries(config, servers):
    cuts = centre_device_cuts(v100_cluster(config), servers)
    assert cuts.tolist() == [8 * j for j in range(1, servers)]
    assert (cuts % 8 == 0).all()


def test_centre_cuts_fall_back_to_even_split():
    # 4 stages on 2 servers: the server rounding would give (0, 8, 16); an even split instead
    assert centre_device_cuts(v100_cluster("A"), 4).tolist() == [4, 8, 12]
    assert centre_device_cuts(v100_cluster("C"), 2).tolist() == [16]
    assert centre_device_cuts(Cluster("f", 10, V100, 1e9), 3).tolist() == [3, 7]  # flat: rint(10/3, 20/3)


def _brute_candidates(prof, cluster, k, radius):
    n, c, tv = prof.num_ops, prof.compute_s_prefix, prof.trainable_prefix
    centre = centre_device_cuts(cluster, k)
    out = []
    for j in range(1, k):
        out.append([p for p in range(1, n)
                    if (radius is None or abs(cluster.num_devices * c[p] / c[n] - centre[j - 1]) <= radius)
                    and tv[p] >= j and tv[n] - tv[p] >= k - j])
    return out


@pytest.mark.parametrize("config, k, radius", [("A", 2, 3), ("B", 3, 3), ("C", 4, 2), ("B", 3, 1),
                                               ("B", 3, 0), ("C", 4, None)])
def test_candidate_pivots_match_brute_force(config, k, radius):
    rng = np.random.default_rng(11)
    n = 24
    compute = rng.uniform(0.5, 1.5, n)  # every op computes: no two pivots collapse
    params = rng.uniform(1e6, 2e6, n)
    params[[0, 1, 2, n - 2, n - 1]] = 0  # the first 3 and the last 2 ops own no parameters
    prof = make_profile(compute, params, cross=np.r_[0, rng.uniform(1e3, 1e6, n - 1), 0])
    cluster = v100_cluster(config)
    cand = candidate_pivots(prof, cluster, k, radius=radius)
    brute = _brute_candidates(prof, cluster, k, radius)
    assert [c.tolist() for c in cand.per_cut] == brute
    assert cand.centre_device_cuts.tolist() == centre_device_cuts(cluster, k).tolist()
    assert cand.radius == (-1 if radius is None else radius)
    assert cand.all.tolist() == sorted(set(itertools.chain(*brute)))
    if radius is not None and radius >= 1:
        assert all(0 < len(b) < n - 1 for b in brute)  # the radius really prunes
    # every stage gets a trainable op: the first cut leaves ops 0..2 behind, the last leaves ops n-2, n-1
    assert all(p >= 4 for p in cand.per_cut[0])
    assert all(p <= n - 3 for p in cand.per_cut[-1])


def test_candidate_pivots_trainable_rule_by_hand():
    # trainable ops are 2 and 5 only: 2 stages need a pivot in [3, 5] (op 2 before it, op 5 after it);
    # 3 stages cannot each get a trainable op, so no pivot qualifies for either cut
    params = [0, 0, 1e6, 0, 0, 1e6, 0]
    prof = make_profile([1.0] * 7, params)
    assert candidate_pivots(prof, T4, 2, radius=None).per_cut[0].tolist() == [3, 4, 5]
    cand3 = candidate_pivots(prof, Cluster("f8", 8, V100, 1e9), 3, radius=None)
    assert [c.tolist() for c in cand3.per_cut] == [[], []]
    with pytest.raises(ValueError, match="no candidate pivot"):
        solve_exact(prof, Cluster("f8", 8, V100, 1e9), cand3)


def test_dominance_collapse_keeps_fewest_cross_bytes():
    # ops 4, 5 and 8 do nothing (no compute, parameters, saved or checkpointed bytes): pivots 4, 5, 6
    # have equal prefixes, and so have 8, 9
    compute = [1, 1, 1, 1, 0, 0, 1, 1, 0, 1, 1]
    params = [0, 1, 1, 1, 0, 0, 1, 1, 0, 1, 0]
    saved = [5, 5, 5, 5, 0, 0, 5, 5, 0, 5, 5]
    ckpt = [1, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0]
    cross = [0, 9, 9, 9, 500, 100, 300, 9, 70, 70, 9, 0]
    prof = make_profile(compute, params, saved=saved, ckpt=ckpt, cross=cross)
    cand = candidate_pivots(prof, T4, 2, radius=None)
    # all pivots 1..10 have a trainable op on each side except 1 (op 0 owns none) and 10 (op 10 none)
    # → 2..9; run {4, 5, 6} keeps 5 (100 bytes), run {8, 9} ties at 70 and keeps the earlier, 8
    assert cand.per_cut[0].tolist() == [2, 3, 5, 7, 8]
    # the collapse loses nothing: the best over the collapsed set is the best over every pivot
    lengths = {p: pipeline_length_s(prof, T4, [p]) for p in range(2, 10)}
    assert lengths[5] < lengths[4] and lengths[5] < lengths[6]
    plan = solve_exact(prof, T4, cand)
    assert plan.length_s == pytest.approx(min(lengths.values()), rel=1e-12)
    # a run shares its implied device position D·C(p)/C(n), so a radius window takes it whole
    c = prof.compute_s_prefix
    assert c[4] == c[5] == c[6] and c[8] == c[9]
    # radius 0 around the centre cut 2 (server boundary): position 4·C(p)/8 = 2 ↔ C(p) = 4 ↔ p in {4, 5, 6}
    assert candidate_pivots(prof, T4, 2, radius=0).per_cut[0].tolist() == [5]


# ------------------------------------------------------------------------------------ 6. solve_exact
def _random_profile(seed, n=12, saved_scale=1.0):
    rng = np.random.default_rng(seed)
    compute = rng.uniform(0.005, 0.02, n)
    params = rng.uniform(0.2, 1.0, n) * GiB
    saved = rng.uniform(0.5, 4.0, n) * GiB * saved_scale
    ckpt = rng.uniform(0.0, 0.2, n) * GiB
    zero = [5, 6]  # two do-nothing ops: a run {5, 6, 7} of equal prefixes to collapse
    compute[zero] = 0
    params[zero] = 0
    saved[zero] = 0
    ckpt[zero] = 0
    params[[0, n - 1]] = 0
    cross = np.r_[0, rng.uniform(1e6, 4e8, n - 1), 0]
    return make_profile(compute, params, saved=saved, ckpt=ckpt, cross=cross, max_layer=2 * GiB)


def _brute_force(prof, cluster, k):
    n, tv = prof.num_ops, prof.trainable_prefix
    rows = []
    for cuts in itertools.combinations(range(1, n), k - 1):
        b = (0, *cuts, n)
        if all(tv[b[i + 1]] - tv[b[i]] >= 1 for i in range(k)):
            rows.append(cuts)
    r = evaluate(prof, cluster, np.array(rows))
    return rows, r


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_solve_exact_equals_brute_force(seed):
    prof = _random_profile(seed)
    cand = candidate_pivots(prof, T4, 3, radius=None)
    plan = solve_exact(prof, T4, cand)
    rows, r = _brute_force(prof, T4, 3)
    feasible = ~r.oom
    # the case exercises the memory filter: some cut sets fit, some do not, and the fastest does not
    assert feasible.any() and (~feasible).any()
    assert r.oom[int(np.argmin(r.length_s))]
    best = int(np.argmin(np.where(feasible, r.length_s, np.inf)))
    assert not plan.oom and plan.feasible and plan.optimal
    assert plan.length_s == pytest.approx(float(r.length_s[best]), rel=1e-12)
    assert plan.cuts.tolist() == list(rows[best])
    rb = evaluate(prof, T4, plan.cuts[None, :])
    assert plan.devices.tolist() == rb.devices[0].tolist()
    assert plan.device_cuts.tolist() == rb.device_cuts[0].tolist()
    # evaluated: the increasing, trainable-valid pairs over the (collapsed) candidates
    n, tv = prof.num_ops, prof.trainable_prefix
    pairs = [(a, b) for a in cand.per_cut[0] for b in cand.per_cut[1]
             if a < b and tv[a] >= 1 and tv[b] - tv[a] >= 1 and tv[n] - tv[b] >= 1]
    assert plan.evaluated == len(pairs) < len(rows)  # the collapse of {5, 6, 7} dropped some


def test_solve_exact_small_chunks_give_the_same_plan():
    prof = _random_profile(1)
    cand = candidate_pivots(prof, T4, 3, radius=None)
    a, b = solve_exact(prof, T4, cand), solve_exact(prof, T4, cand, chunk=3)
    assert a.cuts.tolist() == b.cuts.tolist() and a.length_s == b.length_s and a.evaluated == b.evaluated


def test_solve_exact_all_oom_is_reported_infeasible():
    prof = _random_profile(0, saved_scale=20.0)  # ≥ 10 GiB saved per op: nothing fits 32 GiB
    cand = candidate_pivots(prof, T4, 3, radius=None)
    plan = solve_exact(prof, T4, cand)
    rows, r = _brute_force(prof, T4, 3)
    assert r.oom.all()
    assert plan.oom and not plan.feasible
    # the shortest of the infeasible cut sets is what is reported
    assert plan.length_s == pytest.approx(float(r.length_s.min()), rel=1e-12)
    assert plan.cuts.tolist() == list(rows[int(np.argmin(r.length_s))])


def test_solve_exact_with_radius_is_best_over_the_window():
    prof = _random_profile(2, n=12)
    cluster = Cluster("t8", 8, V100, NV, "servers", 4, NET)  # centre cut: device 4
    cand = candidate_pivots(prof, cluster, 2, radius=1)
    plan = solve_exact(prof, cluster, cand)
    # brute force over every pivot in the window (no collapse), trainable on both sides
    c, tv, n = prof.compute_s_prefix, prof.trainable_prefix, prof.num_ops
    window = [p for p in range(1, n) if abs(8 * c[p] / c[n] - 4) <= 1 and tv[p] >= 1 and tv[n] - tv[p] >= 1]
    assert 1 < len(window) < n - 1
    r = evaluate(prof, cluster, np.array(window)[:, None])
    assert r.oom.any() and not r.oom.all()
    best = int(np.argmin(np.where(r.oom, np.inf, r.length_s)))
    assert plan.cuts.tolist() == [window[best]] and not plan.oom
    assert plan.length_s == pytest.approx(float(r.length_s[best]), rel=1e-12)


# ------------------------------------------------------------------------------------ 7. bad input
def test_setup_rejects_unknown_optimizer():
    with pytest.raises(ValueError, match="optimizer"):
        PipelineSetup(optimizer="sgd")


@pytest.mark.parametrize("field, value", [("micro_batch", 0), ("num_micro_batches", -1),
                                          ("micro_batch", 2.0)])
def test_setup_rejects_bad_counts(field, value):
    with pytest.raises(ValueError, match=field):
        PipelineSetup(**{field: value})


@pytest.mark.parametrize("cuts, match", [([[3, 2]], "increasing"), ([[2, 2]], "increasing"),
                                         ([[0, 3]], "pivots must lie"), ([[2, 6]], "pivots must lie")])
def test_evaluate_rejects_bad_cuts(cuts, match):
    prof = make_profile(COMPUTE, PARAMS, cross=CROSS)
    with pytest.raises(ValueError, match=match):
        evaluate(prof, T4, np.array(cuts))


def test_evaluate_and_candidates_reject_bad_cluster_or_stages():
    prof = make_profile(COMPUTE, PARAMS, cross=CROSS)
    with pytest.raises(ValueError, match="servers"):
        evaluate(prof, Cluster("r", 4, V100, 1e9, "uni-ring"), np.array([[2]]))
    with pytest.raises(ValueError, match="stages"):
        candidate_pivots(prof, T4, 5)
    with pytest.raises(ValueError, match="radius"):
        candidate_pivots(prof, T4, 2, radius=-1)
    with pytest.raises(ValueError, match="stages"):
        candidate_pivots(prof, Cluster("f", 16, V100, 1e9), 7)  # more stages than the 6 ops
