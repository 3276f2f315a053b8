"""Fused attention micro-benchmark for the calibrated GPU op model (run on a GPU machine).

    python bench/gpu/gpu_sdpa_microbench.py --out DIR [--device cuda] [--quick]

The H200 micro-benchmarks (``hardware/calibration/h200_microbench.json``) have no fused attention
kernel, so ``--attention sdpa`` times the fused op at the batched-GEMM efficiency measured with the N x N
score matrix written (README, "Fused attention"). This script measures what is missing: PyTorch's
``scaled_dot_product_attention`` forward and forward + backward, bf16, over batch x heads, sequence length,
head dimension and causal masking, next to the eager chain it replaces (``softmax(q k^T / sqrt(d)) v``,
the score matrix through HBM), each the median of CUDA-event timings after warm-up. Which kernel PyTorch
picked is not forced (the default dispatch, what users get); the backend flags are recorded. Writes
``DIR/sdpa_microbench.json``. Needs only torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _time(fn, sync, reps: int, warmup: int, cuda: bool) -> float:
    import torch

    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        else:
            s = time.perf_counter()
            fn()
            out.append(time.perf_counter() - s)
    return statistics.median(out)


def measure(bh: int, seq: int, hd: int, causal: bool, device: str, dt, sync, cuda: bool) -> dict:
    """One shape: fused and eager attention, forward and forward + backward (times in s)."""
    import torch
    import torch.nn.functional as F

    q, k, v = (torch.randn(1, bh, seq, hd, device=device, dtype=dt, requires_grad=True) for _ in range(3))
    g = torch.randn(1, bh, seq, hd, device=device, dtype=dt)
    mask = torch.ones(seq, seq, device=device, dtype=torch.bool).tril() if causal else None

    def fused():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def eager():
        s = (q @ k.transpose(-1, -2)) * hd ** -0.5
        if causal:
            s = s.masked_fill(~mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v

    row = {"batch_heads": bh, "seq": seq, "head_dim": hd, "causal": causal,
           "dtype": str(dt).replace("torch.", ""),
           "flops_fwd": 4 * bh * seq * seq * hd * (0.5 if causal else 1.0)}
    for name, fn in (("sdpa", fused), ("eager", eager)):
        try:
            with torch.no_grad():
                row[f"{name}_fwd_s"] = _time(fn, sync, 10, 3, cuda)
            row[f"{name}_fwd_bwd_s"] = _time(lambda f=fn: f().backward(g), sync, 10, 3, cuda)
        except torch.OutOfMemoryError as e:   # recorded, the sweep goes on
            row[f"{name}_error"] = str(e).splitlines()[0]
            torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--quick", action="store_true", help="two tiny shapes (a CPU check of the script)")
    a = ap.parse_args(argv)
    import torch

    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    dt = torch.bfloat16 if cuda else torch.float32
    bh_list, seq_list, hd_list = ((256, 64), (512, 1024, 2048, 4096), (64, 128))
    if a.quick:
        bh_list, seq_list, hd_list = ((4,), (64,), (32,))
    torch.manual_seed(0)
    rows = []
    for bh in bh_list:
        for seq in seq_list:
            for hd in hd_list:
                if bh * seq * seq * 2 > 8 * 2**30:   # the eager score matrix alone over 8 GiB: skip
                    continue
                for causal in (False, True):
                    row = measure(bh, seq, hd, causal, a.device, dt, sync, cuda)
                    rows.append(row)
                    shown = {k: (round(v * 1e6, 1) if k.endswith("_s") else v) for k, v in row.items()}
                    print(json.dumps(shown), flush=True)
    doc = {"script": "bench/gpu/gpu_sdpa_microbench.py", "device": a.device,
           "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "backends": {"flash": torch.backends.cuda.flash_sdp_enabled(),
                        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                        "math": torch.backends.cuda.math_sdp_enabled()},
           "time_unit": "s (median of 10 CUDA-event timings after 3 warm-ups)", "rows": rows}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "sdpa_microbench.json"), "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
