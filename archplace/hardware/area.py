"""Analytical chip area (mm², 22 nm class) of the Phaze template, vectorised over architectures.

area = num_tc · (pe_x·pe_y·MAC + L2_tc·SRAM + control)
     + num_vc · (pe_vc·lane + L2_vc·SRAM + control)
     + GLB·SRAM
HBM is off-chip and adds no area. Constants and their sources: ``constants.py``.
"""

from __future__ import annotations

import numpy as np

from . import constants as C


def _l2_tc_kb(pe_x, pe_y):
    return np.maximum(1.0, 2.0 ** (np.log2(pe_x) + np.log2(pe_y) - 6))


def _l2_vc_kb(pe_vc):
    return np.clip(2.0 ** (np.log2(pe_vc) - 6), 1.0, 4.0)


def area_mm2(num_tc, num_vc, pe_x, pe_y, glb_mb, pe_vc=None, l2_tc_kb=None, l2_vc_kb=None):
    """Area of one or many architectures (array arguments broadcast)."""
    num_tc, num_vc, pe_x, pe_y, glb_mb = (np.asarray(a, dtype=np.float64)
                                          for a in (num_tc, num_vc, pe_x, pe_y, glb_mb))
    pe_vc = pe_x if pe_vc is None else np.asarray(pe_vc, dtype=np.float64)
    l2t = _l2_tc_kb(pe_x, pe_y) if l2_tc_kb is None else np.asarray(l2_tc_kb, dtype=np.float64)
    l2v = _l2_vc_kb(pe_vc) if l2_vc_kb is None else np.asarray(l2_vc_kb, dtype=np.float64)
    sram = C.SRAM_UM2_PER_BYTE
    tc = pe_x * pe_y * C.MAC_AREA_UM2 + l2t * 1024 * sram + C.CORE_CONTROL_AREA_UM2
    vc = pe_vc * C.VECTOR_LANE_AREA_UM2 + l2v * 1024 * sram + C.CORE_CONTROL_AREA_UM2
    glb = glb_mb * 2**20 * sram
    return (num_tc * tc + num_vc * vc + glb) / 1e6


def accelerator_area_mm2(acc) -> float:
    return float(area_mm2(acc.num_tc, acc.num_vc, acc.pe_x, acc.pe_y, acc.glb_mb, acc.pe_vc,
                          acc.l2_tc_kb, acc.l2_vc_kb))


def area_breakdown_mm2(acc) -> dict[str, float]:
    """Where the area of one accelerator goes."""
    sram = C.SRAM_UM2_PER_BYTE / 1e6
    return {
        "tensor_macs": acc.num_tc * acc.pe_x * acc.pe_y * C.MAC_AREA_UM2 / 1e6,
        "vector_lanes": acc.num_vc * acc.pe_vc * C.VECTOR_LANE_AREA_UM2 / 1e6,
        "l2": (acc.num_tc * acc.l2_tc_kb + acc.num_vc * acc.l2_vc_kb) * 1024 * sram,
        "control": (acc.num_tc + acc.num_vc) * C.CORE_CONTROL_AREA_UM2 / 1e6,
        "glb": acc.glb_mb * 2**20 * sram,
    }
