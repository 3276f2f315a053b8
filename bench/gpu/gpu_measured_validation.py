"""The GPU op models against training steps measured on a real H200 (issue 30, item 3's CUDA part).

    python bench/gpu/gpu_measured_validation.py [--data archplace/hardware/calibration/h200_steps]

The measurements were taken on one NVIDIA H200 (driver 580.159.04, CUDA 13.0, PyTorch 2.11, transformers
5.24) by ``bench/gpu/gpu_measure.py`` on a lent GPU machine; its output is committed in ``--data``:
``steps.json``
(eager vs ``sdpa`` attention forward + backward step times in eval mode, the median of 5 after 2 warm-ups),
``steps_train.json`` (the same with dropout on, median of 7: the reference here, since archplace's training
graphs charge dropout; a second lease, same machine kind and software) and one
``archplace profile`` file per case (``torch.profiler`` CUDA kernel time per graph node). This script runs
here, on the CPU, and predicts every case with each op model:

* transformers presets (bf16): ``estimate MODEL --gpu h200 --mbs M --seq S --dtype bf16`` with
  ``--attention eager`` and ``sdpa``, under ``--op-model calibrated`` and ``roofline``, and ``--profile`` (the
  measured per-node times, which must add back up to the measured kernel time: a check of the mapping);
* GDP graphs (fp32, TF32 off): ``place-ops MODEL --algo single --machine h200 --batch 1`` (one GPU, the
  whole graph) under the same op models.

Two measured references per case, because small steps in eager PyTorch are bound by the host, not by the
GPU: ``measured_step_s`` (wall time of the eager step, what a user waits for) and ``kernel_s`` (the summed
CUDA kernel time the profiler saw, what the GPU was busy for; archplace's op models predict this one, one
kernel after another with a launch floor per op). Writes ``bench/gpu/results/gpu_measured_validation.json``
with per-case ratios predicted / measured, their medians, and per-op-kind predicted vs profiled time for
the cases where the models miss most.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

from archplace.api.gpu_estimate import GpuEstimateRequest, estimate_gpu  # noqa: E402
from archplace.api.operator_placement import PlaceOpsRequest, place_ops  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "archplace" / "hardware" / "calibration" / "h200_steps"
OUT = Path(__file__).resolve().parent / "results" / "gpu_measured_validation.json"
GDP = {"txl-2", "inception-v3"}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def predict_hf(model: str, mbs: int, seq: int, profile: Path | None) -> dict:
    out = {}
    for att in ("eager", "sdpa"):
        for om in ("calibrated", "roofline"):
            r = estimate_gpu(GpuEstimateRequest(model=model, gpu="h200", mbs=mbs, seq=seq, dtype="bf16",
                                                attention=att, op_model=om))
            out[f"{om}_{att}"] = {"step_s": r.microbatch_time_s, "by_kind_s": r.by_kind_s}  # fwd + bwd
    if profile is not None:
        r = estimate_gpu(GpuEstimateRequest(model=model, gpu="h200", mbs=mbs, seq=seq, dtype="bf16",
                                            attention="eager", profile=str(profile)))
        out["profiled_eager"] = {"step_s": r.microbatch_time_s, "by_kind_s": r.by_kind_s}
    return out


def predict_gdp(model: str, profile: Path) -> dict:
    out = {}
    for om, prof in (("calibrated", None), ("roofline", None), ("profiled", str(profile))):
        r = place_ops(PlaceOpsRequest(model=model, algo="single", machine="h200", batch=1, dtype="fp32",
                                      op_model=None if prof else om, profile=prof))
        out[f"{om}"] = {"step_s": r.step_time_s}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(DATA))
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    load = os.getloadavg()
    t0 = time.perf_counter()
    data = Path(a.data)
    steps = json.loads((data / "steps.json").read_text())
    profiles = {p["case"]: p for p in steps["profiles"] if "error" not in p}
    train_file = data / "steps_train.json"
    train = json.loads(train_file.read_text()) if train_file.exists() else {"rows": []}
    measured: dict[str, dict] = {}
    for mode, rows in (("eval", steps["rows"]), ("train", train["rows"])):
        for r in rows:
            if "error" not in r:
                m = measured.setdefault(r["case"], {"model": r["model"], "mbs": r["mbs"], "seq": r["seq"]})
                m[f"{r['attention']}_{mode}"] = r["step_s"]
    for m in measured.values():  # the reference: train mode (dropout on, as estimate charges it) if measured
        for att in ("eager", "sdpa"):
            m[att] = m.get(f"{att}_train", m.get(f"{att}_eval"))
    cases = []
    for case in sorted(set(measured) | set(profiles)):
        prof = profiles.get(case)
        pfile = data / prof["file"] if prof else None
        kernel = prof["profiled_step_s"] if prof else None
        row = {"case": case, "kernel_s": kernel, "coverage": prof["coverage"] if prof else None,
               "profiler_eager_wall_s": prof["measured_step_s"] if prof else None}
        if case in measured:
            m = measured[case]
            row.update(model=m["model"], mbs=m["mbs"], seq=m["seq"], measured_eager_s=m.get("eager"),
                       measured_sdpa_s=m.get("sdpa"),
                       measured_by_mode_s={k: v for k, v in m.items() if k.endswith(("_eval", "_train"))})
            pred = predict_hf(m["model"], m["mbs"], m["seq"], pfile)
            row["predicted"] = {k: v["step_s"] for k, v in pred.items()}
            row["ratio_to_measured"] = {
                k: _ratio(v["step_s"], m.get("sdpa" if k.endswith("sdpa") else "eager"))
                for k, v in pred.items()}
            row["ratio_to_kernel_s"] = {k: _ratio(v["step_s"], kernel) for k, v in pred.items()
                                        if k.endswith("eager")}
            if "profiled_eager" in pred:  # per-kind: calibrated eager vs what the kernels took
                cal, got = pred["calibrated_eager"]["by_kind_s"], pred["profiled_eager"]["by_kind_s"]
                row["by_kind_calibrated_over_profiled"] = {
                    k: {"calibrated_s": cal.get(k, 0.0), "profiled_s": got.get(k, 0.0),
                        "ratio": _ratio(cal.get(k, 0.0), got.get(k, 0.0))}
                    for k in sorted(set(cal) | set(got)) if max(cal.get(k, 0.0), got.get(k, 0.0)) > 0}
        else:
            model = prof["model"]
            row.update(model=model, mbs=prof.get("mbs"), seq=prof.get("seq"), dtype="fp32")
            pred = predict_gdp(model, pfile)
            row["predicted"] = {k: v["step_s"] for k, v in pred.items()}
            row["ratio_to_measured"] = {k: _ratio(v["step_s"], prof["measured_step_s"])
                                        for k, v in pred.items()}
            row["ratio_to_kernel_s"] = {k: _ratio(v["step_s"], kernel) for k, v in pred.items()}
        cases.append(row)
        print(f"{case:22s} " + " ".join(f"{k}={v:.2f}" for k, v in row["ratio_to_measured"].items() if v))

    def med(key: str, sub: str, where) -> float | None:
        xs = [c[key][sub] for c in cases if where(c) and c.get(key, {}).get(sub)]
        return statistics.median(xs) if xs else None

    def hf(c: dict) -> bool:
        return c["case"] not in GDP and bool(c.get("measured_eager_s"))

    def big(c: dict) -> bool:  # steps long enough that the host's launch rate does not bound them
        return hf(c) and (c.get("measured_sdpa_s") or 0) >= 0.04
    summary = {f"median_{om}_{att}_over_measured{tag}": med("ratio_to_measured", f"{om}_{att}", sel)
               for om in ("calibrated", "roofline") for att in ("eager", "sdpa")
               for tag, sel in (("", hf), ("_steps_over_40ms", big))}
    summary["median_profiled_over_kernel_s"] = med("ratio_to_kernel_s", "profiled_eager", hf)
    summary["median_calibrated_eager_over_kernel_s"] = med("ratio_to_kernel_s", "calibrated_eager", hf)
    doc = {"bench": "gpu_measured_validation", **git_state(), "command": command(),
           "machine": machine(load), "wall_s": time.perf_counter() - t0,
           "measured_on": {"device_name": steps["device_name"], "software": steps["software"],
                           "script": "bench/gpu/gpu_measure.py", "started": steps["started"]},
           "summary": summary, "cases": cases}
    Path(a.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
