"""Measure training steps on a real GPU, for ``bench/gpu/gpu_measured_validation.py`` (issue 30, item 3).

    PYTHONPATH=. python bench/gpu/gpu_measure.py --out DIR [--device cuda] [--cases NAME,...] [--quick]

Runs on the GPU machine (torch, transformers and numpy; no Ray, no archplace install): for each case it

* profiles one training step per graph node with ``archplace.workloads.op_profiler.profile_model``
  (``torch.profiler``, CUDA kernel time per exported op) and saves the profile as ``DIR/NAME.profile.json``,
  the file ``estimate --profile`` / ``place-ops --profile`` / ``pipeline --profile`` read;
* times (``--train``: with dropout on, as users train; else in eval mode, as the profiler runs) the
  eager model's forward + backward step with transformers' attention implementation
  ``eager`` (the score matrix through HBM, as archplace captures it) and ``sdpa`` (PyTorch's fused
  scaled-dot-product attention, FlashAttention-style kernels on Hopper): the median of ``--steps`` steps
  after ``--warmup``, each synchronised around it, on the same seeded weights and inputs, with the same
  loss as the profiler (cross-entropy of the largest output, other outputs seeded with ones).

Everything lands in ``DIR/steps.json`` (one row per case and attention, with the GPU, driver and software
versions) and ``DIR/NAME.profile.json``. A case that fails is recorded with its error and the run goes on.
The cases were fixed before any measurement: transformers presets at the sizes users train (bf16) and
two GDP graphs in fp32 (TF32 off, the GDP measurements' setting). ``--quick`` shrinks every case to a
CPU-sized smoke test (mbs 1, short sequences) to check the script here before a GPU is spent on it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# name, model, dtype, mbs, seq (None: the preset's), profile?, attention timings?
CASES = (
    ("bert-base-b32-s128", "bert-base", "bf16", 32, 128, True, True),
    ("bert-large-b8-s512", "bert-large", "bf16", 8, 512, True, True),
    ("opt-350m-b4-s2048", "opt-350m", "bf16", 4, 2048, True, True),
    ("gpt2-xl-b2-s1024", "gpt2-xl", "bf16", 2, 1024, True, True),
    ("llama2-7b-b1-s2048", "llama2-7b", "bf16", 1, 2048, False, True),
    ("bert-base-b64-s512", "bert-base", "bf16", 64, 512, False, True),
    ("txl-2", "txl-2", "fp32", 1, None, True, False),
    ("inception-v3", "inception-v3", "fp32", 1, None, True, False),
)
QUICK = {"bert-base": (1, 32), "bert-large": (1, 32), "opt-350m": (1, 32), "gpt2-xl": (1, 32)}


def _set_attention(module, impl: str) -> str:
    """Switch a built transformers model to ``impl`` and return what it now reports (recorded, so a
    silent no-op would show)."""
    if hasattr(module, "set_attn_implementation"):
        module.set_attn_implementation(impl)
    else:
        module.config._attn_implementation = impl
    return str(getattr(module.config, "_attn_implementation", "?"))


def _hf_workload(model: str, device: str, dtype: str, mbs: int, seq: int | None):
    """The profiler's model and inputs (same preset config, seeded weights, eval mode, inputs) without
    its graph captures, which a 7B model's full-depth reference capture would make slow."""
    import torch
    import transformers

    from archplace.workloads import op_profiler as op
    from archplace.workloads.models import preset

    p = preset(model)
    seq = p.seq_len if seq is None else seq
    cfg = p.make_config()
    fdt = op._torch_dtype(dtype)
    with torch.device(device):
        module = getattr(transformers, p.model_class)(cfg)
    module = module.to(device=device, dtype=fdt).eval()
    args, kwargs = p.example_inputs(seq, mbs)
    high = getattr(cfg, "vocab_size", None) or 2
    args, kwargs = op._materialize((args, kwargs), device, fdt, high)
    return op._Workload(model, None, None, module, tuple(args), dict(kwargs), bool(p.has_loss), seq)


def time_attention(model: str, dtype: str, mbs: int, seq: int | None, device: str, steps: int,
                   warmup: int, seed: int = 0, train: bool = False) -> list[dict]:
    import torch

    from archplace.workloads import op_profiler as op

    torch.manual_seed(seed)
    if dtype == "fp32" and device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    w = _hf_workload(model, device, dtype, mbs, seq)
    if train:  # dropout on, as users train and as archplace's training graphs charge it
        w.module.train()
    with torch.no_grad():
        outs = op._leaves(w.module(*w.args, **w.kwargs))
        shapes = [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor) and o.is_floating_point()]
        del outs
    logits = max(shapes, key=lambda s: int(torch.tensor(s).prod())) if shapes else None
    gen = torch.Generator(device="cpu").manual_seed(seed)
    labels = None if not logits else torch.randint(
        0, int(logits[-1]), (int(torch.tensor(logits[:-1]).prod()),), generator=gen).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    params = [p for p in w.module.parameters() if p.requires_grad]
    rows = []
    for impl in ("eager", "sdpa"):
        got = _set_attention(w.module, impl)
        times = []
        for k in range(warmup + steps):
            for p in params:
                p.grad = None
            sync()
            s = time.perf_counter()
            roots, grads = op._loss_and_seeds(op._leaves(w.module(*w.args, **w.kwargs)), w.has_loss, labels)
            torch.autograd.backward(roots, grads)
            sync()
            if k >= warmup:
                times.append(time.perf_counter() - s)
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        rows.append({"attention": impl, "reported_attention": got, "step_s": statistics.median(times),
                     "steps_s": times, "peak_memory_bytes": peak, "mbs": mbs, "seq": w.seq,
                     "mode": "train" if train else "eval"})
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
    del w
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--train", action="store_true",
                    help="attention timings with dropout on (train mode); the profiles stay in eval mode")
    ap.add_argument("--no-profile", action="store_true", help="attention timings only")
    a = ap.parse_args(argv)
    import torch

    from archplace.workloads import op_profiler as op

    os.makedirs(a.out, exist_ok=True)
    want = set(a.cases.split(",")) if a.cases else None
    device_name, sw = op._software(a.device)
    doc = {"device": a.device, "device_name": device_name, "software": sw, "argv": sys.argv,
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": [], "profiles": []}
    path = os.path.join(a.out, "steps.json")

    def save() -> None:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)

    for name, model, dtype, mbs, seq, prof, att in CASES:
        if want and name not in want:
            continue
        if a.quick:
            if model not in QUICK:
                continue
            mbs, seq = QUICK[model]
        print(f"== {name}", flush=True)
        if prof and not a.no_profile:
            t0 = time.perf_counter()
            try:
                p = op.profile_model(model, device=a.device, dtype=dtype, mbs=mbs, seq=seq, steps=a.steps,
                                     warmup=a.warmup, method="profiler", threads=None,
                                     log=lambda s: print("   " + s, flush=True))
                f = p.save(os.path.join(a.out, f"{name}.profile.json"))
                doc["profiles"].append({"case": name, "file": os.path.basename(str(f)),
                                        "wall_s": time.perf_counter() - t0, **op.summary(p, top=5)})
            except Exception as e:  # recorded, and the run goes on
                traceback.print_exc()
                doc["profiles"].append({"case": name, "error": f"{type(e).__name__}: {e}"})
            save()
        if att:
            t0 = time.perf_counter()
            try:
                for r in time_attention(model, dtype, mbs, seq, a.device, a.steps, a.warmup,
                                        train=a.train):
                    doc["rows"].append({"case": name, "model": model, "dtype": dtype, **r})
                    print(f"   {r['attention']} ({r['reported_attention']}): {r['step_s'] * 1e3:.2f} ms",
                          flush=True)
            except Exception as e:
                traceback.print_exc()
                doc["rows"].append({"case": name, "model": model, "error": f"{type(e).__name__}: {e}"})
            print(f"   attention timings {time.perf_counter() - t0:.1f} s", flush=True)
            save()
        if a.device == "cuda":
            torch.cuda.empty_cache()
    doc["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
