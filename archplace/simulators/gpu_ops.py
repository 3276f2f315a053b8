"""Time of every op of a training graph on one GPU: roofline, calibrated on micro-benchmarks, or profiled.

Why three: the roofline (``max(flops / peak, bytes / HBM)``) is what the pipeline DP and the GDP simulator
always used; on a real H200 it is 1.9-3x optimistic for convolutions and eager attention and off by a
varying factor elsewhere (issue 30), which tilts placements. The calibrated model replaces the peaks by
what one GPU measured per op class; the profiled model takes measured times of the very graph.

**roofline**: ``max((flops - vector_flops) / peak(dtype) + vector_flops / vector_flops_per_s,
moved_bytes / hbm) + launch_s``; ``input`` rows without flops cost 0 when a launch is charged (the
place-ops simulator's rule, GDP issue 18). With the V100 at fp16 and ``launch_s = 0`` it is the pipeline
cost model of Auto-MAP (``simulators/pipeline.py``); with fp32 and 5 us it is place-ops'.

**calibrated** (data: ``hardware/calibration/<gpu>_microbench.json``, made by
``bench/gpu/h200_microbench.py``; median time of one call after warm-up, CUDA events):

- GEMM (``linear``/``matmul``; a batch that shares the weights folds into M): efficiency = measured
  FLOP/s / the GPU's datasheet peak, per dtype, trilinear in log2(M), log2(N), log2(K) over the measured
  grid (interpolating log efficiency: exact where time is flat in the dims, as for small GEMMs). Grid
  cells the benchmark skipped (too big) take a cubic fit in the log dims (:meth:`GemmGrid.fit`);
  dims outside the grid are clamped to its edge and counted in the note. bf16 data serve bf16 and fp16;
  fp32 data (TF32 off) serve fp32 and tf32 (the fp32 efficiency times the TF32 peak, said in the note).
  A backward GEMM (``derive_backward``'s dgrad / wgrad) is timed at its own dims.
- batched GEMM (``matmul`` with ``gemm_b > 1`` and no weights, the attention matmuls): the measured
  ``bmm`` efficiency, piecewise linear in log-log against the batched GEMM's flops (:func:`bmm_time_s`);
  at a measured bmm this returns the measurement.
- convolution: forward, the fp32 GEMM efficiency at its im2col dims times the ratio of the nearest
  measured conv2d (the *shape class*, nearest in log M, N, K of the im2col GEMM) to the GEMM grid;
  backward rows (dgrad, wgrad) the measured backward (fwd+bwd − fwd, on twice the forward flops)
  interpolated in the forward op's flops (:func:`conv_time_s`). Other dtypes carry the conv/GEMM
  ratio onto their own GEMM grid (the note says so).
- vector ops: achieved bandwidth (bytes moved = read + written) as a function of log bytes, piecewise
  linear in log-log per op class (binary: ``add``; transcendental: ``gelu``; other unary, copies and
  any other kind that is neither a GEMM nor free: ``mul_scalar``; norms: ``layer_norm_h1024``;
  softmax: ``softmax_h1024``; reductions: ``sum``), per dtype; clamped (and counted) outside
  2^10..2^28 elements; never faster than the vector-flop roofline.
- ``attention`` (fused, FlashAttention-style), bf16/fp16 where the GPU has measured
  ``scaled_dot_product_attention`` (``<gpu>_steps/sdpa_microbench.json``, :func:`sdpa_curves`): its GEMM
  flops at the measured kernel efficiency, piecewise linear in log-log against the forward GEMM flops
  (forward and backward curves; at a measured non-causal shape the measurement, shapes of equal flops
  at their geometric mean), or its bytes at HBM bandwidth if
  slower. Otherwise (fp32, or no such file): all its flops at the bmm efficiency of its gemm dims, or
  its bytes at HBM bandwidth if slower, plus one launch (the floor).
  Dilated and 1-D convolutions (WaveNet) go the same way, as their im2col GEMM (M = N·L_out,
  N = Cout, K = Cin·taps): the micro-benchmarks hold only dense 2-D convolutions, so no efficiency
  for dilation is measured and none is assumed (the graph does not record the dilation either); a
  dilated conv is timed as a dense one of the same GEMM dims. That is an assumption, and it is
  optimistic if cuDNN runs dilated kernels less efficiently: conv1d / dilated rows in ``microbench.py``
  are what would settle it.
- fp32 islands of a bf16 step (issue 44; the capture records them: ``models._capture_forward_graph``
  captures a bf16 run in bf16, so a dtype-changing cast is a ``copy`` and fp32 tensors count 4 bytes
  per element): a cast is a copy kernel, its bytes read and written (an upcast of N bf16 elements
  moves (2 + 4)·N) at the copy class's bandwidth. ``softmax(x, dtype=float32)`` on a bf16 ``x``
  (output wider than input) is two kernels in PyTorch, a cast and an fp32 softmax (only fp16 has a
  fused half-to-float kernel), so it costs the upcast (in + out bytes, copy class) plus the softmax
  reading and writing its fp32 output (fp32 softmax class); its gradient is the fp32 softmax backward
  (its grad and saved output read, an fp32 gradient written) plus the cast back (fp32 read, the input
  dtype written). :func:`widened_softmax`.
- the loss (``cross_entropy`` over the logits, ``models.append_loss``; N logits): what
  ``F.cross_entropy(logits.float(), labels)`` launches: forward an upcast (bpe·N + 4N bytes, copy
  class; none at fp32), ``log_softmax`` in fp32 (4N + 4N, fp32 softmax class) and ``nll_loss`` (one
  launch); backward the fp32 gradient zero-filled (4N written, copy class) with ``nll_loss``'s scatter
  (one launch), ``log_softmax``'s backward (8N read, 4N written) and the cast back (4N + bpe·N).
  :func:`loss_kernels`.
- view rows that run a copy (``workloads.view_copies``, from the graph's edges and node names): autograd's
  backward of ``split``/``chunk``/``unbind`` concatenates the gradients, and the backward of a
  ``view``/``reshape`` whose output reaches a GEMM through an odd number of ``transpose``/``permute``
  views (the split-heads view of Q and V) reshapes a gradient that arrives non-contiguous (the GEMM
  wrote it in the heads-first layout), so it copies: in + out bytes at the copy class. K, consumed
  through two transposes (Kᵀ), gets its gradient in its own layout and stays a view. On the H200
  profiles of OPT-350M, GPT-2 XL and BERT-large exactly the Q and V views' gradients took time.
- every op that runs a kernel costs at least the measured back-to-back per-call time
  (``launch.tiny_add_x100_s``, eager PyTorch's dispatch rate); ``view``, ``input`` and ``tp_copy`` cost 0
  (except the view rows ``workloads.view_copies`` names, in the calibrated model).

Each micro-benchmark entry is an isolated call: it includes the launch latency the GPU idles through
with nothing queued (an empty op: 24 us isolated, 11 us back to back). A training step keeps the queue
full, so that difference (``call_overhead_s``, 13 us) is taken off every measured time before the
efficiencies are computed, and the fit check adds it back to compare with the measurements. The conv
forward+backward timings also hold the fixed cost of one ``backward()`` call (the differences fwd+bwd −
fwd are nearly flat, 0.5-0.8 ms over 12x in flops); it is estimated as the median excess of that
difference over twice the forward kernel (0.30 ms on the H200) and taken off the backward times.

A GPU without its own measurement borrows the efficiencies of the nearest measured GPU (in log bf16 peak
and log HBM bandwidth) on its own peaks and bandwidth; the note says "scaled from h200 by peak ratios".
The launch floor stays the measured one: it is the eager framework's dispatch rate on the host, not a
property of the GPU (``GPUSpec.launch_s`` is the place-ops roofline's 5 us).

**profiled**: ``profile.times_for(graph)`` of an ``OpProfile`` (``workloads/op_profile.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..hardware.gpus import DTYPES, GPUS, GPUSpec
from ..workloads.ops import moved_bytes
from ..workloads.view_copies import view_copies

if TYPE_CHECKING:
    from ..workloads.graph import OpGraph
    from ..workloads.op_profile import OpProfile

OP_MODELS = ("roofline", "calibrated", "profiled")
CALIBRATION_DIR = Path(__file__).resolve().parents[1] / "hardware" / "calibration"
_DATA_DTYPE = {"bf16": "bf16", "fp16": "bf16", "tf32": "fp32", "fp32": "fp32"}
_BENCH_DTYPE = {"bfloat16": "bf16", "float32": "fp32"}
_BPE = {"bf16": 2, "fp32": 4}
# vector op kind -> micro-benchmark op class
VECTOR_CLASSES = ("add", "gelu", "mul_scalar", "layer_norm_h1024", "softmax_h1024", "sum")
_KIND_CLASS = {**dict.fromkeys(("add", "sub", "mul", "div", "where"), "add"),
               **dict.fromkeys(("gelu", "silu", "tanh", "sigmoid", "exp", "log", "rsqrt", "pow"), "gelu"),
               **dict.fromkeys(("layernorm", "batchnorm"), "layer_norm_h1024"),
               **dict.fromkeys(("softmax", "cross_entropy"), "softmax_h1024"),
               **dict.fromkeys(("mean", "sum"), "sum")}
_FREE_KINDS = ("view", "input", "tp_copy")
_COPY_CLASS = "mul_scalar"  # a cast or copy: one input read, one output written, no arithmetic
_SOFTMAX_CLASS = "softmax_h1024"
_RUN_BPE = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}
# forward view ops (fx name without its counter) whose autograd backward is a kernel
# bytes a micro-benchmarked vector op moves per element (inputs read + output written)
_TENSORS_MOVED = {"add": 3, "gelu": 2, "mul_scalar": 2, "layer_norm_h1024": 2, "softmax_h1024": 2,
                  "softmax": 2, "sum": 1}


@dataclass(frozen=True)
class OpTimes:
    """Seconds per graph row (forward and backward) under one op model, and what the model had to do."""

    time_s: np.ndarray
    op_model: str
    gpu: str
    dtype: str
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {"op_model": self.op_model, "gpu": self.gpu, "dtype": self.dtype, "note": self.note}


def check_op_model(op_model: str) -> str:
    if op_model not in OP_MODELS:
        raise ValueError(f"op_model is {op_model!r}; allowed: {list(OP_MODELS)}")
    return op_model


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"dtype is {dtype!r}; allowed: {list(DTYPES)}")
    return dtype


# ---------------------------------------------------------------------------------------------- roofline

def roofline_time_s(nodes: dict[str, np.ndarray], peak_flops_per_s: float, vector_flops_per_s: float,
                    hbm_bytes_per_s: float, launch_s: float = 0.0, zero_inputs: bool | None = None
                    ) -> np.ndarray:
    """``max((flops - vec) / peak + vec / vector, bytes / hbm) + launch_s``. One rate for both (fp32 on
    CUDA cores) divides the flops once, so place-ops' ``flops / peak`` stays bit-for-bit. ``zero_inputs``
    (default: when a launch is charged) gives ``input`` rows without flops 0 s."""
    flops = nodes["flops"].astype(float)
    if peak_flops_per_s == vector_flops_per_s:
        compute = flops / peak_flops_per_s
    else:
        vec = nodes["vector_flops"].astype(float)
        compute = (flops - vec) / peak_flops_per_s + vec / vector_flops_per_s
    t = np.maximum(compute, moved_bytes(nodes) / hbm_bytes_per_s)
    if launch_s:
        t = t + launch_s
    if zero_inputs if zero_inputs is not None else launch_s > 0:
        t = np.where((nodes["flops"] == 0) & (nodes["kind"] == "input"), 0.0, t)
    return t


# ------------------------------------------------------------------------------------- calibration data

def _cubic_features(lm, ln, lk) -> np.ndarray:
    """1 and every monomial of degree 1..3 in (log2 M, log2 N, log2 K) (centred at 2^10)."""
    x = [np.asarray(v, float) - 10.0 for v in (lm, ln, lk)]
    cols = [np.ones_like(x[0])]
    for p in itertools.product(range(4), repeat=3):
        if 0 < sum(p) <= 3:
            cols.append(x[0] ** p[0] * x[1] ** p[1] * x[2] ** p[2])
    return np.stack(cols, 1)


@dataclass(frozen=True)
class GemmGrid:
    """log efficiency on a full (log2 M, log2 N, log2 K) grid; ``measured`` marks the cells that were."""

    axes: tuple[np.ndarray, np.ndarray, np.ndarray]
    log_eff: np.ndarray
    measured: np.ndarray

    @classmethod
    def fit(cls, m, n, k, eff) -> GemmGrid:
        """Cells from points (M, N, K, efficiency); a cell the benchmark did not measure (too big, or held
        out) takes a cubic polynomial in (log2 M, log2 N, log2 K) fitted to the measured log efficiencies
        by least squares, clipped to the measured range, and no less than the best measured cell it
        dominates in every dim. On a held-out quarter of the H200 grid the cubic fill generalised best
        (6-8 % median error, against 21 % for harmonic interpolation between neighbours and 27 % for a
        two-way additive model; bench/gpu/gpu_calibration.py reports the number)."""
        lm, ln, lk = (np.log2(np.asarray(x, float)) for x in (m, n, k))
        le = np.log(np.asarray(eff, float))
        axes = tuple(np.unique(a) for a in (lm, ln, lk))
        shape = tuple(len(a) for a in axes)
        idx = tuple(np.searchsorted(a, v) for a, v in zip(axes, (lm, ln, lk)))
        vals = np.zeros(shape)
        cnt = np.zeros(shape)
        np.add.at(vals, idx, le)
        np.add.at(cnt, idx, 1)
        measured = cnt > 0
        vals[measured] /= cnt[measured]
        if not measured.all():
            X = _cubic_features(lm, ln, lk)
            w = np.linalg.solve(X.T @ X + 1e-6 * np.eye(X.shape[1]), X.T @ le)
            gm, gn, gk = (g.ravel() for g in np.meshgrid(*axes, indexing="ij"))
            fill = np.clip(_cubic_features(gm, gn, gk) @ w, le.min(), le.max()).reshape(shape)
            # a GEMM at least as large in every dim runs at least as efficiently as the best measured
            # one it dominates (a cubic extrapolates badly into the corner of the biggest GEMMs)
            for cell in zip(*np.nonzero(~measured)):
                below = measured.copy()
                for ax, i in enumerate(cell):
                    sl = [slice(None)] * 3
                    sl[ax] = slice(i + 1, None)
                    below[tuple(sl)] = False
                if below.any():
                    fill[cell] = max(fill[cell], vals[below].max())
            vals[~measured] = fill[~measured]
        return cls(axes, vals, measured)

    def efficiency(self, m, n, k) -> tuple[np.ndarray, np.ndarray]:
        """(efficiency, clamped?) at each (M, N, K): trilinear in log2 dims over log efficiency."""
        pts = [np.log2(np.maximum(np.asarray(x, float), 1.0)) for x in (m, n, k)]
        clamped = np.zeros(np.shape(pts[0]), bool)
        lo_idx, frac = [], []
        for a, p in zip(self.axes, pts):
            clamped |= (p < a[0] - 1e-9) | (p > a[-1] + 1e-9)
            p = np.clip(p, a[0], a[-1])
            if len(a) == 1:
                lo_idx.append(np.zeros(p.shape, int))
                frac.append(np.zeros(p.shape))
                continue
            i = np.clip(np.searchsorted(a, p, side="right") - 1, 0, len(a) - 2)
            lo_idx.append(i)
            frac.append((p - a[i]) / (a[i + 1] - a[i]))
        out = np.zeros(np.shape(pts[0]))
        for corner in range(8):
            w = np.ones(np.shape(pts[0]))
            ix = []
            for ax in range(3):
                up = (corner >> ax) & 1
                size = len(self.axes[ax])
                ix.append(np.minimum(lo_idx[ax] + up, size - 1))
                w = w * (frac[ax] if up else 1.0 - frac[ax])
            out += w * self.log_eff[tuple(ix)]
        return np.exp(out), clamped


@dataclass(frozen=True)
class Calibration:
    """One GPU's micro-benchmarks, reduced to efficiencies (see the module docstring)."""

    gpu: str  # preset name
    device_name: str
    source: str  # file name
    raw: dict
    gemm: dict[str, GemmGrid]  # data dtype ("bf16", "fp32") -> grid
    bmm_curve: tuple[np.ndarray, np.ndarray]  # bf16 batched GEMMs: log flops (sorted), log efficiency
    conv_log_dims: np.ndarray  # [C, 3] log2 (M, N, K) of the forward im2col GEMM
    conv_fwd_ratio: np.ndarray  # [C] forward efficiency / fp32 GEMM-grid efficiency at those dims
    conv_bwd_curve: tuple[np.ndarray, np.ndarray]  # log forward flops (sorted), log backward efficiency
    vector: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]  # (class, dtype) -> log bytes, log B/s
    floor_s: float  # back-to-back per-call time of an empty op: the least any op costs in a stream
    call_overhead_s: float  # what an isolated call costs beyond that (taken off every measurement)
    backward_call_s: float  # fixed cost of one backward() call in the conv forward+backward timings
    # measured scaled_dot_product_attention (``<gpu>_steps/sdpa_microbench.json``, non-causal shapes):
    # log forward GEMM flops (sorted) -> log efficiency of the forward kernel and of the backward kernels
    # (on 2.5x those flops); None where the GPU has no such file
    sdpa_fwd_curve: tuple[np.ndarray, np.ndarray] | None = None
    sdpa_bwd_curve: tuple[np.ndarray, np.ndarray] | None = None
    sdpa_source: str | None = None

    @property
    def spec(self) -> GPUSpec:
        return GPUS[self.gpu]


def call_overhead_s(raw: dict) -> float:
    """An isolated call (each micro-benchmark entry) costs ``tiny_add_s``; in a stream of ops the same
    empty op costs ``tiny_add_x100_s``. The difference (13 us on the H200 host) is the launch latency the
    GPU idles through when nothing is queued; a training step keeps the queue full, so it is taken off
    every measured time."""
    return max(float(raw["launch"]["tiny_add_s"]) - float(raw["launch"]["tiny_add_x100_s"]), 0.0)


def gemm_points(raw: dict, spec: GPUSpec) -> dict[str, tuple[np.ndarray, ...]]:
    """Data dtype -> (M, N, K, efficiency, seconds) of the measured GEMMs (streamed time: the isolated
    call's extra latency taken off)."""
    out = {}
    o = call_overhead_s(raw)
    for bdt, dt in _BENCH_DTYPE.items():
        rows = [g for g in raw["gemm"] if g["dtype"] == bdt]
        m, n, k, s = (np.array([g[c] for g in rows], float) for c in ("m", "n", "k", "s"))
        out[dt] = (m, n, k, 2 * m * n * k / (s - o) / spec.peak(dt), s)
    return out


def conv_gemm_dims(c: dict) -> tuple[int, int, int]:
    """im2col GEMM of a benchmarked conv2d (padding k // 2): M = N·Ho·Wo, N = Cout, K = Cin·k²."""
    ho = (c["hw"] + 2 * (c["k"] // 2) - c["k"]) // c["stride"] + 1
    return c["n"] * ho * ho, c["cout"], c["cin"] * c["k"] ** 2


def build_calibration(raw: dict, gpu: str, source: str, holdout: np.ndarray | None = None) -> Calibration:
    """Efficiencies from one micro-benchmark file; ``holdout`` masks GEMM points (in file order) out of
    the grid fit (the generalisation check of ``bench/gpu/gpu_calibration.py``)."""
    spec = GPUS[gpu]
    o = call_overhead_s(raw)
    pts = gemm_points(raw, spec)
    keep = np.ones(len(raw["gemm"]), bool) if holdout is None else ~np.asarray(holdout, bool)
    order = {dt: np.array([i for i, g in enumerate(raw["gemm"]) if _BENCH_DTYPE[g["dtype"]] == dt])
             for dt in pts}
    gemm = {dt: GemmGrid.fit(*(a[keep[order[dt]]] for a in pts[dt][:4])) for dt in pts}
    bmm = raw.get("bmm", [])
    b, m, n, k, s = (np.array([e[c] for e in bmm], float) for c in ("b", "m", "n", "k", "s"))
    bmm_flops = 2 * b * m * n * k
    bmm_curve = _curve(np.log(bmm_flops), np.log(bmm_flops / (s - o) / spec.peak("bf16")))
    convs = raw.get("conv2d", [])
    cdims = np.array([conv_gemm_dims(c) for c in convs], float).reshape(-1, 3)
    fl = np.array([c["fwd_flops"] for c in convs], float)
    fwd_s = np.array([c["fwd_s"] for c in convs], float) - o
    bwd_s = np.array([c["fwd_bwd_s"] - c["fwd_s"] for c in convs], float)
    # fwd+bwd - fwd also holds the fixed cost of a backward() call (the measured differences are nearly
    # flat, 0.5-0.8 ms over 12x in flops): the median excess over twice the forward kernel time
    bwd_call = max(float(np.median(bwd_s - 2 * fwd_s)), 0.0) if len(convs) else 0.0
    floor = float(raw["launch"]["tiny_add_x100_s"])
    bwd_s = np.maximum(bwd_s - bwd_call, 2 * floor)
    geff = gemm["fp32"].efficiency(*cdims.T)[0] if len(convs) else np.zeros(0)
    peak32 = spec.peak("fp32")
    conv_fwd_ratio = fl / fwd_s / peak32 / geff
    conv_bwd_curve = _curve(np.log(fl), np.log(2 * fl / bwd_s / peak32))
    vector = {}
    for cls_ in VECTOR_CLASSES:
        for bdt, dt in _BENCH_DTYPE.items():
            rows = sorted((e["numel"], e["s"]) for e in raw["elementwise"] if e["op"] == cls_
                          and e["dtype"] == bdt)
            if rows:
                numel, sec = np.array(rows, float).T
                by = numel * _BPE[dt] * _TENSORS_MOVED[cls_]
                vector[(cls_, dt)] = (np.log(by), np.log(by / (sec - o)))
    return Calibration(gpu, raw.get("gpu", ""), source, raw, gemm, bmm_curve, np.log2(cdims), conv_fwd_ratio,
                       conv_bwd_curve, vector, floor, o, bwd_call)


def _curve(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique x, mean y at each) for ``np.interp``."""
    ux, inv = np.unique(x, return_inverse=True)
    return ux, np.bincount(inv, weights=y) / np.bincount(inv)


def _on_curve(curve: tuple[np.ndarray, np.ndarray], x) -> tuple[np.ndarray, np.ndarray]:
    """exp of the piecewise-linear curve at ``x`` (clamped at its ends), and whether it was clamped."""
    x = np.asarray(x, float)
    return np.exp(np.interp(x, *curve)), (x < curve[0][0] - 1e-9) | (x > curve[0][-1] + 1e-9)


def calibration_files() -> dict[str, Path]:
    """GPU preset -> its measured micro-benchmark file in ``hardware/calibration``."""
    return {p.name[: -len("_microbench.json")]: p for p in sorted(CALIBRATION_DIR.glob("*_microbench.json"))
            if p.name[: -len("_microbench.json")] in GPUS}


def sdpa_curves(raw: dict, spec: GPUSpec, call_overhead: float, floor: float
                ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], float]:
    """(forward curve, backward curve, backward-call cost) from ``bench/gpu/gpu_sdpa_microbench.py``'s rows.

    Only the non-causal rows: the training graph charges a fused attention its full N×N GEMM flops
    (``attention_fusion.fuse_attention`` does not know a mask is causal), so a causal model's fused
    attention is timed as the non-causal kernel of its shape (the measured causal kernels take 0.5-0.9x
    of that). Forward: ``4 b N² d`` flops over (``sdpa_fwd_s`` less the isolated-call latency).
    Backward: 2.5x those flops (five GEMMs against two) over ``sdpa_fwd_bwd_s - sdpa_fwd_s`` less the
    fixed cost of the ``backward()`` call, estimated as the least excess of that difference over 2.5x
    the forward kernel (an upper bound if the backward kernels are never faster per flop than the
    forward one: 98 us on the H200; the conv timings' 0.30 ms would leave small shapes negative)."""
    rows = [r for r in raw["rows"] if not r.get("causal") and r.get("dtype", "bfloat16") == "bfloat16"]
    if not rows:
        raise ValueError("sdpa micro-benchmark file has no non-causal bf16 rows")
    b, n, d = (np.array([r[c] for r in rows], float) for c in ("batch_heads", "seq", "head_dim"))
    gf = 4.0 * b * n * n * d
    fwd = np.maximum(np.array([r["sdpa_fwd_s"] for r in rows], float) - call_overhead, floor)
    bwd = np.array([r["sdpa_fwd_bwd_s"] - r["sdpa_fwd_s"] for r in rows], float)
    bwd_call = max(float(np.min(bwd - 2.5 * fwd)), 0.0)
    bwd = np.maximum(bwd - bwd_call, 2 * floor)
    peak = spec.peak("bf16")
    return (_curve(np.log(gf), np.log(gf / fwd / peak)), _curve(np.log(gf), np.log(2.5 * gf / bwd / peak)),
            bwd_call)


@lru_cache(maxsize=8)
def load_calibration(gpu: str) -> Calibration:
    path = calibration_files().get(gpu)
    if path is None:
        raise ValueError(f"gpu {gpu!r} has no calibration file; measured: {sorted(calibration_files())}")
    cal = build_calibration(json.loads(path.read_text()), gpu, path.name)
    sdpa = CALIBRATION_DIR / f"{gpu}_steps" / "sdpa_microbench.json"
    if sdpa.exists():
        fwd, bwd, _ = sdpa_curves(json.loads(sdpa.read_text()), cal.spec, cal.call_overhead_s, cal.floor_s)
        cal = dataclasses.replace(cal, sdpa_fwd_curve=fwd, sdpa_bwd_curve=bwd,
                                  sdpa_source=f"{sdpa.parent.name}/{sdpa.name}")
    return cal


def default_op_model(gpu: GPUSpec) -> str:
    """``calibrated`` where a measured calibration file exists for this GPU, else ``roofline``."""
    return "calibrated" if gpu.name in calibration_files() else "roofline"


def nearest_measured(gpu: GPUSpec) -> str:
    """The measured GPU closest in log bf16 peak and log HBM bandwidth (itself if measured)."""
    files = calibration_files()
    if not files:
        raise ValueError(f"op_model 'calibrated' needs a calibration file in {CALIBRATION_DIR}; none found")
    if gpu.name in files:
        return gpu.name

    def dist(name: str) -> float:
        o = GPUS[name]
        return abs(np.log(o.peak("bf16") / gpu.peak("bf16"))) + \
            abs(np.log(o.hbm_bytes_per_s / gpu.hbm_bytes_per_s))
    return min(sorted(files), key=dist)


# -------------------------------------------------------------------------------------- calibrated times

def gemm_time_s(cal: Calibration, spec: GPUSpec, dtype: str, m, n, k, flops) -> tuple[np.ndarray, np.ndarray]:
    eff, cl = cal.gemm[_DATA_DTYPE[dtype]].efficiency(m, n, k)
    return np.asarray(flops, float) / (eff * spec.peak(dtype)), cl


def bmm_time_s(cal: Calibration, spec: GPUSpec, dtype: str, b, m, n, k, flops
               ) -> tuple[np.ndarray, np.ndarray]:
    """``flops`` at the measured bmm efficiency of a batched GEMM of (b, M, N, K)'s flops (log-log
    interpolation; one ``bmm`` left out at a time, this predicts it within 9 % median, against 35 % for
    the nearest measured shape). fp32 data: times the fp32 / bf16 GEMM-grid efficiency at (b·M, N, K)."""
    b, m, n, k = (np.asarray(x, float) for x in (b, m, n, k))
    eff, cl = _on_curve(cal.bmm_curve, np.log(np.maximum(2 * b * m * n * k, 1.0)))
    if _DATA_DTYPE[dtype] != "bf16":
        e32, c32 = cal.gemm["fp32"].efficiency(b * m, n, k)
        eff = eff * e32 / cal.gemm["bf16"].efficiency(b * m, n, k)[0]
        cl = cl | c32
    return np.asarray(flops, float) / (eff * spec.peak(dtype)), cl


def conv_time_s(cal: Calibration, spec: GPUSpec, dtype: str, m, n, k, fwd_flops, flops, backward
                ) -> tuple[np.ndarray, np.ndarray]:
    """``m, n, k``, ``fwd_flops``: the forward op's im2col dims and flops; ``flops``: the row's own.
    Forward: the fp32 GEMM grid at its dims times the conv/GEMM ratio of the nearest measured conv (its
    shape class). Backward: the measured backward efficiency (less the ``backward()`` call's cost)
    interpolated in log forward flops (leave-one-out over the nine shapes: 15 % median with the forward
    rows, against 50 % for the nearest shape). Other dtypes: times their GEMM grid's efficiency over
    the fp32 grid's at those dims."""
    dims = [np.asarray(x, float) for x in (m, n, k)]
    backward = np.asarray(backward, bool)
    g32, cl = cal.gemm["fp32"].efficiency(*dims)
    q = np.log2(np.maximum(np.stack(dims, -1), 1.0))
    near = np.argmin(np.abs(q[..., None, :] - cal.conv_log_dims).sum(-1), axis=-1)
    fwd_eff = g32 * cal.conv_fwd_ratio[near]
    bwd_eff, bcl = _on_curve(cal.conv_bwd_curve, np.log(np.maximum(np.asarray(fwd_flops, float), 1.0)))
    eff = np.where(backward, bwd_eff, fwd_eff)
    cl = cl | (backward & bcl)
    if _DATA_DTYPE[dtype] != "fp32":
        eff = eff * cal.gemm[_DATA_DTYPE[dtype]].efficiency(*dims)[0] / g32
    return np.asarray(flops, float) / (eff * spec.peak(dtype)), cl


def vector_time_s(cal: Calibration, spec: GPUSpec, dtype: str, cls_, moved) -> tuple[np.ndarray, np.ndarray]:
    """Bytes moved at the achieved bandwidth of the op class at that size (scaled by the HBM ratio)."""
    cls_ = np.asarray(cls_, object)
    moved = np.asarray(moved, float)
    t = np.zeros(moved.shape)
    cl = np.zeros(moved.shape, bool)
    hbm_ratio = spec.hbm_bytes_per_s / cal.spec.hbm_bytes_per_s
    lb = np.log(np.maximum(moved, 1.0))
    for c in np.unique(cls_):
        sel = cls_ == c
        xs, ys = cal.vector[(c, _DATA_DTYPE[dtype])]
        t[sel] = moved[sel] / (np.exp(np.interp(lb[sel], xs, ys)) * hbm_ratio)
        cl[sel] = (lb[sel] < xs[0] - 1e-9) | (lb[sel] > xs[-1] + 1e-9)
    return t, cl


def _kernels_s(cal: Calibration, spec: GPUSpec, parts) -> np.ndarray:
    """Summed seconds of a chain of memory-bound kernels, each ``(class, data dtype, bytes moved)`` at
    its class's achieved bandwidth and at least one launch floor."""
    total = 0.0
    for cls_, dt, by in parts:
        by = np.asarray(by, float)
        t, _ = vector_time_s(cal, spec, dt, np.full(by.shape, cls_, object), by)
        total = total + np.maximum(t, cal.floor_s)
    return np.asarray(total, float)


def widened_softmax(cal: Calibration, spec: GPUSpec, dtype: str, in_b, out_b, backward, grad_in_b=None
                    ) -> np.ndarray:
    """``softmax(x, dtype=float32)`` on a narrower ``x`` (forward ``in_b`` < ``out_b`` bytes): forward the
    upcast (in + out bytes, copy class) then the fp32 softmax (out read and written, fp32 softmax
    class); backward (``grad_in_b``: the fp32 gradient and saved output it reads) the fp32 softmax
    backward writing an fp32 gradient of ``out_b`` bytes, then the cast back (``out_b`` + ``in_b``)."""
    in_b, out_b = np.asarray(in_b, float), np.asarray(out_b, float)
    backward = np.asarray(backward, bool)
    fwd = _kernels_s(cal, spec, [(_COPY_CLASS, dtype, in_b + out_b), (_SOFTMAX_CLASS, "fp32", 2 * out_b)])
    if grad_in_b is None:
        grad_in_b = 2 * out_b
    bwd = _kernels_s(cal, spec, [(_SOFTMAX_CLASS, "fp32", np.asarray(grad_in_b, float) + out_b),
                                 (_COPY_CLASS, dtype, out_b + in_b)])
    return np.where(backward, bwd, fwd)


def loss_kernels(cal: Calibration, spec: GPUSpec, dtype: str, logits_b, backward) -> np.ndarray:
    """Seconds of ``F.cross_entropy(logits.float(), labels)`` over ``logits_b`` bytes of logits in
    ``dtype`` (N = logits_b / bpe elements), forward or backward (module docstring)."""
    bpe = _RUN_BPE[dtype]
    n = np.asarray(logits_b, float) / bpe
    cast = [(_COPY_CLASS, dtype, (bpe + 4) * n)] if bpe < 4 else []
    launch = np.full(n.shape, cal.floor_s)
    fwd = _kernels_s(cal, spec, cast + [(_SOFTMAX_CLASS, "fp32", 8 * n)]) + launch  # + nll_loss
    bwd = _kernels_s(cal, spec, [(_COPY_CLASS, dtype, 4 * n), (_SOFTMAX_CLASS, "fp32", 12 * n)]
                     + cast) + launch  # + nll_loss's scatter
    return np.where(np.asarray(backward, bool), bwd, fwd)


def calibrated_times(nodes: dict[str, np.ndarray], spec: GPUSpec, dtype: str,
                     copies: np.ndarray | None = None) -> tuple[np.ndarray, str]:
    """Per-row seconds and the note (see the module docstring). ``copies``: view rows that run a copy
    kernel (``workloads.view_copies``; None: none)."""
    src = nearest_measured(spec)
    cal = load_calibration(src)
    n = len(nodes["flops"])
    kind = nodes["kind"].astype(object)
    core = nodes["core"].astype(object)
    flops = nodes["flops"].astype(float)
    vec = nodes["vector_flops"].astype(float)
    b, m, nn, k = (nodes[c].astype(float) for c in ("gemm_b", "gemm_m", "gemm_n", "gemm_k"))
    moved = moved_bytes(nodes)
    t = np.zeros(n)
    clamped = np.zeros(n, bool)
    free = np.isin(kind, _FREE_KINDS) | (core == "none") & (kind != "profiled")
    copy_views = np.zeros(n, bool) if copies is None else np.asarray(copies, bool) & free
    free = free & ~copy_views
    tensor = np.isin(core, ("tensor", "fused")) & ~free
    att = tensor & (kind == "attention")
    conv = tensor & (kind == "conv")
    bmm = tensor & ~att & ~conv & (kind == "matmul") & (b > 1) & (nodes["weight_bytes"] == 0)
    gemm = tensor & ~att & ~conv & ~bmm
    vector = ~free & ~tensor
    gf = flops - vec  # the GEMM part of a fused tensor + vector op
    vec_s = vec / spec.vector_flops_per_s
    if gemm.any():
        tg, c = gemm_time_s(cal, spec, dtype, b[gemm] * m[gemm], nn[gemm], k[gemm], gf[gemm])
        t[gemm], clamped[gemm] = tg + vec_s[gemm], c
    if bmm.any():
        tb, c = bmm_time_s(cal, spec, dtype, b[bmm], m[bmm], nn[bmm], k[bmm], gf[bmm])
        t[bmm], clamped[bmm] = tb + vec_s[bmm], c
    sdpa = att.any() and cal.sdpa_fwd_curve is not None and _DATA_DTYPE[dtype] == "bf16"
    if sdpa:
        # the measured fused kernels (their launch is in the measurement): the GEMM flops at the measured
        # efficiency of that size, forward or backward
        bw = nodes["is_backward"][att].astype(bool)
        gfa = np.where(bw, gf[att] / 2.5, gf[att])  # the forward GEMM flops the curves are keyed on
        x = np.log(np.maximum(gfa, 1.0))
        ef, cf = _on_curve(cal.sdpa_fwd_curve, x)
        eb, cb = _on_curve(cal.sdpa_bwd_curve, x)
        ta = gf[att] / (np.where(bw, eb, ef) * spec.peak(dtype))
        t[att], clamped[att] = np.maximum(ta, moved[att] / spec.hbm_bytes_per_s), np.where(bw, cb, cf)
    elif att.any():
        ta, c = bmm_time_s(cal, spec, dtype, b[att], m[att], nn[att], k[att], flops[att])
        t[att], clamped[att] = np.maximum(ta, moved[att] / spec.hbm_bytes_per_s) + cal.floor_s, c
    if conv.any():
        rows = np.flatnonzero(conv)
        fwd_dims = np.stack([b * m, nn, k, gf], 1)  # im2col dims and flops of the forward op
        bwd = nodes["is_backward"][rows].astype(bool)
        if bwd.any():
            row_of_id = {int(i): r for r, i in enumerate(nodes["id"])}
            owner = np.array([row_of_id.get(int(i), -1) for i in nodes["fwd_id"][rows]])
            use = bwd & (owner >= 0)
            fwd_dims[rows[use]] = fwd_dims[owner[use]]
        d = fwd_dims[rows]
        tc, c = conv_time_s(cal, spec, dtype, d[:, 0], d[:, 1], d[:, 2], d[:, 3], gf[rows], bwd)
        t[rows], clamped[rows] = tc + vec_s[rows], c
    if vector.any():
        cls_ = np.array([_KIND_CLASS.get(x, "mul_scalar") for x in kind[vector]], object)
        tv, c = vector_time_s(cal, spec, dtype, cls_, moved[vector])
        t[vector], clamped[vector] = np.maximum(tv, vec_s[vector]), c
    is_bwd = nodes["is_backward"].astype(bool)
    owner = np.full(n, -1)
    if is_bwd.any():
        row_of_id = {int(i): r for r, i in enumerate(nodes["id"])}
        owner[is_bwd] = [row_of_id.get(int(i), -1) for i in nodes["fwd_id"][is_bwd]]
    inb, outb = nodes["input_bytes"].astype(float), nodes["output_bytes"].astype(float)
    sm_f = vector & (kind == "softmax") & ~is_bwd & (outb > inb)
    sm_b = vector & (kind == "softmax") & is_bwd & (owner >= 0)
    sm_b[sm_b] = sm_f[owner[sm_b]]
    if sm_f.any():
        t[sm_f] = widened_softmax(cal, spec, dtype, inb[sm_f], outb[sm_f], np.zeros(int(sm_f.sum()), bool))
    if sm_b.any():
        o = owner[sm_b]
        t[sm_b] = widened_softmax(cal, spec, dtype, inb[o], outb[o], np.ones(len(o), bool), inb[sm_b])
    loss = vector & (kind == "cross_entropy")
    if loss.any():
        logits = np.where(is_bwd & (owner >= 0), inb[np.maximum(owner, 0)], inb)[loss]
        t[loss] = loss_kernels(cal, spec, dtype, logits, is_bwd[loss])
    if copy_views.any():
        t[copy_views] = _kernels_s(cal, spec, [(_COPY_CLASS, dtype, moved[copy_views])])
    t = np.where(free, 0.0, np.maximum(t, cal.floor_s))
    parts = [f"calibrated: measured on {cal.device_name} ({cal.source})" if src == spec.name else
             f"calibrated: scaled from {src} by peak ratios ({_DATA_DTYPE[dtype]} data at {dtype} "
             f"x{spec.peak(dtype) / cal.spec.peak(_DATA_DTYPE[dtype]):.2f}, HBM "
             f"x{spec.hbm_bytes_per_s / cal.spec.hbm_bytes_per_s:.2f}; {cal.source})"]
    if dtype != _DATA_DTYPE[dtype]:
        parts.append(f"{dtype} uses the {_DATA_DTYPE[dtype]} efficiencies on the {dtype} peak")
    if sdpa:
        parts.append(f"fused attention: measured scaled_dot_product_attention ({cal.sdpa_source}, "
                     "non-causal kernels, also for causal masks)")
    if sm_f.any():
        parts.append(f"{int(sm_f.sum())} softmax(es) widened to fp32: upcast + fp32 softmax")
    if loss.any():
        parts.append("loss: upcast, fp32 log_softmax and nll_loss kernels" if _RUN_BPE[dtype] < 4 else
                     "loss: fp32 log_softmax and nll_loss kernels")
    if copy_views.any():
        parts.append(f"{int(copy_views.sum())} view gradients that copy (split-heads, split) at their bytes")
    if conv.any() and _DATA_DTYPE[dtype] != "fp32":
        parts.append("convolutions: fp32-measured conv/GEMM ratio on the bf16 GEMM grid")
    if (bmm.any() or att.any()) and _DATA_DTYPE[dtype] != "bf16":
        parts.append("batched GEMMs: bf16-measured bmm efficiency times the fp32/bf16 GEMM-grid ratio")
    nc = int(clamped.sum())
    parts.append(f"{nc} of {int((~free).sum())} timed ops outside the measured sizes (clamped to the edge)")
    parts.append(f"launch floor {cal.floor_s * 1e6:.1f} us per op; isolated-call latency "
                 f"{cal.call_overhead_s * 1e6:.1f} us taken off the measurements")
    return t, "; ".join(parts)


# ------------------------------------------------------------------------------------------- the entry

def load_profile(path: str) -> OpProfile:
    """An ``OpProfile`` JSON (``archplace profile --out FILE``); one-line errors come from its loader."""
    try:
        from ..workloads.op_profile import OpProfile
    except ImportError as e:  # the profile module arrives with `archplace profile` (issue 30)
        raise ValueError(f"profile {path!r}: op profiles are not available in this build ({e})") from None
    return OpProfile.load(path)


def gpu_op_times(graph: OpGraph, gpu: GPUSpec, *, dtype: str, op_model: str | None = None,
                 profile: OpProfile | None = None, launch_s: float = 0.0,
                 zero_inputs: bool | None = None) -> OpTimes:
    """Seconds of every row of ``graph`` on ``gpu`` in ``dtype``. ``op_model`` None: ``profiled`` if a
    profile is given, else :func:`default_op_model`. ``launch_s`` and ``zero_inputs`` apply to the
    roofline (the calibrated model has its measured floor)."""
    check_dtype(dtype)
    if op_model is None:
        op_model = "profiled" if profile is not None else default_op_model(gpu)
    check_op_model(op_model)
    if profile is not None and op_model != "profiled":
        raise ValueError(f"op_model is {op_model!r} but a profile was given; a profile implies 'profiled'")
    nodes = graph.nodes
    if op_model == "roofline":
        t = roofline_time_s(nodes, gpu.peak(dtype), gpu.vector_flops_per_s, gpu.hbm_bytes_per_s, launch_s,
                            zero_inputs)
        note = f"roofline: datasheet peaks of {gpu.label} ({gpu.source})"
    elif op_model == "calibrated":
        t, note = calibrated_times(nodes, gpu, dtype, copies=view_copies(graph))
    else:
        if profile is None:
            raise ValueError("op_model 'profiled' needs a profile (--profile FILE)")
        t = np.asarray(profile.times_for(graph), float)
        if t.shape != (graph.num_nodes,):
            raise ValueError(f"profile times have shape {t.shape}, expected ({graph.num_nodes},)")
        note = (f"profiled: {profile.model} measured on {profile.device_name} ({profile.dtype}, "
                f"mbs {profile.mbs}); coverage {profile.coverage:.1%}")
        if profile.dtype != dtype:
            note += f"; the profile's dtype {profile.dtype} differs from the requested {dtype}"
        if profile.device_name and gpu.label not in profile.device_name and \
                profile.device_name not in gpu.label:
            note += f"; measured on {profile.device_name}, not on {gpu.label}"
    return OpTimes(t, op_model, gpu.name, dtype, note)
