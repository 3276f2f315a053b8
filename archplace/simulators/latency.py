"""Analytical operator latency on the Phaze template, vectorised over architectures.

For every op and architecture it gives both latencies the layer ILP needs (spec phaze.md §3.1):
``single`` (ℓ) on one core of the op's type, and ``all`` (ℓ̂) spread over every core of that type.

Model, in cycles unless noted:
- **GEMM** ``(b×m×k)·(b×k×n)`` on weight-stationary ``pe_x × pe_y`` systolic arrays (TPU-style):
  the weights are cut into ``ceil(k/pe_x) · ceil(n/pe_y)`` tiles per batch; a tile streams its ``m``
  rows through the array. Weights are double-buffered, so the next tile's ``pe_x`` weight rows load
  while the current tile streams and tiles follow each other back to back: ``max(m, pe_x)`` cycles
  a tile, plus one pipeline fill and drain (``pe_x + pe_y − 1``) per op. On all cores (ℓ̂) the cores
  divide the batch, the rows or the output columns, whichever is fastest (``gemm_core_split``); never
  the reduction dimension, which would need a cross-core reduction, so ℓ̂ stays above ℓ/num_tc where
  the tiling leaves cores idle (few batch elements, rows and column tiles). Partial tiles waste their
  idle PEs (under-utilisation when dimensions do not divide).
- **Vector op**: ``ceil(vector_flops / lanes)`` plus a pipeline fill, one flop per lane per cycle.
- **Fused op**: the GEMM on tensor cores and its vector part on the paired vector cores, pipelined:
  the slower of the two plus the vector pipeline fill.
- **Data movement**: inputs and weights come from HBM into the GLB and outputs go back (spec §3.1);
  when the GEMM's operands exceed the GLB, the activation operand is streamed again for each
  half-GLB chunk of weights. Between GLB and cores the activation operand is read once per weight
  column tile. The GLB feeds ``glb_bw`` words/cycle to all cores and ``16·max(pe_x, pe_y)`` to one.
  Compute and data movement overlap (double-buffered tiles), so the op takes the longest of compute,
  GLB traffic and HBM traffic, plus a fixed launch cost.
- **AllReduce** (TMP): a ring over ``t`` devices, ``2(t−1)/t · bytes / link_bw`` on the network,
  plus the element-wise sums on the vector cores.
- a data-moving op (``copy``: no flops) takes its bytes' GLB and HBM time; an embedding lookup moves
  its ids and the rows it gathers, not its table (``workloads.ops.moved_bytes``);
- shape-only ops cost nothing.

**Bandwidth shares** (``bandwidth_shares``): the layer ILP's contention model needs, per op in
single-core mode, the fraction of each *shared* bandwidth the op draws while it runs for its latency
ℓ: ``hbm_share = hbm_s / ℓ`` and ``glb_share = glb_words / (glb_bw · clock · ℓ)`` with ``glb_bw``
the whole GLB's words/cycle (the all-cores port; one core's port is at most that, which is why the
share of a single-core op can be below 1 even when its GLB port is its bottleneck). Both lie in
[0, 1] by construction (ℓ ≥ the HBM time and ≥ the one-core GLB time ≥ ``glb_words / glb_bw``);
shape-only ops draw 0. The AllReduce is charged no GLB time by this model (its sums read the
operands the ring delivers), so its GLB share is 0. Intra-op ops (ℓ̂) never overlap anything (the
ILP's constraint (9)), so only single-core shares are computed.

Ops are deduplicated first (identical transformer blocks repeat the same few dozen ops), so the
work is (architectures × unique ops) array arithmetic with no Python loop over either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..hardware import constants as C
from ..hardware.accelerator import Accelerator
from ..workloads.graph import OpGraph
from ..workloads.ops import moved_bytes
from . import collectives

_CORE_CODE = {"none": 0, "tensor": 1, "vector": 2, "fused": 3, "comm": 4}


@dataclass(frozen=True)
class ArchArrays:
    """Architectures as columns of shape (A, 1), ready to broadcast against ops of shape (1, U)."""

    num_tc: np.ndarray
    num_vc: np.ndarray
    pe_x: np.ndarray
    pe_y: np.ndarray
    pe_vc: np.ndarray
    glb_bytes: np.ndarray
    glb_bw: np.ndarray  # words/cycle
    hbm_bw: np.ndarray  # bytes/s
    clock_hz: np.ndarray
    bytes_per_element: np.ndarray

    @classmethod
    def from_accelerators(cls, accs: list[Accelerator]) -> ArchArrays:
        if not accs:
            raise ValueError("no architectures to estimate")

        def col(f):
            return np.array([getattr(a, f) for a in accs], dtype=np.float64)[:, None]
        return cls(col("num_tc"), col("num_vc"), col("pe_x"), col("pe_y"), col("pe_vc"),
                   col("glb_mb") * 2**20, col("glb_bw"), col("hbm_bw"), col("clock_hz"),
                   col("bytes_per_element"))

    @classmethod
    def from_space(cls, space, hbm_bw: float = C.DEFAULT_HBM_BW_BYTES_PER_S,
                   clock_hz: float = C.DEFAULT_CLOCK_HZ, bytes_per_element: int = 2) -> ArchArrays:
        """All architectures of an ``ArchSpace`` without building an Accelerator each."""
        from ..hardware.accelerator import glb_bw_words

        tc = space.num_tc.astype(np.float64)
        keys = np.stack([space.num_tc, space.pe_x, space.pe_y], axis=1)
        uniq, inv = np.unique(keys, axis=0, return_inverse=True)  # the formula lives in glb_bw_words
        glb_bw = np.array([glb_bw_words(*map(int, k)) for k in uniq], dtype=np.float64)[inv.ravel()]
        n = len(tc)

        def full(v):
            return np.full((n, 1), float(v))
        return cls(tc[:, None], space.num_vc.astype(np.float64)[:, None],
                   space.pe_x.astype(np.float64)[:, None], space.pe_y.astype(np.float64)[:, None],
                   space.pe_x.astype(np.float64)[:, None], (space.glb_mb * 2**20)[:, None],
                   glb_bw[:, None].astype(np.float64), full(hbm_bw), full(clock_hz), full(bytes_per_element))

    def __len__(self) -> int:
        return self.num_tc.shape[0]


@dataclass(frozen=True)
class UniqueOps:
    """Distinct ops of a graph (by core, GEMM shape, work and bytes) and the map back to rows."""

    core: np.ndarray  # codes of _CORE_CODE, shape (U,)
    b: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    vector_flops: np.ndarray
    hbm_bytes: np.ndarray  # bytes in + out + weights
    inverse: np.ndarray  # graph row -> unique index, shape (N,)

    @classmethod
    def from_graph(cls, g: OpGraph) -> UniqueOps:
        nd = g.nodes
        core = np.array([_CORE_CODE.get(c, 0) for c in nd["core"]], dtype=np.float64)
        moved = moved_bytes(nd)
        key = np.stack([core, nd["gemm_b"], nd["gemm_m"], nd["gemm_n"], nd["gemm_k"],
                        nd["vector_flops"], moved], axis=1).astype(np.float64)
        uniq, inverse = np.unique(key, axis=0, return_inverse=True)
        return cls(*(uniq[:, i] for i in range(7)), inverse=inverse.ravel())

    def __len__(self) -> int:
        return len(self.core)


@dataclass(frozen=True)
class LatencyTable:
    """Latencies in seconds, shape (architectures, unique ops); ``inverse`` maps graph rows.

    ``hbm_share``/``glb_share`` (same shape, in [0, 1]): the single-core op's fraction of the
    shared HBM / GLB bandwidth while it runs (module docstring); only single-core shares exist
    because an intra-op op never overlaps another op."""

    single_s: np.ndarray
    all_s: np.ndarray
    inverse: np.ndarray
    hbm_share: np.ndarray | None = None
    glb_share: np.ndarray | None = None

    def for_arch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(ℓ, ℓ̂) for every row of the graph on architecture ``i``."""
        return self.single_s[i, self.inverse], self.all_s[i, self.inverse]

    def shares_for_arch(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(hbm_share, glb_share) for every row of the graph on architecture ``i``."""
        if self.hbm_share is None or self.glb_share is None:
            raise ValueError("this LatencyTable has no bandwidth shares")
        return self.hbm_share[i, self.inverse], self.glb_share[i, self.inverse]

    def total_sequential_s(self) -> np.ndarray:
        """Sum of single-core latencies of all rows, per architecture (a sequential schedule)."""
        counts = np.bincount(self.inverse, minlength=self.single_s.shape[1])
        return self.single_s @ counts


CORE_SPLITS = ("B", "M", "N")  # the GEMM dimensions the cores may divide, in tie-break order


def _split_cycles(b, m, n, k, pe_x, pe_y, cores) -> tuple:
    """Array cycles (without the fill) of one core's share of a GEMM when ``cores`` cores divide the
    batch ``B``, the rows ``M`` or the output columns ``N`` (in the order of ``CORE_SPLITS``).

    Each core streams its rows through ``ceil(k/pe_x)·ceil(n/pe_y)`` weight tiles per batch element,
    ``max(rows, pe_x)`` cycles a tile (fewer rows than ``pe_x`` cannot hide the next tile's weight
    load). Only independent outputs are divided: splitting the reduction ``K`` over cores would need a
    cross-core reduction the template has no path for, so a GEMM with few batch elements, rows and
    column tiles (a GEMV on many cores) leaves cores idle. Works on numpy arrays and on numbers."""
    kt, nt = np.ceil(k / pe_x), np.ceil(n / pe_y)
    return (np.ceil(b / cores) * kt * nt * np.maximum(m, pe_x),
            b * kt * nt * np.maximum(np.ceil(m / cores), pe_x),
            b * kt * np.ceil(nt / cores) * np.maximum(m, pe_x))


def gemm_core_split(acc: Accelerator, b: int, m: int, n: int, k: int, cores: int | None = None) -> str:
    """Which GEMM dimension (``"B"``, ``"M"`` or ``"N"``) all ``cores`` (default ``acc.num_tc``) tensor
    cores divide in the all-cores latency ℓ̂: the one with the fewest cycles per core, the earlier of
    ``CORE_SPLITS`` on a tie. The ZigZag backend maps its cores the same way, so the two models
    are compared under one mapping."""
    c = acc.num_tc if cores is None else cores
    cyc = _split_cycles(float(b), float(m), float(n), float(k), float(acc.pe_x), float(acc.pe_y), float(c))
    return CORE_SPLITS[int(np.argmin([float(x) for x in cyc]))]


def _gemm_cycles(a: ArchArrays, ops: UniqueOps, cores: np.ndarray) -> np.ndarray:
    """Cycles of a GEMM on ``cores`` tensor cores: the best of dividing B, M or N (``_split_cycles``)
    plus one pipeline fill and drain; with one core the three coincide."""
    b, m, n, k = (x[None, :] for x in (ops.b, ops.m, ops.n, ops.k))
    by_b, by_m, by_n = _split_cycles(b, m, n, k, a.pe_x, a.pe_y, cores)
    return np.minimum(np.minimum(by_b, by_m), by_n) + a.pe_x + a.pe_y - 1


def latency_components(a: ArchArrays, ops: UniqueOps, link_bw: float, tmp: int,
                       all_cores: bool) -> dict[str, np.ndarray]:
    """The model's terms, each (A, U): ``gemm_cycles``, ``vector_cycles``, ``glb_cycles``,
    ``glb_words`` (words moved between GLB and cores; 0 for the AllReduce, which is charged no GLB
    time, and for shape-only ops), ``hbm_s`` and ``latency_s`` (how they combine: module docstring)."""
    one = np.ones_like(a.num_tc)
    tc = a.num_tc if all_cores else one
    vc = a.num_vc if all_cores else one
    fc = np.minimum(a.num_tc, a.num_vc) if all_cores else one
    core = ops.core[None, :]
    is_t, is_f, is_c = core == 1, core == 3, core == 4
    is_gemm = is_t | is_f
    bpe = a.bytes_per_element
    # --- compute
    gemm = np.where(is_gemm, _gemm_cycles(a, ops, np.where(is_f, fc, tc)), 0.0)
    lanes = a.pe_vc * np.where(is_f, fc, vc)
    vflops = ops.vector_flops[None, :]
    vec = np.where(vflops > 0, np.ceil(vflops / lanes) + C.VECTOR_PIPELINE_CYCLES, 0.0)
    compute = np.where(is_f, np.maximum(gemm, vec) + C.VECTOR_PIPELINE_CYCLES, gemm + vec)
    # --- data movement
    b, m, n, k = (x[None, :] for x in (ops.b, ops.m, ops.n, ops.k))
    act, wt, out = b * m * k * bpe, b * k * n * bpe, b * m * n * bpe
    operands = np.where(is_gemm, act + wt + out, 0.0)
    compulsory = np.maximum(ops.hbm_bytes[None, :], operands)
    spill = np.where(is_gemm & (operands > a.glb_bytes),
                     act * (np.ceil(wt / (a.glb_bytes / 2)) - 1), 0.0)
    hbm_s = (compulsory + spill) / a.hbm_bw
    glb_words = np.where(is_gemm, (act * np.ceil(n / a.pe_y) + wt + out) / bpe, ops.hbm_bytes[None, :] / bpe)
    port = a.glb_bw if all_cores else np.minimum(a.glb_bw, C.GLB_PORT_WORDS_PER_PE_EDGE *
                                                 np.maximum(a.pe_x, a.pe_y))
    glb = glb_words / port
    launch = C.OP_LAUNCH_CYCLES / a.clock_hz
    lat = np.maximum(np.maximum(compute, glb) / a.clock_hz, hbm_s) + launch
    # --- AllReduce over the TMP group: ring on the network, sums on the vector cores
    ring_s = collectives.allreduce_s(ops.hbm_bytes[None, :] / 2, tmp, link_bw)  # hbm_bytes = in + out
    lat = np.where(is_c, np.maximum(ring_s + vec / a.clock_hz, hbm_s) + launch, lat)
    lat = np.where(core == 0, 0.0, lat)
    glb_words = np.where(is_c | (core == 0), 0.0, glb_words)
    return {"gemm_cycles": gemm, "vector_cycles": vec, "glb_cycles": glb, "glb_words": glb_words,
            "hbm_s": hbm_s, "latency_s": lat}


SHARE_TOL = 1e-9  # relative slack allowed above 1 before ``bandwidth_shares`` calls it a bug


def bandwidth_shares(a: ArchArrays, comp: dict[str, np.ndarray], latency_s: np.ndarray | None = None,
                     cap_glb: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """(hbm_share, glb_share), each (A, U), of single-core ops from their ``latency_components``
    (``all_cores=False``): ``hbm_s / ℓ`` and ``glb_words / (glb_bw · clock · ℓ)``, 0 where ℓ = 0.

    ``latency_s`` replaces the analytical ℓ (the zigzag backend's GEMM latencies). Shares above 1
    beyond ``SHARE_TOL`` raise ``AssertionError`` (ℓ bounds both terms by construction), except the
    GLB share when ``cap_glb``: ZigZag's mapper may find more GLB reuse than the analytical count of
    ``glb_words``, so over a ZigZag latency that count can exceed the whole GLB's bandwidth; such an
    op is taken to saturate the GLB (share 1)."""
    lat = comp["latency_s"] if latency_s is None else latency_s
    pos = lat > 0
    safe = np.where(pos, lat, 1.0)
    hbm = np.where(pos, comp["hbm_s"] / safe, 0.0)
    glb = np.where(pos, comp["glb_words"] / (a.glb_bw * a.clock_hz * safe), 0.0)
    for name, x, capped in (("hbm_share", hbm, False), ("glb_share", glb, cap_glb)):
        if not capped and x.size and float(x.max()) > 1.0 + SHARE_TOL:
            raise AssertionError(f"{name} {float(x.max())} > 1: the latency model no longer bounds "
                                 "the op's traffic")
    return np.clip(hbm, 0.0, 1.0), np.clip(glb, 0.0, 1.0)


def estimate_latencies(g: OpGraph, archs: ArchArrays | list[Accelerator],
                       link_bw: float = C.PHAZE_LINK_BW_BYTES_PER_S) -> LatencyTable:
    """ℓ and ℓ̂ of every op of ``g`` on every architecture (seconds)."""
    if not isinstance(archs, ArchArrays):
        archs = ArchArrays.from_accelerators(list(archs))
    ops = UniqueOps.from_graph(g)
    tmp = int(g.meta.get("tmp", 1) or 1)
    comp = latency_components(archs, ops, link_bw, tmp, all_cores=False)
    every = latency_components(archs, ops, link_bw, tmp, all_cores=True)["latency_s"]
    hbm, glb = bandwidth_shares(archs, comp)
    return LatencyTable(comp["latency_s"], every, ops.inverse, hbm, glb)


def standalone_gemm_latency_s(acc: Accelerator, dims: tuple[int, int, int, int], all_cores: bool = False,
                              launch: bool = True) -> float:
    """Latency of one GEMM ``(b, m, n, k)`` with its operands in HBM (a linear's weight is shared by
    the batch when ``b == 1``); ``launch=False`` leaves out the fixed launch cost."""
    b, m, n, k = dims
    moved = float((b * m * k + b * k * n + b * m * n) * acc.bytes_per_element)
    ops = UniqueOps(core=np.array([1.0]), b=np.array([float(b)]), m=np.array([float(m)]),
                    n=np.array([float(n)]), k=np.array([float(k)]), vector_flops=np.zeros(1),
                    hbm_bytes=np.array([moved]), inverse=np.zeros(1, dtype=np.int64))
    lat = latency_components(ArchArrays.from_accelerators([acc]), ops, 1.0, 1, all_cores)["latency_s"]
    return float(lat[0, 0]) - (0.0 if launch else C.OP_LAUNCH_CYCLES / acc.clock_hz)
