"""How well the calibrated GPU op model (``simulators/gpu_ops.py``) fits its micro-benchmarks, and how
well it generalises to points it did not see.

1. **Fit**: the median |predicted / measured - 1| over every micro-benchmark point the model was built
   from (``hardware/calibration/<gpu>_microbench.json``), per family (gemm, bmm, elementwise, conv) and
   overall; target <= 10 % (issue 30). The model interpolates, so at a measured point it returns the
   measurement (up to the launch floor); the number checks that the op model's code paths do.
2. **GEMM hold-out**: a quarter of the GEMM grid (every 4th point of a seeded permutation, seed 0) is
   left out, the grids are refitted without it, and the held-out points are predicted.
3. **Leave-one-out** for the other families: each bmm, conv2d and element-wise point left out in turn
   (the model rebuilt without it) and predicted; ``softmax_attention`` (softmax over attention rows, not
   part of the fit) is predicted by the row-softmax curve.

Writes bench/gpu/results/gpu_calibration.json with the commit, command and machine load.

    python bench/gpu/gpu_calibration.py [--gpu h200] [--seed 0] [--out bench/gpu/results/gpu_calibration.json]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

from archplace.simulators.gpu_ops import build_calibration, load_calibration  # noqa: E402
from archplace.simulators.gpu_ops_fit import holdout_errors, microbench_errors  # noqa: E402


def stats(pred: np.ndarray, meas: np.ndarray) -> dict:
    e = np.abs(np.asarray(pred) / np.asarray(meas) - 1.0)
    return {"points": int(len(e)), "median_abs_error": float(np.median(e)), "p90_abs_error":
            float(np.percentile(e, 90)), "max_abs_error": float(e.max())}


def leave_one_out(cal, family: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Each point of ``raw[key]`` (for ``elementwise``: the fitted classes only) left out in turn."""
    raw = cal.raw
    idx = [i for i, e in enumerate(raw[key]) if key != "elementwise" or e["op"] != "softmax"]
    measured = microbench_errors(cal)[family][1]
    pred, meas = [], []
    for i in idx:
        r = copy.copy(raw)
        r[key] = [e for j, e in enumerate(raw[key]) if j != i]
        if key == "elementwise":  # an end point of a curve cannot be left out and interpolated
            e = raw[key][i]
            same = [x["numel"] for x in r[key] if x["op"] == e["op"] and x["dtype"] == e["dtype"]]
            if not same or e["numel"] < min(same) or e["numel"] > max(same):
                continue
        sub = build_calibration(r, cal.gpu, cal.source)
        # predict the left-out point with the model built without it, through the same code path
        p_all = microbench_errors(_with_points(sub, raw))[family][0]
        pos = idx.index(i) if family != "conv" else i
        if family == "conv":
            n = len(raw[key])
            pred += [p_all[i], p_all[n + i]]
            meas += [measured[i], measured[n + i]]
        else:
            pred.append(p_all[pos])
            meas.append(measured[pos])
    return np.array(pred), np.array(meas)


def _with_points(sub, raw):
    """``sub``'s fitted model, evaluated at every point of ``raw`` (its ``raw`` swapped in)."""
    import dataclasses

    return dataclasses.replace(sub, raw=raw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", default="h200")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" /
                                         "gpu_calibration.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    cal = load_calibration(args.gpu)
    errs = microbench_errors(cal)
    fit = {f: stats(*errs[f]) for f in ("gemm", "bmm", "elementwise", "conv")}
    fit["overall"] = stats(*(np.concatenate([errs[f][i] for f in ("gemm", "bmm", "elementwise", "conv")])
                             for i in (0, 1)))
    hp, hm = holdout_errors(cal, args.seed)
    holdout = {"gemm_quarter": {**stats(hp, hm), "seed": args.seed,
                                "rule": "every 4th point of numpy default_rng(seed).permutation"}}
    for fam, key in (("bmm", "bmm"), ("conv", "conv2d"), ("elementwise", "elementwise")):
        holdout[f"{fam}_leave_one_out"] = stats(*leave_one_out(cal, fam, key))
    holdout["softmax_attention_unfitted"] = stats(*errs["softmax_attention"])
    print(f"calibrated op model on {cal.device_name} ({cal.source})")
    print(f"{'':36s} {'points':>6s} {'median':>8s} {'p90':>8s} {'max':>8s}")
    rows = [*(("fit " + k, v) for k, v in fit.items()), *(("held out " + k, v) for k, v in holdout.items())]
    for name, d in rows:
        print(f"{name:36s} {d['points']:6d} {d['median_abs_error']:8.1%} {d['p90_abs_error']:8.1%} "
              f"{d['max_abs_error']:8.1%}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "gpu_calibration", **git_state(), "command": command(),
                               "machine": machine(load), "gpu": args.gpu, "device": cal.device_name,
                               "source": cal.source, "fit": fit, "held_out": holdout}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
