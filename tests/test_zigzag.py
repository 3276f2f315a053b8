"""The ZigZag backend: GEMM latencies against the ideal compute bound, scaling, the all-cores case and the
on-disk cache. Needs the optional ``zigzag-dse`` (``archplace[zigzag]``); skipped without it."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("zigzag", reason="needs archplace[zigzag]")

from archplace.hardware.accelerator import Accelerator  # noqa: E402
from archplace.simulators import zigzag_backend as zb  # noqa: E402


def _acc(num_tc: int, pe: int, glb_mb: float = 8.0) -> Accelerator:
    return Accelerator(num_tc=num_tc, num_vc=1, pe_x=pe, pe_y=pe, pe_vc=pe, glb_mb=glb_mb)


def _ideal(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool) -> float:
    return b * m * n * k / (acc.pe_x * acc.pe_y * (acc.num_tc if all_cores else 1))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One cache for the module, so a GEMM used by two tests runs ZigZag once."""
    return tmp_path_factory.mktemp("zigzag_cache")


@pytest.mark.parametrize(("num_tc", "pe", "gemm", "all_cores"), [
    (1, 16, (1, 256, 256, 256), False),
    (1, 32, (4, 256, 128, 512), False),
    (4, 32, (1, 512, 512, 512), True),
    (1, 128, (1, 1024, 512, 1024), False),
    (4, 128, (1, 1024, 512, 1024), True),
])
def test_cycles_between_ideal_and_20x(cache, num_tc, pe, gemm, all_cores):
    acc = _acc(num_tc, pe)
    cycles = zb.zigzag_gemm_cycles(acc, *gemm, all_cores=all_cores, cache_dir=cache)
    ideal = _ideal(acc, *gemm, all_cores)
    assert ideal <= cycles <= 20 * ideal, (cycles, ideal)
    # These GEMMs are compute-bound on these arrays: ZigZag's best mapping keeps the array busy.
    assert cycles <= 1.25 * ideal, (cycles, ideal)
    assert zb.zigzag_gemm_latency_s(acc, *gemm, all_cores=all_cores, cache_dir=cache) == pytest.approx(
        cycles / acc.clock_hz)


def test_doubling_m_doubles_cycles(cache):
    acc = _acc(1, 16)
    one = zb.zigzag_gemm_cycles(acc, 1, 256, 256, 256, cache_dir=cache)
    two = zb.zigzag_gemm_cycles(acc, 1, 512, 256, 256, cache_dir=cache)
    assert 1.6 <= two / one <= 2.4, (one, two)


def test_doubling_m_doubles_cycles_on_a_128x128_core(cache):
    acc = _acc(1, 128)
    one = zb.zigzag_gemm_cycles(acc, 1, 512, 512, 1024, cache_dir=cache)
    two = zb.zigzag_gemm_cycles(acc, 1, 1024, 512, 1024, cache_dir=cache)
    assert 1.6 <= two / one <= 2.4, (one, two)


def test_all_cores_faster_than_one(cache):
    acc = _acc(4, 32)
    gemm = (1, 512, 512, 512)
    single = zb.zigzag_gemm_cycles(acc, *gemm, cache_dir=cache)
    spread = zb.zigzag_gemm_cycles(acc, *gemm, all_cores=True, cache_dir=cache)
    assert spread < single
    assert single / spread >= 3.0, (single, spread)  # four cores, a compute-bound GEMM
    # The cores divide the batch when it fills them, else the rows or the output columns, whichever
    # leaves fewer cycles per core (the analytical model's choice): a GEMV can only divide N.
    assert zb.core_dim(acc, 8, 512, 256, 256) == "B" and zb.core_dim(acc, 1, 512, 256, 256) == "M"
    assert zb.core_dim(acc, 1, 1, 256, 256) == "N"
    batched = zb.zigzag_gemm_cycles(acc, 8, 128, 256, 256, all_cores=True, cache_dir=cache)
    assert _ideal(acc, 8, 128, 256, 256, True) <= batched <= 1.25 * _ideal(acc, 8, 128, 256, 256, True)


def test_small_gemm_underuses_the_array(cache):
    """A GEMM narrower than the array cannot beat the full-array bound and pays for the idle columns."""
    acc = _acc(1, 32)
    narrow = zb.zigzag_gemm_cycles(acc, 1, 512, 16, 512, cache_dir=cache)  # n = 16 of 32 columns
    assert narrow >= 2 * _ideal(acc, 1, 512, 16, 512, False) * 0.95


def test_cache_hit_does_not_run_zigzag(tmp_path, monkeypatch):
    acc, gemm = _acc(1, 16), (1, 256, 256, 256)
    first = zb.zigzag_gemm_cycles(acc, *gemm, cache_dir=tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    assert json.loads(files[0].read_text())["cycles"] == first

    def boom(*args, **kwargs):
        raise AssertionError("ZigZag ran on a cache hit")

    monkeypatch.setattr(zb, "_run_zigzag", boom)
    assert zb.zigzag_gemm_cycles(acc, *gemm, cache_dir=tmp_path) == first
    # The single-core estimate does not depend on the core count: same key, still a hit.
    assert zb.zigzag_gemm_cycles(_acc(4, 16), *gemm, cache_dir=tmp_path) == first
    # Any parameter of the key that changes misses the cache.
    misses = [(acc, (1, 256, 256, 512), False), (_acc(1, 16, glb_mb=4.0), gemm, False),
              (acc.with_(l2_tc_kb=8.0), gemm, False), (acc.with_(hbm_bw=6e11), gemm, False),
              (acc.with_(bytes_per_element=1), gemm, False), (_acc(4, 16), gemm, True)]
    for acc2, gemm2, all_cores in misses:
        with pytest.raises(AssertionError, match="cache hit"):
            zb.zigzag_gemm_cycles(acc2, *gemm2, all_cores=all_cores, cache_dir=tmp_path)
    # The environment variable picks the default cache directory.
    monkeypatch.setenv(zb.ENV_CACHE_DIR, str(tmp_path))
    assert zb.default_cache_dir() == tmp_path
    assert zb.zigzag_gemm_cycles(acc, *gemm) == first


def test_cache_key_contents():
    acc = _acc(4, 32)
    single, spread = zb.cache_key(acc, 2, 64, 32, 16), zb.cache_key(acc, 2, 64, 32, 16, all_cores=True)
    assert single["gemm_bmnk"] == [2, 64, 32, 16] and single["num_tc"] == 1 and spread["num_tc"] == 4
    assert single["glb_bw_words"] == 16 * 32 and spread["glb_bw_words"] == acc.glb_bw
    assert spread["hbm_bytes_per_cycle"] == pytest.approx(acc.hbm_bw / acc.clock_hz, rel=1e-6)
    with pytest.raises(ValueError, match="'m'"):
        zb.cache_key(acc, 1, 0, 16, 16)


def test_hardware_description_follows_the_accelerator():
    acc = _acc(4, 32, glb_mb=2.0)
    hw = zb.hardware_description(acc, all_cores=True)
    assert hw["operational_array"]["sizes"] == [32, 32, 4]
    mems = hw["memories"]
    assert mems["l2"]["size"] == int(acc.l2_tc_kb * 1024 * 8)
    assert mems["l2"]["served_dimensions"] == ["D1", "D2"]
    assert mems["glb"]["size"] == 2 * 2**20 * 8 and mems["glb"]["served_dimensions"] == ["D1", "D2", "D3"]
    assert mems["glb"]["ports"][0]["bandwidth_max"] == acc.glb_bw * 16
    assert mems["hbm"]["ports"][0]["bandwidth_max"] == int(acc.hbm_bw / acc.clock_hz * 8)
    assert zb.hardware_description(acc)["operational_array"]["sizes"] == [32, 32]


def test_missing_zigzag_raises_import_error(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n == "zigzag" or n.startswith("zigzag.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "zigzag", None)
    with pytest.raises(ImportError, match=r"pip install archplace\[zigzag\]"):
        zb.zigzag_gemm_cycles(_acc(1, 16), 1, 64, 64, 64, cache_dir=tmp_path)


def test_import_is_lazy_and_ray_free():
    code = ("import sys, archplace.simulators.zigzag_backend; "
            "print(sorted(m for m in ('ray', 'zigzag') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
