"""Per-op latency estimates of one graph on one accelerator, by backend.

``analytical`` is ``latency.estimate_latencies``. ``zigzag`` takes the GEMM latency of tensor and
fused ops from ZigZag's temporal mapper (which models the array, L2 and GLB itself) and combines it
with the analytical vector-core time and the HBM floor by the same rule as the analytical model:
the longest of them plus the launch cost. Everything else stays analytical.

Bandwidth shares (``OpEstimates.hbm_share``/``glb_share``, the layer ILP's contention model; see
``latency.bandwidth_shares``) are the analytical bytes over the backend's single-core latency ℓ. For
zigzag that is the analytical HBM bytes and GLB words over the ZigZag-based ℓ: the HBM share stays
<= 1 because ℓ includes the HBM floor; the GLB share is capped at 1 because ZigZag's own mapping may
reuse more in the GLB than the analytical count assumes. Only single-core shares exist: an intra-op
op (ℓ̂) never overlaps another op.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ..hardware import constants as C
from ..hardware.accelerator import Accelerator
from ..workloads.graph import OpGraph
from .latency import ArchArrays, UniqueOps, bandwidth_shares, latency_components

BACKENDS = ("analytical", "zigzag")


@dataclass(frozen=True)
class OpEstimates:
    """ℓ (one core) and ℓ̂ (all cores of the op's type) per graph row, in seconds; and per row the
    single-core op's fraction of the shared HBM and GLB bandwidth while it runs (None where the
    estimates come from elsewhere, e.g. profiles: the layer ILP then has no contention data)."""

    single_s: np.ndarray
    all_s: np.ndarray
    backend: str
    hbm_share: np.ndarray | None = None
    glb_share: np.ndarray | None = None


def estimate_graph(g: OpGraph, acc: Accelerator, backend: str = "analytical",
                   link_bw: float = C.PHAZE_LINK_BW_BYTES_PER_S) -> OpEstimates:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} unknown; allowed: {list(BACKENDS)}")
    a = ArchArrays.from_accelerators([acc])
    ops = UniqueOps.from_graph(g)
    tmp = int(g.meta.get("tmp", 1) or 1)
    out = []
    shares = None
    for all_cores in (False, True):
        comp = latency_components(a, ops, link_bw, tmp, all_cores)
        lat = comp["latency_s"][0].copy()
        if backend == "zigzag":
            from .zigzag_backend import zigzag_gemm_latency_s

            for u in np.flatnonzero(np.isin(ops.core, (1, 3))):
                dims = tuple(int(x) for x in (ops.b[u], ops.m[u], ops.n[u], ops.k[u]))
                # a fused op spreads over the fused cores, min(num_tc, num_vc)
                on = acc if ops.core[u] == 1 else replace(acc, num_tc=acc.num_fused)
                zz = zigzag_gemm_latency_s(on, *dims, all_cores=all_cores and on.num_tc > 1)
                vec_s = comp["vector_cycles"][0, u] / acc.clock_hz
                lat[u] = max(zz, vec_s, comp["hbm_s"][0, u]) + C.OP_LAUNCH_CYCLES / acc.clock_hz
        if not all_cores:
            hbm, glb = bandwidth_shares(a, comp, lat[None, :], cap_glb=backend == "zigzag")
            shares = (hbm[0, ops.inverse], glb[0, ops.inverse])
        out.append(lat[ops.inverse])
    return OpEstimates(out[0], out[1], backend, *shares)
