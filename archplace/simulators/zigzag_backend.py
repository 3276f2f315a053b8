"""Latency of tensor-core GEMMs from ZigZag (KU Leuven), to validate archplace's analytical cost model.

ZigZag (https://github.com/KULeuven-MICAS/zigzag, package ``zigzag-dse``) takes a hardware description
(an operational array plus a memory hierarchy), a workload layer and a partial mapping, searches the
temporal mapping with its LOMA engine (loop-order-based memory allocation) and reports the latency of
the best mapping in cycles. This module writes the description of one archplace :class:`Accelerator`
as a ZigZag YAML file and asks for one GEMM ``(b×m×k)·(b×k×n)`` at a time.

How the Phaze template maps to ZigZag
-------------------------------------
Operational array
    ``D1 = pe_x`` × ``D2 = pe_y`` MACs, both declared *systolic* (ZigZag adds the array drain, one
    cycle per unit along each systolic dimension). When ``all_cores=True`` a third dimension
    ``D3 = num_tc`` stands for the tensor cores, so one spatial unrolling spans every core. It is not
    systolic: cores do not pass operands to each other.
Workload
    ``O[b][m][n] += I[b][m][k] * W[b][k][n]`` (ZigZag operator type ``Gemm``): ``I`` is the streaming
    left operand, ``W`` the right operand held stationary in the array. Inputs and weights are
    ``8·bytes_per_element`` bits; partial sums are kept at 32 bits (at least the element width) and
    written back at ``8·bytes_per_element`` bits.
Spatial mapping (fixed, weight-stationary as in a TPU)
    the reduction dimension ``K`` over ``D1`` (``pe_x``), the output dimension ``N`` over ``D2``
    (``pe_y``), and, with ``all_cores``, the cores over the batch ``B`` when ``b`` fills them
    (``b ≥ num_tc``) and over ``M`` (rows of the streaming operand) otherwise. ZigZag shrinks an
    unrolling to the loop size when the GEMM is smaller than the array (the array is then under-used)
    and rounds a loop that is not a multiple of its unrolling up (the last tile is partly idle).
Memory hierarchy, innermost first
    * ``reg_w``: a per-PE weight register of two words (the stationary weight and its shadow copy, so
      the next weight tile can load while the current one computes); serves ``W`` only.
    * ``reg_i``: one input register per array row, shared along ``D2`` — the systolic input pipeline
      that passes each ``I`` element across the row; serves ``I`` only.
    * ``reg_o``: a per-PE 32-bit partial-sum register; serves ``O`` only. The spatial reduction of
      ``K`` along ``D1`` is ZigZag's own (the partial sums flow down the columns).
    * ``l2``: the per-core L2 (``l2_tc_kb``), one instance per core, shared by that core's array
      (served dimensions ``D1, D2``), holding all three operands. The template gives no L2
      bandwidth; it gets a read and a write port of ``2·max(pe_x, pe_y)`` 32-bit words per cycle
      each, enough to stream a row of inputs, a row of weights and a row of outputs every cycle, so
      the L2 never throttles the array by itself.
    * ``glb``: the global buffer (``glb_mb``), one instance shared by all cores (served dimensions
      ``D1, D2[, D3]``), with a read port and a write port of ``glb_bw`` words per cycle each
      (``glb_bw · bytes_per_element · 8`` bits). The cores of the ``all_cores`` case share it, so
      its bandwidth is divided among them; a single core gets all of it.
    * ``hbm``: off-chip HBM, one read-write port of ``hbm_bw / clock_hz`` bytes per cycle, unbounded
      in size.

What is and isn't modelled
    ZigZag models the spatial under-use of the array (GEMM dims smaller than or not a multiple of
    the array), the temporal stalls when a memory port cannot deliver or drain data within the
    window the loop nest allows (with double buffering where a level has room for it), the initial
    on-loading of data from HBM and the final off-loading of the outputs, and the systolic drain.
    It does not model the fill of the systolic pipeline beyond that drain, weight-load bubbles
    other than as bandwidth stalls, the network between the GLB and the cores (only the GLB port
    bandwidth), bank conflicts, DRAM latency (every memory has a latency of one cycle), vector
    cores, or fusion with neighbouring operators: each GEMM starts with its operands in HBM and ends
    with its output written back there. Energy and area are computed by ZigZag with placeholder
    unit costs and ignored here.

Results are cached on disk (one JSON file per key) under ``cache_dir``, by default
``$ARCHPLACE_ZIGZAG_CACHE`` or ``~/.cache/archplace/zigzag``; the key holds the GEMM, ``all_cores``
and every core parameter the description depends on, so a second call with the same key does not run
ZigZag. ZigZag is an optional dependency (``pip install archplace[zigzag]``) imported only when a
GEMM has to be estimated.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from archplace.hardware.accelerator import Accelerator

__all__ = ["zigzag_gemm_cycles", "zigzag_gemm_latency_s", "default_cache_dir", "cache_key"]

# Bump when the generated hardware/workload/mapping description changes, so old cache entries are unused.
MODEL_VERSION = 1
# LOMA merges the prime factors of the temporal loops until at most this many remain, and then tries
# every ordering of them (at most LPF_LIMIT! orderings): 6 keeps one GEMM to about a second.
LPF_LIMIT = 6
_ENV_CACHE = "ARCHPLACE_ZIGZAG_CACHE"
_MISSING = "the zigzag backend needs `pip install archplace[zigzag]` (zigzag-dse)"
_HBM_SIZE_BITS = 2**50  # effectively unbounded


def default_cache_dir() -> Path:
    """``$ARCHPLACE_ZIGZAG_CACHE`` if set, else ``~/.cache/archplace/zigzag``."""
    env = os.environ.get(_ENV_CACHE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "archplace" / "zigzag"


def _check_dims(b: int, m: int, n: int, k: int) -> tuple[int, int, int, int]:
    out = []
    for name, v in (("b", b), ("m", m), ("n", n), ("k", k)):
        if isinstance(v, bool) or int(v) != v or v < 1:
            raise ValueError(f"GEMM dimension {name!r} must be a positive integer, got {v!r}")
        out.append(int(v))
    return out[0], out[1], out[2], out[3]


def cache_key(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False) -> dict[str, Any]:
    """Everything the ZigZag estimate depends on, as a JSON-able dict."""
    b, m, n, k = _check_dims(b, m, n, k)
    return {
        "v": MODEL_VERSION,
        "lpf_limit": LPF_LIMIT,
        "gemm": [b, m, n, k],
        "all_cores": bool(all_cores),
        "num_tc": acc.num_tc if all_cores else 1,
        "pe_x": acc.pe_x,
        "pe_y": acc.pe_y,
        "l2_tc_kb": float(acc.l2_tc_kb),
        "glb_mb": float(acc.glb_mb),
        "glb_bw": int(acc.glb_bw),
        "hbm_bytes_per_cycle": round(acc.hbm_bw / acc.clock_hz, 6),
        "bytes_per_element": acc.bytes_per_element,
    }


def _key_path(cache_dir: Path, key: dict[str, Any]) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / f"{digest}.json"


# ---------------------------------------------------------------------------------------------- description
def _port(name: str, kind: str, bw: int, allocation: list[str]) -> dict[str, Any]:
    return {"name": name, "type": kind, "bandwidth_min": bw, "bandwidth_max": bw, "allocation": allocation}


def _memory(size_bits: int, operands: list[str], ports: list[dict[str, Any]], served: list[str],
            r_cost: float, w_cost: float) -> dict[str, Any]:
    return {"size": int(size_bits), "r_cost": r_cost, "w_cost": w_cost, "area": 0.0, "latency": 1,
            "operands": operands, "ports": ports, "served_dimensions": served}


def _psum_bits(acc: Accelerator) -> int:
    return max(32, 8 * acc.bytes_per_element)


def hardware_description(acc: Accelerator, all_cores: bool = False) -> dict[str, Any]:
    """The ZigZag accelerator description (the YAML's content) of one tensor core, or of all of them."""
    word = 8 * acc.bytes_per_element
    psum = _psum_bits(acc)
    dims = ["D1", "D2", "D3"] if all_cores else ["D1", "D2"]
    sizes = [acc.pe_x, acc.pe_y] + ([acc.num_tc] if all_cores else [])
    core_dims = ["D1", "D2"]  # what one core's memories are shared across
    l2_bw = 2 * max(acc.pe_x, acc.pe_y) * psum
    glb_bw = int(acc.glb_bw) * word
    hbm_bw = max(word, int(acc.hbm_bw / acc.clock_hz * 8))
    all_io = ["I1, fh", "I1, tl", "I2, fh", "I2, tl", "O, fh", "O, tl", "O, fl", "O, th"]
    memories = {
        "reg_w": _memory(2 * word, ["I2"], [
            _port("r_port_1", "read", word, ["I2, tl"]),
            _port("w_port_1", "write", word, ["I2, fh"]),
        ], [], 0.01, 0.01),
        "reg_o": _memory(psum, ["O"], [
            _port("r_port_1", "read", psum, ["O, tl"]),
            _port("r_port_2", "read", psum, ["O, th"]),
            _port("w_port_1", "write", psum, ["O, fh"]),
            _port("w_port_2", "write", psum, ["O, fl"]),
        ], [], 0.01, 0.01),
        "l2": _memory(int(acc.l2_tc_kb * 1024 * 8), ["I1", "I2", "O"], [
            _port("r_port_1", "read", l2_bw, ["I1, tl"]),
            _port("r_port_2", "read", l2_bw, ["I2, tl"]),
            _port("r_port_3", "read", l2_bw, ["O, tl", "O, th"]),
            _port("w_port_1", "write", l2_bw, ["I1, fh", "I2, fh"]),
            _port("w_port_2", "write", l2_bw, ["O, fh", "O, fl"]),
        ], core_dims, 1.0, 1.0),
        "glb": _memory(int(acc.glb_mb * 2**20 * 8), ["I1", "I2", "O"], [
            _port("r_port_1", "read", glb_bw, ["I1, tl", "I2, tl", "O, tl", "O, th"]),
            _port("w_port_1", "write", glb_bw, ["I1, fh", "I2, fh", "O, fh", "O, fl"]),
        ], list(dims), 10.0, 10.0),
        "hbm": _memory(_HBM_SIZE_BITS, ["I1", "I2", "O"], [
            _port("rw_port_1", "read_write", hbm_bw, all_io),
        ], list(dims), 100.0, 100.0),
    }
    return {
        "name": f"archplace_tc{acc.num_tc if all_cores else 1}_{acc.pe_x}x{acc.pe_y}",
        "memories": memories,
        "operational_array": {
            "unit_energy": 0.04, "unit_area": 1.0, "dimensions": dims, "sizes": sizes,
            "input_precision": [word, word], "systolic_dimensions": ["D1", "D2"],
        },
    }


def workload_description(acc: Accelerator, b: int, m: int, n: int, k: int) -> list[dict[str, Any]]:
    """The ZigZag workload: one batched GEMM layer."""
    word = 8 * acc.bytes_per_element
    return [{
        "id": 0, "name": "gemm", "operator_type": "Gemm",
        "equation": "O[b][m][n]+=I[b][m][k]*W[b][k][n]",
        "dimension_relations": [],
        "loop_dims": ["B", "M", "N", "K"], "loop_sizes": [b, m, n, k],
        "operand_precision": {"W": word, "I": word, "O": _psum_bits(acc), "O_final": word},
        "operand_source": {"W": 0, "I": 0},
    }]


def core_dim(acc: Accelerator, b: int) -> str:
    """The GEMM dimension the cores are unrolled over in the ``all_cores`` case."""
    return "B" if b >= acc.num_tc else "M"


def mapping_description(acc: Accelerator, b: int, all_cores: bool = False) -> list[dict[str, Any]]:
    """The ZigZag mapping: the fixed weight-stationary spatial unrolling; the temporal one is searched."""
    spatial = {"D1": [f"K, {acc.pe_x}"], "D2": [f"N, {acc.pe_y}"]}
    if all_cores:
        spatial["D3"] = [f"{core_dim(acc, b)}, {acc.num_tc}"]
    return [{"name": "default", "spatial_mapping": spatial,
             "memory_operand_links": {"O": "O", "W": "I2", "I": "I1"}}]


# ---------------------------------------------------------------------------------------------- runner
def _import_zigzag() -> None:
    try:
        import zigzag  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(_MISSING) from e


def _quiet_zigzag_logging() -> None:
    logging.getLogger("zigzag").setLevel(logging.ERROR)


def _run_zigzag(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool) -> float:
    """Run ZigZag (no cache) and return the latency of the best mapping, in cycles."""
    _import_zigzag()
    import yaml

    from zigzag.stages.evaluation.cost_model_evaluation import CostModelStage
    from zigzag.stages.main import MainStage
    from zigzag.stages.mapping.spatial_mapping_generation import SpatialMappingGeneratorStage
    from zigzag.stages.mapping.temporal_mapping_generator_stage import TemporalMappingGeneratorStage
    from zigzag.stages.parser.accelerator_parser import AcceleratorParserStage
    from zigzag.stages.parser.workload_parser import WorkloadParserStage
    from zigzag.stages.results.reduce_stages import MinimalLatencyStage
    from zigzag.stages.workload_iterator import WorkloadStage

    _quiet_zigzag_logging()
    with tempfile.TemporaryDirectory(prefix="archplace_zigzag_") as tmp:
        hw_path = Path(tmp) / "accelerator.yaml"
        map_path = Path(tmp) / "mapping.yaml"
        hw_path.write_text(yaml.safe_dump(hardware_description(acc, all_cores), sort_keys=False))
        map_path.write_text(yaml.safe_dump(mapping_description(acc, b, all_cores), sort_keys=False))
        # The pipeline of zigzag.api.get_hardware_performance_zigzag without its result-saving and plotting
        # stages (and without its logging.basicConfig call).
        main = MainStage(
            [WorkloadParserStage, AcceleratorParserStage, WorkloadStage, MinimalLatencyStage,
             SpatialMappingGeneratorStage, MinimalLatencyStage, TemporalMappingGeneratorStage, CostModelStage],
            accelerator=str(hw_path),
            workload=workload_description(acc, b, m, n, k),
            mapping=str(map_path),
            dump_folder=tmp,
            loma_lpf_limit=LPF_LIMIT,
            loma_show_progress_bar=False,
            nb_mappings_generated=1,
            enable_mix_spatial_mapping_generation=False,
            access_same_data_considered_as_no_access=True,
            temporal_mapping_type=_mapping_type(),
        )
        results = main.run()
    if not results:
        raise RuntimeError(f"ZigZag found no mapping for GEMM b={b} m={m} n={n} k={k} on {acc.label()}")
    cme = results[0][0]
    return float(cme.latency_total2)


def _mapping_type() -> Any:
    from zigzag.mapping.temporal_mapping import TemporalMappingType

    return TemporalMappingType("uneven")


# ---------------------------------------------------------------------------------------------- public API
def zigzag_gemm_cycles(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False,
                       cache_dir: str | Path | None = None) -> float:
    """Latency in cycles, from ZigZag, of the GEMM ``(b×m×k)·(b×k×n)`` (``2·b·m·n·k`` flops) on one tensor
    core of ``acc``, or spread over all ``acc.num_tc`` tensor cores with ``all_cores=True``.

    The result is cached on disk under ``cache_dir`` (default :func:`default_cache_dir`)."""
    key = cache_key(acc, b, m, n, k, all_cores)
    cdir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    path = _key_path(cdir, key)
    try:
        entry = json.loads(path.read_text())
        if entry.get("key") == key:
            return float(entry["cycles"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    b, m, n, k = key["gemm"]
    cycles = _run_zigzag(acc, b, m, n, k, bool(all_cores))
    if not (cycles > 0 and math.isfinite(cycles)):
        raise RuntimeError(f"ZigZag returned a latency of {cycles!r} cycles for GEMM {key['gemm']}")
    cdir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cdir, prefix=".tmp_", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"key": key, "cycles": cycles}, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return cycles


def zigzag_gemm_latency_s(acc: Accelerator, b: int, m: int, n: int, k: int, all_cores: bool = False,
                          cache_dir: str | Path | None = None) -> float:
    """:func:`zigzag_gemm_cycles` in seconds (divided by ``acc.clock_hz``)."""
    return zigzag_gemm_cycles(acc, b, m, n, k, all_cores=all_cores, cache_dir=cache_dir) / acc.clock_hz
