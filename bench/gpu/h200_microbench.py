# ruff: noqa: B023, E501  (kept as it ran on the H200: each timed lambda is called inside its own loop turn)
"""Operator micro-benchmarks on one GPU: the data a GPU cost model is calibrated on.

GEMMs (bf16 and fp32 with TF32 off) over a grid of M, N, K; batched GEMMs of attention shapes; element-wise,
softmax and layer-norm over a range of sizes; fp32 2-D convolutions forward and backward; the cost of an
empty launch. Each op is timed with CUDA events, median of `reps` runs after warm-up.
Writes $OUT/microbench.json.  Usage: python microbench.py [--smoke]
"""
from __future__ import annotations

import itertools
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SMOKE = "--smoke" in sys.argv
DEV = "cpu" if SMOKE else "cuda"
OUT = os.environ.get("OUT", "out")
os.makedirs(OUT, exist_ok=True)
if DEV == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
res = {"gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else "cpu", "torch": torch.__version__,
       "cuda": torch.version.cuda, "note": "median seconds per call; flops = 2*M*N*K per GEMM",
       "gemm": [], "bmm": [], "elementwise": [], "conv2d": [], "launch": {}}


def t(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    if DEV == "cuda":
        torch.cuda.synchronize()
        ts = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3)
        return statistics.median(ts)
    ts = []
    for _ in range(max(2, reps // 10)):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def dump():
    with open(os.path.join(OUT, "microbench.json"), "w") as f:
        json.dump(res, f, indent=1)


t0 = time.time()
# launch overhead: a 1-element add, and back-to-back launches
x1 = torch.zeros(1, device=DEV)
res["launch"]["tiny_add_s"] = t(lambda: x1.add_(1.0), reps=200)
res["launch"]["tiny_add_x100_s"] = t(lambda: [x1.add_(1.0) for _ in range(100)], reps=20) / 100

dims = [64, 256, 1024, 4096, 16384] if not SMOKE else [64, 256]
for dt in (torch.bfloat16, torch.float32):
    for m, n, k in itertools.product(dims, dims[1:], dims[1:]):
        if m * n * k > 2**40 or (dt == torch.float32 and m * n * k > 2**38):
            continue
        a = torch.randn(m, k, device=DEV, dtype=dt)
        b = torch.randn(k, n, device=DEV, dtype=dt)
        s = t(lambda: a @ b, reps=10 if m * n * k > 2**36 else 20)
        res["gemm"].append({"dtype": str(dt)[6:], "m": m, "n": n, "k": k, "s": s,
                            "tflops": 2 * m * n * k / s / 1e12})
    dump()
# attention-shaped batched GEMMs: (batch*heads, seq, d) @ (batch*heads, d, seq) and back
for dt in (torch.bfloat16,):
    for bh, s_, d in ([(16 * 16, 512, 64), (16 * 32, 512, 128), (16 * 128, 512, 128), (4 * 25, 1024, 64),
                       (1 * 32, 4096, 128)] if not SMOKE else [(4, 32, 16)]):
        q = torch.randn(bh, s_, d, device=DEV, dtype=dt)
        kt = torch.randn(bh, d, s_, device=DEV, dtype=dt)
        p = torch.randn(bh, s_, s_, device=DEV, dtype=dt)
        v = torch.randn(bh, s_, d, device=DEV, dtype=dt)
        res["bmm"].append({"dtype": "bfloat16", "b": bh, "m": s_, "n": s_, "k": d, "s": t(lambda: q @ kt)})
        res["bmm"].append({"dtype": "bfloat16", "b": bh, "m": s_, "n": d, "k": s_, "s": t(lambda: p @ v)})
        res["elementwise"].append({"op": "softmax", "dtype": "bfloat16", "numel": p.numel(),
                                   "s": t(lambda: torch.softmax(p, -1))})
dump()
# element-wise and normalisation over sizes (bytes moved = read + write)
for dt in (torch.bfloat16, torch.float32):
    for numel in ([2**k for k in (10, 14, 18, 20, 22, 24, 26, 28)] if not SMOKE else [2**10, 2**14]):
        x = torch.randn(numel, device=DEV, dtype=dt)
        y = torch.randn(numel, device=DEV, dtype=dt)
        h = 1024 if numel >= 1024 else numel
        xr = x.view(-1, h)
        w = torch.ones(h, device=DEV, dtype=dt)
        for op, fn in (("add", lambda: x + y), ("gelu", lambda: F.gelu(x)), ("mul_scalar", lambda: x * 0.5),
                       ("layer_norm_h1024", lambda: F.layer_norm(xr, (h,), w, w)),
                       ("softmax_h1024", lambda: torch.softmax(xr, -1)), ("sum", lambda: x.sum())):
            res["elementwise"].append({"op": op, "dtype": str(dt)[6:], "numel": numel, "s": t(fn)})
    dump()
# fp32 convolutions (Inception-like shapes), forward and forward+backward
convs = [(32, 3, 299, 32, 3, 2), (32, 64, 73, 80, 1, 1), (32, 192, 35, 64, 1, 1), (32, 48, 35, 64, 5, 1),
         (32, 64, 35, 96, 3, 1), (32, 768, 17, 192, 1, 1), (32, 128, 17, 128, 7, 1), (32, 1280, 8, 320, 1, 1),
         (32, 384, 8, 384, 3, 1)] if not SMOKE else [(2, 3, 32, 8, 3, 1)]
for nb, cin, hw, cout, ks, st in convs:
    x = torch.randn(nb, cin, hw, hw, device=DEV, requires_grad=True)
    w = torch.randn(cout, cin, ks, ks, device=DEV, requires_grad=True)
    pad = ks // 2

    def fwd():
        return F.conv2d(x, w, stride=st, padding=pad)

    def fwdbwd():
        F.conv2d(x, w, stride=st, padding=pad).sum().backward()
    o = fwd()
    flops = 2 * nb * cout * o.shape[2] * o.shape[3] * cin * ks * ks
    res["conv2d"].append({"n": nb, "cin": cin, "hw": hw, "cout": cout, "k": ks, "stride": st, "fwd_flops": flops,
                          "fwd_s": t(fwd), "fwd_bwd_s": t(fwdbwd, reps=10)})
dump()
res["wall_s"] = time.time() - t0
dump()
best = max((g for g in res["gemm"] if g["dtype"] == "bfloat16"), key=lambda g: g["tflops"])
best32 = max((g for g in res["gemm"] if g["dtype"] == "float32"), key=lambda g: g["tflops"])
print(f"{len(res['gemm'])} GEMMs; best bf16 {best['tflops']:.0f} TF/s at {best['m']}x{best['n']}x{best['k']}; "
      f"best fp32 {best32['tflops']:.1f} TF/s; launch {res['launch']['tiny_add_s'] * 1e6:.1f} us; "
      f"wall {res['wall_s']:.0f} s")
