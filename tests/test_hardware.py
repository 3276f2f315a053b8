"""Accelerator template, area model, search-space enumeration and presets."""

import itertools
import json

import numpy as np
import pytest

from archplace.hardware import Accelerator
from archplace.hardware import constants as C
from archplace.hardware.accelerator import glb_bw_words, l2_tc_kb, l2_vc_kb
from archplace.hardware.area import accelerator_area_mm2, area_breakdown_mm2, area_mm2
from archplace.hardware.presets import TPUV4, mcm_package, preset_accelerator, preset_cluster, v100_cluster
from archplace.hardware.space import enumerate_space, load_space_config


def test_derived_sizes_follow_the_phaze_formulas():
    assert l2_tc_kb(256, 256) == 1024  # 1 MB at 256x256
    assert l2_tc_kb(128, 128) == 256
    assert l2_tc_kb(2, 2) == 1  # floor of 1 KB
    assert l2_vc_kb(256) == 4 and l2_vc_kb(2) == 1  # vector L2 within [1, 4] KB
    assert glb_bw_words(1, 128, 128) == 2048  # 16·max(pe_x, pe_y) for one core
    assert glb_bw_words(8, 128, 128) == 4096  # capped
    assert glb_bw_words(1, 2, 2) == 32
    assert TPUV4.glb_bw == 4096 and TPUV4.l2_tc_kb == 256 and TPUV4.l2_vc_kb == 2
    assert TPUV4.peak_flops == pytest.approx(2 * 8 * 128 * 128 * 1.05e9)  # 275 TFLOP/s


@pytest.mark.parametrize("fields, match", [
    (dict(num_tc=3), "'num_tc' must be a power of two, got 3"),
    (dict(num_vc=0), "'num_vc' must be a positive integer"),
    (dict(pe_vc=64), "'pe_vc' \\(64\\) must equal 'pe_x' \\(128\\)"),
    (dict(glb_mb=-1), "'glb_mb' must be a positive number"),
    (dict(hbm_bw=float("nan")), "'hbm_bw' must be a positive number"),
    (dict(bytes_per_element=3), "'bytes_per_element' must be 1, 2 or 4"),
    (dict(pe_y=True), "'pe_y' must be a positive integer"),
    (dict(l2_tc_kb=-2), "'l2_tc_kb' must be >= 0"),
])
def test_bad_accelerators_name_the_field(fields, match):
    base = dict(num_tc=8, num_vc=2, pe_x=128, pe_y=128, pe_vc=128, glb_mb=128)
    with pytest.raises(ValueError, match=match):
        Accelerator(**{**base, **fields})


def test_json_round_trip_and_file_errors(tmp_path):
    acc = Accelerator(4, 1024, 256, 64, 256, 8, hbm_gb=64, name="phaze-llama")
    path = acc.to_json(tmp_path / "a.json")
    assert Accelerator.from_json(path) == acc
    assert Accelerator.from_dict({"num_tc": 4, "num_vc": 1024, "pe_x": 256, "pe_y": 64,
                                  "glb_mb": 8}).pe_vc == 256
    (tmp_path / "bad.json").write_text(json.dumps({"num_tc": 4, "pe_x": 8, "pe_y": 8, "glb_mb": 8}))
    with pytest.raises(ValueError, match="field 'num_vc' is missing"):
        Accelerator.from_json(tmp_path / "bad.json")
    (tmp_path / "typo.json").write_text(json.dumps({**acc.to_dict(), "num_cores": 2}))
    with pytest.raises(ValueError, match=r"unknown accelerator field\(s\) \['num_cores'\]"):
        Accelerator.from_json(tmp_path / "typo.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        Accelerator.from_json(tmp_path / "broken.json")
    with pytest.raises(ValueError, match="does not exist"):
        Accelerator.from_json(tmp_path / "nope.json")


def test_area_is_the_sum_of_its_parts():
    parts = area_breakdown_mm2(TPUV4)
    assert sum(parts.values()) == pytest.approx(accelerator_area_mm2(TPUV4))
    # doubling the tensor cores adds exactly one set of cores
    bigger = TPUV4.with_(num_tc=16)
    per_core = (parts["tensor_macs"] / 8 + TPUV4.l2_tc_kb * 1024 * C.SRAM_UM2_PER_BYTE / 1e6
                + C.CORE_CONTROL_AREA_UM2 / 1e6)
    assert accelerator_area_mm2(bigger) - accelerator_area_mm2(TPUV4) == pytest.approx(8 * per_core, rel=1e-4)
    assert area_mm2([1, 2], [1, 1], [8, 8], [8, 8], [2, 2]).shape == (2,)


def test_enumeration_matches_brute_force_and_the_constraint():
    space = enumerate_space()
    amax = accelerator_area_mm2(TPUV4)
    assert space.area_max_mm2 == pytest.approx(amax)
    # brute force over the same grid, one architecture at a time
    feasible = set()
    for tc, vc, px, py, glb in itertools.product([2**i for i in range(13)], [2**i for i in range(13)],
                                                 [2**i for i in range(1, 9)], [2**i for i in range(1, 9)],
                                                 [2**i for i in range(1, 8)]):
        a = float(area_mm2(tc, vc, px, py, glb))
        if a <= amax * (1 + 1e-12) and (a >= 0.3 * amax or tc == 1 or vc == 1):
            feasible.add((tc, vc, px, py, glb))
    got = set(zip(space.num_tc.tolist(), space.num_vc.tolist(), space.pe_x.tolist(),
                  space.pe_y.tolist(), space.glb_mb.astype(int).tolist()))
    assert got == feasible and len(space) == len(feasible)
    # sorted by decreasing area, TPUv4 first (the largest feasible area)
    assert np.all(np.diff(space.area_mm2) <= 0)
    assert space.accelerator(0) == Accelerator(8, 2, 128, 128, 128, 128)
    assert (space.area_mm2 <= amax * (1 + 1e-12)).all()
    low = space.area_mm2 < 0.3 * amax
    assert ((space.num_tc[low] == 1) | (space.num_vc[low] == 1)).all()
    assert (space.pe_vc == space.pe_x).all()


@pytest.mark.parametrize("compute, glb", [((4, 256, 256, 256, 256), 4), ((2, 512, 256, 256, 256), 32),
                                          ((1, 1024, 256, 256, 256), 8), ((4, 1024, 256, 64, 256), 8)])
def test_phaze_reported_architectures_are_feasible(compute, glb):
    """Phaze's winners (paper Table 2) lie inside the TPUv4 area, as the paper found them."""
    enumerate_space().index_of(Accelerator(*compute, glb))


def test_space_yaml_errors(tmp_path):
    bad = tmp_path / "s.yaml"
    bad.write_text("architecture:\n  num_tc: {pow2: [0, 3]}\n")
    with pytest.raises(ValueError, match="field 'architecture.num_vc' is missing"):
        load_space_config(bad)
    bad.write_text("architecture:\n  num_tc: {pow2: [3, 1]}\n  num_vc: [1]\n  pe_x: [2]\n"
                   "  pe_y: [2]\n  glb_mb: [2]\n")
    with pytest.raises(ValueError, match="architecture.num_tc: 'pow2' needs"):
        load_space_config(bad)
    bad.write_text("architecture:\n  num_tc: [1]\n  num_vc: [1]\n  pe_x: [2]\n  pe_y: [2]\n"
                   "  glb_mb: [-2]\n")
    with pytest.raises(ValueError, match="architecture.glb_mb: must be"):
        load_space_config(bad)
    small = tmp_path / "small.yaml"
    small.write_text("architecture:\n  num_tc: [1, 8]\n  num_vc: [2]\n  pe_x: [128]\n  pe_y: [128]\n"
                     "  glb_mb: [64, 128]\nconstraints:\n  area_max_preset: tpuv4\n")
    s = enumerate_space(small)
    assert len(s) == 4 and s.accelerator(0).label().startswith("{8,2,128,128,128} glb128")
    cfg = load_space_config()
    assert cfg["training"] == {"hbm_gb": [32, 64, 80], "microbatch": [1, 2, 4, 8], "recompute": [False, True]}


def test_presets():
    assert preset_accelerator("tpuv4") is TPUV4 and TPUV4.hbm_gb == 32
    pc = preset_accelerator("phaze-common")  # paper Table 2 / Section 6.1
    assert (pc.num_tc, pc.num_vc, pc.pe_x, pc.pe_y, pc.pe_vc, pc.glb_mb, pc.glb_bw, pc.hbm_gb) == \
        (2, 512, 256, 256, 256, 32.0, 4096, 64.0)
    assert pc.num_tc * pc.pe_x * pc.pe_y == TPUV4.num_tc * TPUV4.pe_x * TPUV4.pe_y == 131_072  # equal MACs
    with pytest.raises(ValueError, match="unknown accelerator preset 'tpu9'"):
        preset_accelerator("tpu9")
    for cfg, servers in (("A", 2), ("B", 3), ("C", 4)):
        c = v100_cluster(cfg)
        assert c.num_devices == 8 * servers and c.num_servers == servers
        assert c.inter_server_bw == pytest.approx(25e9 / 8)  # 25 Gbps
        assert c.link_bw > 40 * c.inter_server_bw  # NVLink inside a server
    m = mcm_package()
    assert m.num_devices == 36 and m.topology == "uni-ring"
    assert 10 <= m.device.glb_mb <= 99 and 10e9 <= m.link_bw <= 99e9  # "tens of MB", "tens of GB/s"
    flat = preset_cluster("flat")
    assert flat.num_devices == 1024 and flat.link_bw == 4 * 1024**3
    assert preset_cluster("flat-64").num_devices == 64
    with pytest.raises(ValueError, match="unknown cluster preset"):
        preset_cluster("dgx")
    with pytest.raises(ValueError, match="v100-server config must be one of"):
        preset_cluster("v100-server-D")
