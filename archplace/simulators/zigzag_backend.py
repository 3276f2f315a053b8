"""Latency of tensor-core GEMMs from ZigZag (KU Leuven), to validate archplace's analytical cost model.

ZigZag (https://github.com/KULeuven-MICAS/zigzag, package ``zigzag-dse``) takes a hardware description
(an operational array plus a memory hierarchy), one workload layer and a partial mapping. Its LOMA
engine (loop-order-based memory allocation) searches the temporal mapping, and its cost model gives the
latency of the best mapping in cycles. This module writes one archplace :class:`Accelerator` as a
ZigZag YAML file (in a temporary directory) and asks for one GEMM ``(b×m×k)·(b×k×n)`` at a time, either
on one tensor core or spread over all ``num_tc`` of them (Phaze's ``ℓ_i`` and ``ℓ̂_i`` estimates).

How the Phaze template maps to ZigZag
-------------------------------------
Operational array
    ``D1 = pe_x`` × ``D2 = pe_y`` MACs, both declared *systolic*, so ZigZag adds the drain of the
    array (one cycle per used unit along each of them). With ``all_cores=True`` a third dimension
    ``D3 = num_tc`` stands for the tensor cores, so one spatial unrolling spans every core; it is not
    systolic, cores do not pass operands to each other.
Workload
    ``O[b][m][n] += I[b][m][k] * W[b][k][n]`` (ZigZag operator type ``Gemm``): ``I`` is the streaming
    left operand, ``W`` the right operand held in the array. Inputs and weights have
    ``8·bytes_per_element`` bits; partial sums have 32 bits (at least the element width) and the final
    outputs are written back with ``8·bytes_per_element`` bits.
Spatial mapping (fixed, weight-stationary as in a TPU)
    the reduction dimension ``K`` over ``D1`` (``pe_x``, reduced spatially down the columns), the
    output columns ``N`` over ``D2`` (``pe_y``), and with ``all_cores`` the cores over the batch ``B``,
    the rows ``M`` or the output columns ``N``, the split the analytical ℓ̂ takes
    (``latency.gemm_core_split``: the fewest cycles per core; never ``K``). ZigZag shrinks an
    unrolling to the loop size when the GEMM is smaller than the array (the array is then partly
    idle) and rounds a loop that is not a multiple of its unrolling up (the last tile is partly
    idle). The temporal mapping (tiling and loop order at every memory level) is LOMA's search.
Memory hierarchy, innermost first
    * ``reg_w``: a per-PE weight register of two words, the stationary weight and its shadow copy (the
      next weight tile loads while the current one computes); ``W`` only.
    * ``reg_i``: one input register per array row, shared along ``D2``: the systolic pipeline that
      passes an ``I`` element along its row; ``I`` only.
    * ``reg_o``: a per-PE register of two partial sums (the one being accumulated and the one moving on
      down the column); ``O`` only.
    * ``l2``: the per-core L2 (``l2_tc_kb``), one instance per core shared by its array (served
      dimensions ``D1, D2``), holding all three operands. The template gives no L2 bandwidth: each of
      the eight operand streams (``I``, ``W`` and the partial sums, to and from the array and the GLB)
      gets its own port of ``2·max(pe_x, pe_y)`` 32-bit words per cycle, so the L2 throttles the
      array only where stationary weights must be reloaded faster than that (few rows ``m`` per
      weight tile).
    * ``glb``: the global buffer (``glb_mb``), one instance shared by all cores (served dimensions
      ``D1, D2[, D3]``), with one read and one write port of ``G`` words per cycle each
      (``G · 8·bytes_per_element`` bits) shared by all operands. With ``all_cores``, ``G = glb_bw``,
      divided among the cores by construction; alone, a core gets the single-core GLB port of the
      Phaze estimator, ``G = min(glb_bw, 16·max(pe_x, pe_y))`` (spec §11.2, ``num = 1``).
    * ``hbm``: off-chip HBM, unbounded, one read-write port of ``hbm_bw / clock_hz`` bytes per cycle.

What is and isn't modelled
    ZigZag models the spatial under-use of the array, the stalls when a memory port cannot move a
    tile within the window the loop nest allows (with double buffering where a level has room for
    it), the initial loading of the operands from HBM and the final write-back of the output (each
    GEMM starts and ends in HBM, as in Phaze), and the systolic drain. It does not model the
    systolic fill, the network between the GLB and the cores beyond the GLB port bandwidth, bank
    conflicts, memory access latency (every level answers in one cycle), vector cores, or fusion with
    neighbouring operators. Energy and area come out of ZigZag with placeholder unit costs and are
    ignored.

ZigZag quirks worth knowing when reading its numbers
    * LOMA tries every order of the temporal loops' prime factors after merging them down to
      ``LPF_LIMIT`` factors; the merge is crude (it merges the smallest factors of the loop with the
      most), so a smaller limit can miss the good tilings by 2× and a prime loop size (e.g. ``m=1009``)
      cannot be tiled at all.
    * Per period, ZigZag rounds each operand stream's transfer on a port up to whole cycles before
      summing the streams that share the port, so several thin streams on one port (the GLB's) can
      stall for a cycle each even when their bits fit; mappings with on-chip reuse avoid it.

Results are cached on disk (one JSON file per key) under ``cache_dir``, by default
``$ARCHPLACE_ZIGZAG_CACHE`` or ``~/.cache/archplace/zigzag``. The key holds the GEMM, ``all_cores``, every
core parameter the description depends on, ``LPF_LIMIT`` and ``MODEL_VERSION``, so a second call with
the same key does not run ZigZag. ZigZag is an optional dependency (``pip install archplace[zigzag]``),
imported only when a GEMM has to be estimated.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import numbers
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from archplace.hardware.accelerator import Accelerator
from archplace.hardware.constants import GLB_PORT_WORDS_PER_PE_EDGE

__all__ = ["zigzag_gemm_cycles", "zigzag_gemm_latency_s", "default_cache_dir", "cache_key",
           "hardware_description", "workload_description", "mapping_description"]

# Bump when the generated description or the search changes, so that older cache entries go unused.
MODEL_VERSION = 3  # 3: the cores may divide N too (core_dim)
# LOMA merges the temporal loops' prime factors down to this many and tries every order of them (at most
# 6! = 720 cost-model evaluations, a few ms each). 5 is ~5× faster but misses good tilings by up to 2×.
LPF_LIMIT = 6
ENV_CACHE_DIR = "ARCHPLACE_ZIGZAG_CACHE"
_MISSING = "the zigzag backend needs `pip install archplace[zigzag]` (zigzag-dse)"
_HBM_SIZE_BITS = 2**50  # effectively unbounded


def default_cache_dir() -> Path:
    """``$ARCHPLACE_ZIGZAG_CACHE`` if set, else ``~/.cache/archplace/zigzag``."""
    env = os.environ.get(ENV_CACHE_DIR)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "archplace" / "zigzag"


def _check_dims(b: int, m: int, n: int, k: int) -> tuple[int, int, int, int]:
    out = []
    for name, v in (("b", b), ("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or v != int(v) or v < 1:
            raise ValueError(f"GEMM dimension {name!r} must be a positive integer, got {v!r}")
        out.append(int(v))
    return out[0], out[1], out[2], out[3]


def _glb_words(acc: Accelerator, all_cores: bool) -> int:
    """GLB port width in words per cycle: ``glb_bw`` for all cores, the single-core port for one core."""
    if all_cores:
        return int(acc.glb_bw)
    return int(min(acc.glb_bw, GLB_PORT_WORDS_PER_PE_EDGE * max(acc.pe_x, acc.pe_y)))


def cache_key(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False) -> dict[str, Any]:
    """Everything the ZigZag estimate depends on, as a JSON-able dict (the on-disk cache key)."""
    b, m, n, k = _check_dims(b, m, n, k)
    return {
        "model_version": MODEL_VERSION,
        "lpf_limit": LPF_LIMIT,
        "gemm_bmnk": [b, m, n, k],
        "all_cores": bool(all_cores),
        "num_tc": acc.num_tc if all_cores else 1,
        "pe_x": acc.pe_x,
        "pe_y": acc.pe_y,
        "l2_tc_kb": float(acc.l2_tc_kb),
        "glb_mb": float(acc.glb_mb),
        "glb_bw_words": _glb_words(acc, all_cores),
        "hbm_bytes_per_cycle": round(acc.hbm_bw / acc.clock_hz, 6),
        "bytes_per_element": acc.bytes_per_element,
    }


def _key_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / f"gemm_{digest}.json"


# ---------------------------------------------------------------------------------------------- description
def _port(name: str, kind: str, bits: int, allocation: list[str]) -> dict[str, Any]:
    return {"name": name, "type": kind, "bandwidth_min": bits, "bandwidth_max": bits,
            "allocation": allocation}


def _memory(size_bits: int, operands: list[str], ports: list[dict[str, Any]], served: list[str],
            access_cost: float) -> dict[str, Any]:
    # Access costs (pJ) only rank ZigZag's energy, which is unused here; they grow outwards as they should.
    return {"size": int(size_bits), "r_cost": access_cost, "w_cost": access_cost, "area": 0.0, "latency": 1,
            "operands": operands, "ports": ports, "served_dimensions": served}


def _psum_bits(acc: Accelerator) -> int:
    return max(32, 8 * acc.bytes_per_element)


def hardware_description(acc: Accelerator, all_cores: bool = False) -> dict[str, Any]:
    """The ZigZag accelerator description (the YAML file's content) of one tensor core of ``acc``, or of all
    ``acc.num_tc`` of them sharing the GLB."""
    word = 8 * acc.bytes_per_element
    psum = _psum_bits(acc)
    dims = ["D1", "D2", "D3"] if all_cores else ["D1", "D2"]
    sizes = [acc.pe_x, acc.pe_y] + ([acc.num_tc] if all_cores else [])
    l2_bits = 2 * max(acc.pe_x, acc.pe_y) * psum
    glb_bits = _glb_words(acc, all_cores) * word
    hbm_bits = max(word, int(acc.hbm_bw / acc.clock_hz * 8))
    every_stream = ["I1, fh", "I1, tl", "I2, fh", "I2, tl", "O, fh", "O, tl", "O, fl", "O, th"]
    memories = {
        "reg_w": _memory(2 * word, ["I2"], [
            _port("r_port_1", "read", word, ["I2, tl"]),
            _port("w_port_1", "write", word, ["I2, fh"]),
        ], [], 0.01),
        "reg_i": _memory(word, ["I1"], [
            _port("r_port_1", "read", word, ["I1, tl"]),
            _port("w_port_1", "write", word, ["I1, fh"]),
        ], ["D2"], 0.01),
        "reg_o": _memory(2 * psum, ["O"], [
            _port("r_port_1", "read", psum, ["O, tl"]),
            _port("r_port_2", "read", psum, ["O, th"]),
            _port("w_port_1", "write", psum, ["O, fh"]),
            _port("w_port_2", "write", psum, ["O, fl"]),
        ], [], 0.01),
        "l2": _memory(int(acc.l2_tc_kb * 1024 * 8), ["I1", "I2", "O"], [
            _port("r_port_1", "read", l2_bits, ["I1, tl"]),
            _port("r_port_2", "read", l2_bits, ["I2, tl"]),
            _port("r_port_3", "read", l2_bits, ["O, tl"]),
            _port("r_port_4", "read", l2_bits, ["O, th"]),
            _port("w_port_1", "write", l2_bits, ["I1, fh"]),
            _port("w_port_2", "write", l2_bits, ["I2, fh"]),
            _port("w_port_3", "write", l2_bits, ["O, fh"]),
            _port("w_port_4", "write", l2_bits, ["O, fl"]),
        ], ["D1", "D2"], 1.0),
        "glb": _memory(int(acc.glb_mb * 2**20 * 8), ["I1", "I2", "O"], [
            _port("r_port_1", "read", glb_bits, ["I1, tl", "I2, tl", "O, tl", "O, th"]),
            _port("w_port_1", "write", glb_bits, ["I1, fh", "I2, fh", "O, fh", "O, fl"]),
        ], list(dims), 10.0),
        "hbm": _memory(_HBM_SIZE_BITS, ["I1", "I2", "O"], [
            _port("rw_port_1", "read_write", hbm_bits, every_stream),
        ], list(dims), 100.0),
    }
    return {
        "name": f"archplace_{acc.num_tc if all_cores else 1}x_tc_{acc.pe_x}x{acc.pe_y}",
        "memories": memories,
        "operational_array": {
            "unit_energy": 0.04, "unit_area": 1.0, "dimensions": dims, "sizes": sizes,
            "input_precision": [word, word], "systolic_dimensions": ["D1", "D2"],
        },
    }


def workload_description(acc: Accelerator, b: int, m: int, n: int, k: int) -> list[dict[str, Any]]:
    """The ZigZag workload: one batched GEMM layer ``O[b][m][n] += I[b][m][k] * W[b][k][n]``."""
    b, m, n, k = _check_dims(b, m, n, k)
    word = 8 * acc.bytes_per_element
    return [{
        "id": 0, "name": "gemm", "operator_type": "Gemm",
        "equation": "O[b][m][n]+=I[b][m][k]*W[b][k][n]",
        "dimension_relations": [],
        "loop_dims": ["B", "M", "N", "K"], "loop_sizes": [b, m, n, k],
        "operand_precision": {"W": word, "I": word, "O": _psum_bits(acc), "O_final": word},
        "operand_source": {"W": 0, "I": 0},
    }]


def core_dim(acc: Accelerator, b: int, m: int, n: int, k: int) -> str:
    """The GEMM dimension the cores are unrolled over with ``all_cores``: the batch ``"B"``, the rows
    ``"M"`` or the output columns ``"N"``, the same choice as the analytical ℓ̂
    (``latency.gemm_core_split``), so both models are compared under one mapping."""
    from archplace.simulators.latency import gemm_core_split

    return gemm_core_split(acc, b, m, n, k)


def mapping_description(acc: Accelerator, b: int, m: int, n: int, k: int,
                        all_cores: bool = False) -> list[dict[str, Any]]:
    """The ZigZag mapping: the fixed weight-stationary spatial unrolling (the temporal one is searched).
    With the cores over ``N``, ``D2`` and ``D3`` both unroll the output columns (``pe_y·num_tc`` a round)."""
    spatial = {"D1": [f"K, {acc.pe_x}"], "D2": [f"N, {acc.pe_y}"]}
    if all_cores:
        spatial["D3"] = [f"{core_dim(acc, b, m, n, k)}, {acc.num_tc}"]
    return [{"name": "default", "spatial_mapping": spatial,
             "memory_operand_links": {"O": "O", "W": "I2", "I": "I1"}}]


# ---------------------------------------------------------------------------------------------- runner
@contextlib.contextmanager
def _quiet_zigzag() -> Iterator[None]:
    """Silence ZigZag's loggers (they log every mapping at INFO) and restore their level afterwards."""
    log = logging.getLogger("zigzag")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _stages() -> list[Any]:
    """The stage pipeline of ``zigzag.api.get_hardware_performance_zigzag`` without the stages that save
    results to JSON and pickle files or plot them (and without its ``logging.basicConfig`` call)."""
    try:
        from zigzag.stages.evaluation.cost_model_evaluation import CostModelStage
        from zigzag.stages.mapping.spatial_mapping_generation import SpatialMappingGeneratorStage
        from zigzag.stages.mapping.temporal_mapping_generator_stage import TemporalMappingGeneratorStage
        from zigzag.stages.parser.accelerator_parser import AcceleratorParserStage
        from zigzag.stages.parser.workload_parser import WorkloadParserStage
        from zigzag.stages.results.reduce_stages import MinimalLatencyStage
        from zigzag.stages.workload_iterator import WorkloadStage
    except ImportError as e:
        raise ImportError(_MISSING) from e
    return [WorkloadParserStage, AcceleratorParserStage, WorkloadStage, MinimalLatencyStage,
            SpatialMappingGeneratorStage, MinimalLatencyStage, TemporalMappingGeneratorStage, CostModelStage]


def _run_zigzag(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool) -> float:
    """Run ZigZag (no cache) and return the latency of the best mapping found, in cycles."""
    stages = _stages()  # raises the ImportError first if zigzag is missing
    import yaml
    from zigzag.mapping.temporal_mapping import TemporalMappingType
    from zigzag.stages.main import MainStage

    what = f"GEMM b={b} m={m} n={n} k={k} on {'all cores of ' if all_cores else 'one core of '}{acc.label()}"
    with tempfile.TemporaryDirectory(prefix="archplace_zigzag_") as tmp, _quiet_zigzag():
        hw_path = Path(tmp) / "accelerator.yaml"
        map_path = Path(tmp) / "mapping.yaml"
        hw_path.write_text(yaml.safe_dump(hardware_description(acc, all_cores), sort_keys=False))
        map_path.write_text(yaml.safe_dump(mapping_description(acc, b, m, n, k, all_cores), sort_keys=False))
        main = MainStage(
            stages,
            accelerator=str(hw_path),
            workload=workload_description(acc, b, m, n, k),
            mapping=str(map_path),
            dump_folder=tmp,
            loma_lpf_limit=LPF_LIMIT,
            loma_show_progress_bar=False,
            nb_mappings_generated=1,
            enable_mix_spatial_mapping_generation=False,
            access_same_data_considered_as_no_access=True,
            temporal_mapping_type=TemporalMappingType.UNEVEN,
        )
        try:
            results = main.run()
        except Exception as e:
            raise RuntimeError(f"ZigZag failed on {what}: {type(e).__name__}: {e}") from e
    if not results:
        raise RuntimeError(f"ZigZag found no mapping for {what}")
    return float(results[0][0].latency_total2)


# ---------------------------------------------------------------------------------------------- public API
def zigzag_gemm_cycles(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False,
                       cache_dir: str | Path | None = None) -> float:
    """Latency in cycles, from ZigZag, of the GEMM ``(b×m×k)·(b×k×n)`` (``b`` independent GEMMs,
    ``2·b·m·n·k`` flops) on one tensor core of ``acc``, or spread over all ``acc.num_tc`` tensor cores with
    ``all_cores=True``. Operands start in HBM and the output ends there.

    Cached on disk under ``cache_dir`` (default :func:`default_cache_dir`): a second call with the same
    :func:`cache_key` reads the file and does not run ZigZag."""
    key = cache_key(acc, b, m, n, k, all_cores)
    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = _key_path(cdir, key)
    try:
        entry = json.loads(path.read_text())
        if entry.get("key") == key:
            return float(entry["cycles"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass  # missing or unreadable: compute it again
    cycles = _run_zigzag(acc, *key["gemm_bmnk"], bool(all_cores))
    if not (cycles > 0 and math.isfinite(cycles)):
        raise RuntimeError(f"ZigZag returned a latency of {cycles!r} cycles for GEMM {key['gemm_bmnk']}")
    cdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cdir, prefix=".tmp_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "cycles": cycles}, f, indent=1)
        os.replace(tmp, path)  # atomic: concurrent writers of one key leave one whole file
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return cycles


def zigzag_gemm_latency_s(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False,
                          cache_dir: str | Path | None = None) -> float:
    """:func:`zigzag_gemm_cycles` in seconds (divided by ``acc.clock_hz``)."""
    return zigzag_gemm_cycles(acc, b, m, n, k, all_cores=all_cores, cache_dir=cache_dir) / acc.clock_hz
