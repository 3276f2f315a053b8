"""Analytical operator latency: closed forms on hand-made ops, physical floors on every preset."""

import numpy as np
import pytest

from archplace.hardware import Accelerator
from archplace.hardware import constants as C
from archplace.hardware.presets import TPUV4
from archplace.hardware.space import enumerate_space
from archplace.simulators.estimate import estimate_graph
from archplace.simulators.latency import ArchArrays, estimate_latencies, gemm_core_split
from archplace.workloads import OpGraph
from archplace.workloads.models import PRESETS, build_graph
from archplace.workloads.ops import moved_bytes

LAUNCH = C.OP_LAUNCH_CYCLES


def one_op(core, b=0, m=0, n=0, k=0, vflops=0.0, in_b=0, out_b=0, w_b=0, kind=None, meta=None):
    kind = kind or {"tensor": "matmul", "vector": "gelu", "fused": "linear", "comm": "allreduce",
                    "none": "view"}[core]
    flops = 2.0 * b * m * n * k + vflops
    g = OpGraph.from_columns(dict(id=[0], kind=[kind], core=[core], gemm_b=[b], gemm_m=[m], gemm_n=[n],
                                  gemm_k=[k], flops=[flops], vector_flops=[vflops], input_bytes=[in_b],
                                  output_bytes=[out_b], weight_bytes=[w_b]), meta=meta or {})
    return g


def lat(g, acc, **kw):
    t = estimate_latencies(g, [acc], **kw)
    single, every = t.for_arch(0)
    return single[0] * acc.clock_hz, every[0] * acc.clock_hz  # in cycles


def test_gemm_closed_form_on_one_core():
    acc = Accelerator(1, 1, 16, 16, 16, 128, hbm_bw=1e15)  # fast HBM: compute-bound
    g = one_op("tensor", b=1, m=1024, n=64, k=32, in_b=1024 * 32 * 2, out_b=1024 * 64 * 2)
    single, _ = lat(g, acc)
    tiles = (32 // 16) * (64 // 16)
    assert single == pytest.approx(tiles * 1024 + (16 + 16 - 1) + LAUNCH)


def test_partial_tiles_are_underutilised():
    acc = Accelerator(1, 1, 128, 128, 128, 128, hbm_bw=1e15)
    full = lat(one_op("tensor", b=1, m=4096, n=128, k=128), acc)[0]
    over = lat(one_op("tensor", b=1, m=4096, n=129, k=128), acc)[0]
    fill = 128 + 128 - 1
    assert over - LAUNCH - fill == pytest.approx(2 * (full - LAUNCH - fill))  # an extra column: a whole tile


def test_all_cores_divide_batch_rows_or_columns():
    acc = Accelerator(8, 8, 32, 32, 32, 128, hbm_bw=1e15)
    g = one_op("tensor", b=1, m=2048, n=256, k=256)  # 64 tiles over 8 cores
    single, every = lat(g, acc)
    fill = 32 + 32 - 1
    assert (single - LAUNCH - fill) == pytest.approx(8 * (every - LAUNCH - fill))
    g = one_op("tensor", b=1, m=2048, n=32, k=32)  # one tile: rows split 8 ways
    single, every = lat(g, acc)
    assert every - LAUNCH == pytest.approx(2048 / 8 + 32 + 32 - 1)
    g = one_op("tensor", b=1, m=1, n=64, k=256)  # a GEMV: 2 column tiles for 8 cores, K is not split
    single, every = lat(g, acc)
    assert single - LAUNCH - fill == pytest.approx(8 * 2 * 32)  # 16 tiles of max(1, pe_x) cycles
    assert every - LAUNCH - fill == pytest.approx(8 * 1 * 32)  # one column tile per core: 2 cores busy
    assert gemm_core_split(acc, 1, 1, 64, 256) == "N" and gemm_core_split(acc, 8, 512, 64, 256) == "B"
    assert gemm_core_split(acc, 1, 2048, 32, 32) == "M"


def test_vector_and_fused_ops():
    acc = Accelerator(2, 4, 64, 64, 64, 128, hbm_bw=1e15)
    single, every = lat(one_op("vector", vflops=64 * 1000), acc)
    assert single == pytest.approx(1000 + C.VECTOR_PIPELINE_CYCLES + LAUNCH)
    assert every == pytest.approx(250 + C.VECTOR_PIPELINE_CYCLES + LAUNCH)
    # fused: GEMM and its vector part pipelined on min(num_tc, num_vc) = 2 pairs
    g = one_op("fused", b=1, m=512, n=64, k=64, vflops=512 * 64)
    single, every = lat(g, acc)
    gemm1 = 512 + (64 + 64 - 1)
    vec1 = 512 * 64 / 64 + C.VECTOR_PIPELINE_CYCLES
    assert single == pytest.approx(max(gemm1, vec1) + C.VECTOR_PIPELINE_CYCLES + LAUNCH)


def test_memory_bound_ops_take_hbm_time():
    acc = Accelerator(8, 8, 128, 128, 128, 128, hbm_bw=1e9)  # slow HBM
    g = one_op("vector", vflops=1e3, in_b=10**6, out_b=10**6)
    single, every = lat(g, acc)
    assert single / acc.clock_hz == pytest.approx(2e6 / 1e9 + LAUNCH / acc.clock_hz)


def test_allreduce_is_a_ring():
    bytes_ = 8 * 2**20
    g = one_op("comm", in_b=bytes_, out_b=bytes_, vflops=bytes_ / 2 * 3 / 4, meta={"tmp": 4})
    acc = TPUV4
    t = estimate_latencies(g, [acc], link_bw=4 * 1024**3)
    single = t.for_arch(0)[0][0]
    ring = 2 * 3 / 4 * bytes_ / (4 * 1024**3)
    reduce_s = (np.ceil(bytes_ / 2 * 3 / 4 / 128) + C.VECTOR_PIPELINE_CYCLES) / acc.clock_hz
    assert single == pytest.approx(ring + reduce_s + LAUNCH / acc.clock_hz)


def test_shape_ops_are_free():
    assert lat(one_op("none", in_b=100, out_b=100), TPUV4) == (0.0, 0.0)


def _spread_of_architectures(n=24):
    space = enumerate_space()
    idx = np.linspace(0, len(space) - 1, n).astype(int)
    return [TPUV4] + [space.accelerator(i) for i in idx]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_physical_floor_on_every_op_of_every_preset(name):
    """No latency below flops / peak rate of the cores used, nor below bytes / HBM bandwidth."""
    tmp = max(PRESETS[name].tmp_widths)
    g = build_graph(name, seq=min(PRESETS[name].seq_len, 1024), mbs=2, tmp=tmp)
    nd = g.nodes
    archs = _spread_of_architectures()
    table = estimate_latencies(g, ArchArrays.from_accelerators(archs))
    moved = moved_bytes(nd)  # an embedding lookup moves its ids and rows, not its table
    real = nd["core"] != "none"
    gemm_flops = 2.0 * nd["gemm_b"] * nd["gemm_m"] * nd["gemm_n"] * nd["gemm_k"]
    for i, acc in enumerate(archs):
        single, every = table.for_arch(i)
        one_tc = 2 * acc.pe_x * acc.pe_y * acc.clock_hz
        one_vc = acc.pe_vc * acc.clock_hz
        all_tc, all_vc = acc.num_tc * one_tc, acc.num_vc * one_vc
        tol = 1 - 1e-9
        assert (single[real] >= tol * moved[real] / acc.hbm_bw).all()
        assert (every[real] >= tol * moved[real] / acc.hbm_bw).all()
        assert (single >= tol * gemm_flops / one_tc).all()
        assert (every >= tol * gemm_flops / all_tc).all()
        assert (single >= tol * nd["vector_flops"] / one_vc).all()
        assert (every >= tol * nd["vector_flops"] / all_vc).all()
        assert (single >= tol * nd["flops"] / (one_tc + one_vc)).all()
        assert (every >= tol * nd["flops"] / (all_tc + all_vc)).all()
        assert np.isfinite(single).all() and np.isfinite(every).all()


def test_vectorised_equals_one_architecture_at_a_time():
    g = build_graph("bert-base", seq=128, mbs=2, tmp=2)
    archs = _spread_of_architectures(8)
    together = estimate_latencies(g, archs)
    for i, acc in enumerate(archs):
        alone = estimate_graph(g, acc)
        assert np.allclose(together.for_arch(i)[0], alone.single_s, rtol=1e-12)
        assert np.allclose(together.for_arch(i)[1], alone.all_s, rtol=1e-12)


def test_more_cores_help_big_layers():
    g = build_graph("bert-large", seq=512, mbs=4)
    one = estimate_graph(g, TPUV4.with_(num_tc=1)).all_s.sum()
    eight = estimate_graph(g, TPUV4).all_s.sum()
    assert eight < one


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend 'sunstone' unknown"):
        estimate_graph(one_op("none"), TPUV4, backend="sunstone")


def test_from_space_equals_building_each_accelerator():
    space = enumerate_space()
    idx = np.linspace(0, len(space) - 1, 40).astype(int)
    whole = ArchArrays.from_space(space)
    each = ArchArrays.from_accelerators([space.accelerator(i) for i in idx])
    for f in ("num_tc", "num_vc", "pe_x", "pe_y", "pe_vc", "glb_bytes", "glb_bw", "hbm_bw", "clock_hz"):
        assert np.array_equal(getattr(whole, f)[idx], getattr(each, f)), f
