"""Eager against fused attention (``estimate --gpu --attention eager|sdpa``) on transformer layers.

Issue 30 measured on one H200 (bf16, micro-batch 16, seq 512) that GPT-2 XL and Llama-2 7B layers ran
1.8x and 2.1x faster with ``sdpa`` than eager, and that the roofline of the eager graph over-predicts a
fused layer by up to 1.4x. This script reports what archplace predicts at the same sizes, for each op
model: a middle block's time (forward + backward) with attention eager and fused, their ratio, the part
of the layer that is attention (the eager chain Q·Kᵀ -> softmax -> ·V and its gradients, or the fused op
and its gradient), the HBM bytes of that part, and the roofline of the eager layer against the fused
layer. The measured ratios are printed beside ours; nothing is fitted to them.

Writes bench/gpu/results/gpu_attention.json with the commit, command and machine load.

    python bench/gpu/gpu_attention.py [--gpu h200] [--models bert-base,gpt2-xl,llama2-7b] [--mbs 16] [--seq
        512]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

from archplace.hardware.gpus import gpu_spec  # noqa: E402
from archplace.simulators.gpu_ops import gpu_op_times  # noqa: E402
from archplace.simulators.gpu_step import sram_bytes  # noqa: E402
from archplace.workloads.attention_fusion import find_attention  # noqa: E402
from archplace.workloads.backward import with_attention  # noqa: E402
from archplace.workloads.models import build_graph  # noqa: E402
from archplace.workloads.ops import moved_bytes  # noqa: E402

# issue 30, "Deliver" 4: eager / sdpa layer time measured on one H200, bf16, micro-batch 16, seq 512
MEASURED_EAGER_OVER_SDPA = {"gpt2-xl": 1.8, "llama2-7b": 2.1}
OP_MODELS = ("roofline", "calibrated")


def layer_parts(fwd, gpu, dtype: str, op_model: str) -> dict:
    """A middle block's time, its attention part's time and bytes, eager and fused."""
    sites, _ = find_attention(fwd)
    layers = fwd.meta["layers"]
    blocks = sorted({int(fwd.nodes["layer"][s.qk]) for s in sites})
    mid = blocks[len(blocks) // 2]
    chain = {int(fwd.nodes["id"][r]) for s in sites if fwd.nodes["layer"][s.qk] == mid
             for r in (s.qk, *s.chain, s.pv)}
    out = {"layer": layers[mid]}
    for att in ("eager", "sdpa"):
        g = with_attention(fwd, att, sram_bytes=sram_bytes(gpu))
        t = gpu_op_times(g, gpu, dtype=dtype, op_model=op_model).time_s
        nd = g.nodes
        in_layer = nd["layer"] == mid
        ids = np.where(nd["is_backward"], nd["fwd_id"], nd["id"])
        part = in_layer & np.isin(ids, list(chain))  # the fused op keeps the Q·Kᵀ GEMM's id
        out[att] = {"layer_s": float(t[in_layer].sum()), "attention_s": float(t[part].sum()),
                    "attention_bytes": float(moved_bytes(nd)[part].sum()), "step_s": float(t.sum())}
    out["eager_over_sdpa_layer"] = out["eager"]["layer_s"] / out["sdpa"]["layer_s"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--models", default="bert-base,gpt2-xl,llama2-7b")
    ap.add_argument("--mbs", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "gpu_attention.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    gpu = gpu_spec(args.gpu)
    rows = []
    print(f"{gpu.label}, {args.dtype}, micro-batch {args.mbs}, seq {args.seq}: one middle block, forward + "
          "backward")
    print(f"{'model':10s} {'op model':10s} {'eager ms':>9s} {'sdpa ms':>9s} {'ratio':>6s} {'measured':>8s} "
          f"{'attn eager':>10s} {'attn sdpa':>9s} {'attn GB eager':>13s} {'sdpa':>6s}")
    for model in args.models.split(","):
        fwd = build_graph(model, seq=args.seq, mbs=args.mbs, training=False,
                          bytes_per_element=4 if args.dtype == "fp32" else 2)
        row = {"model": model, "measured_eager_over_sdpa": MEASURED_EAGER_OVER_SDPA.get(model)}
        for om in OP_MODELS:
            r = layer_parts(fwd, gpu, args.dtype, om)
            row[om] = r
            e, s = r["eager"], r["sdpa"]
            meas = row["measured_eager_over_sdpa"]
            print(f"{model:10s} {om:10s} {e['layer_s'] * 1e3:9.3f} {s['layer_s'] * 1e3:9.3f} "
                  f"{r['eager_over_sdpa_layer']:6.3f} {meas if meas else '-':>8} "
                  f"{e['attention_s'] * 1e3:10.3f} "
                  f"{s['attention_s'] * 1e3:9.3f} {e['attention_bytes'] / 1e9:13.3f} "
                  f"{s['attention_bytes'] / 1e9:6.3f}")
        row["roofline_eager_over_roofline_sdpa"] = (row["roofline"]["eager"]["layer_s"]
                                                    / row["roofline"]["sdpa"]["layer_s"])
        row["roofline_eager_over_calibrated_sdpa"] = (row["roofline"]["eager"]["layer_s"]
                                                      / row["calibrated"]["sdpa"]["layer_s"])
        print(f"{model:10s} roofline of the eager layer / fused layer: "
              f"{row['roofline_eager_over_roofline_sdpa']:.3f} (roofline), "
              f"{row['roofline_eager_over_calibrated_sdpa']:.3f} (calibrated)")
        rows.append(row)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "gpu_attention", **git_state(), "command": command(),
                               "machine": machine(load), "gpu": args.gpu, "dtype": args.dtype,
                               "mbs": args.mbs, "seq": args.seq, "sram_bytes": sram_bytes(gpu),
                               "models": rows}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
