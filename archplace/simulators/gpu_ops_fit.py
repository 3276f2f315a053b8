"""How well the calibrated op model fits its own micro-benchmarks (``bench/gpu/gpu_calibration.py``, tests):
every micro-benchmark point predicted with the functions the op model uses, and a hold-out refit of
the GEMM grids. Kept apart from ``gpu_ops.py``, which times graphs."""

from __future__ import annotations

import numpy as np

from .gpu_ops import (
    _BENCH_DTYPE,
    _BPE,
    _TENSORS_MOVED,
    VECTOR_CLASSES,
    Calibration,
    bmm_time_s,
    build_calibration,
    conv_gemm_dims,
    conv_time_s,
    gemm_time_s,
    vector_time_s,
)


def holdout_mask(n: int, seed: int = 0) -> np.ndarray:
    """A quarter of ``n`` points: every 4th of a seeded permutation."""
    mask = np.zeros(n, bool)
    mask[np.random.default_rng(seed).permutation(n)[::4]] = True
    return mask


def microbench_errors(cal: Calibration) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """family -> (predicted, measured) seconds of every micro-benchmark point, predicted by ``cal`` on its
    own GPU with the functions the op model uses (and its launch floor). ``softmax_attention`` (softmax over
    attention-score rows of 512-4096) is not fitted: it checks the ``softmax_h1024`` curve."""
    raw, spec = cal.raw, cal.spec
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    m, n, k, s = (np.array([g[c] for g in raw["gemm"]], float) for c in ("m", "n", "k", "s"))
    dts = [_BENCH_DTYPE[g["dtype"]] for g in raw["gemm"]]
    pred = np.array([gemm_time_s(cal, spec, dt, mi, ni, ki, 2 * mi * ni * ki)[0] for dt, mi, ni, ki
                     in zip(dts, m, n, k)], float)
    out["gemm"] = (pred, s)
    b, m, n, k, s = (np.array([e[c] for e in raw["bmm"]], float) for c in ("b", "m", "n", "k", "s"))
    out["bmm"] = (bmm_time_s(cal, spec, "bf16", b, m, n, k, 2 * b * m * n * k)[0], s)
    for fam, ops in (("elementwise", VECTOR_CLASSES), ("softmax_attention", ("softmax",))):
        rows = [e for e in raw["elementwise"] if e["op"] in ops]
        pred = []
        for e in rows:
            dt = _BENCH_DTYPE[e["dtype"]]
            by = e["numel"] * _BPE[dt] * _TENSORS_MOVED[e["op"]]
            cls_ = "softmax_h1024" if e["op"] == "softmax" else e["op"]
            pred.append(vector_time_s(cal, spec, dt, np.array([cls_], object), np.array([by]))[0][0])
        out[fam] = (np.array(pred, float), np.array([e["s"] for e in rows], float))
    convs = raw["conv2d"]
    d = np.array([conv_gemm_dims(c) for c in convs], float)
    fl = np.array([c["fwd_flops"] for c in convs], float)
    fwd = conv_time_s(cal, spec, "fp32", *d.T, fl, fl, np.zeros(len(fl), bool))[0]
    bwd = conv_time_s(cal, spec, "fp32", *d.T, fl, 2 * fl, np.ones(len(fl), bool))[0]
    out["conv"] = (np.concatenate([fwd, bwd]), np.array([c["fwd_s"] for c in convs]
                                                       + [c["fwd_bwd_s"] - c["fwd_s"] for c in convs], float))
    # the op model's streamed times, plus what an isolated call adds (the conv backward: one backward()
    # call's fixed cost), against the isolated measurements
    extra = {"conv": np.concatenate([np.full(len(convs), cal.call_overhead_s),
                                     np.full(len(convs), cal.backward_call_s)])}
    return {f: (np.maximum(p, cal.floor_s) + extra.get(f, cal.call_overhead_s), y)
            for f, (p, y) in out.items()}


def holdout_errors(cal: Calibration, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Refit the GEMM grids without a quarter of the GEMM points (:func:`holdout_mask`) and predict
    those: (predicted, measured) seconds of the held-out points."""
    mask = holdout_mask(len(cal.raw["gemm"]), seed)
    refit = build_calibration(cal.raw, cal.gpu, cal.source, holdout=mask)
    pred, meas = microbench_errors(refit)["gemm"]
    return pred[mask], meas[mask]
