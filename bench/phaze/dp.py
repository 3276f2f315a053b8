"""Placement DP speed (issue 4): gpt3-175b on K = 1024 accelerators, t ∈ {1,2,4,8} × microbatch
∈ {1,2,4,8} × HBM ∈ {32,64,80} GB × recompute on/off — the whole sweep under 5 s on one core.

Only the DP is timed. Its inputs (per-layer forward/backward times, sizes and transfers per TMP width
and microbatch) are prepared first: layer times are the sequential all-cores schedule (Σℓ̂ of the
layer's ops on tpuv4), which has the shape of the ILP's output. The dnn-partitioning max-load
inputs are timed by bench/gdp/dp_partitioning.py. Prints a table and writes JSON
(default bench/phaze/results/dp.json).

    python bench/phaze/dp.py [--model gpt3-175b] [--devices 1024] [--global-batch 4096]
"""

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> int:
    from archplace.algorithms.solvers.placement import TrainingSetup, place
    from archplace.algorithms.solvers.throughput import placement_layers
    from archplace.hardware.constants import PHAZE_LINK_BW_BYTES_PER_S
    from archplace.hardware.presets import TPUV4
    from archplace.simulators.estimate import estimate_graph
    from archplace.workloads.models import build_graph

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--global-batch", type=int, default=4096)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "dp.json"))
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except (AttributeError, OSError):
        pass
    inputs = {}
    t0 = time.perf_counter()
    for t in (1, 2, 4, 8):
        for mbs in (1, 2, 4, 8):
            g = build_graph(args.model, mbs=mbs, tmp=t)
            est = estimate_graph(g, TPUV4)
            inputs[(t, mbs)] = placement_layers(g, est.all_s, est.all_s, sequential=True)
    prep = time.perf_counter() - t0
    rows, total = [], 0.0
    print(f"{args.model}: K = {args.devices}, global batch {args.global_batch}; "
          f"inputs prepared in {prep:.1f} s")
    print(f"{'t':>2s} {'mbs':>3s} {'HBM':>4s} {'rec':>3s} {'layers':>6s} {'DP ms':>7s} {'feasible':>8s} "
          f"{'p':>3s} {'d':>4s} {'time/batch s':>12s}")
    for (t, mbs), ly in inputs.items():
        for hbm in (32, 64, 80):
            for rec in (False, True):
                setup = TrainingSetup(args.devices, args.global_batch, mbs, hbm * 2**30, rec,
                                      PHAZE_LINK_BW_BYTES_PER_S)
                s = time.perf_counter()
                res = place(ly, setup)
                dt = time.perf_counter() - s
                total += dt
                rows.append({"t": t, "mbs": mbs, "hbm_gb": hbm, "recompute": rec, "layers": ly.num_layers,
                             "dp_s": dt, "feasible": res.feasible, "p": res.p, "d": res.d,
                             "time_per_batch_s": res.time_per_batch_s if res.feasible else None})
                print(f"{t:2d} {mbs:3d} {hbm:4d} {'on' if rec else 'off':>3s} {ly.num_layers:6d} "
                      f"{dt * 1e3:7.1f} "
                      f"{str(res.feasible):>8s} {res.p:3d} {res.d:4d} "
                      f"{res.time_per_batch_s if res.feasible else float('nan'):12.3f}")
    best = min((r for r in rows if r["feasible"]), key=lambda r: r["time_per_batch_s"], default=None)
    print(f"\nwhole sweep ({len(rows)} configurations): {total:.2f} s of DP on one core "
          f"(target < 5 s) -> {'ok' if total < 5 else 'MISSED'}")
    if best:
        print(f"best: t={best['t']} mbs={best['mbs']} HBM={best['hbm_gb']} recompute={best['recompute']} "
              f"p={best['p']} d={best['d']} time/batch {best['time_per_batch_s']:.3f} s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "dp", "model": args.model, "devices": args.devices,
                                          "total_dp_s": total, "prep_s": prep, "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
