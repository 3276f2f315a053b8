"""Time to estimate every op of a model on every feasible architecture (issue: gpt3-175b under 10 s
on one core). BLAS threads are pinned to one before numpy loads.

Per TMP width and microbatch: graph build time (not counted in the target), op count, unique ops,
architectures, and the estimation time of ℓ and ℓ̂ for all (op, architecture) pairs. Prints a table
and writes JSON (default bench/phaze/results/estimate_speed.json).

    python bench/phaze/estimate_speed.py [--model gpt3-175b] [--mbs 1 2 4 8]
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
    from archplace.hardware.space import enumerate_space
    from archplace.simulators.latency import ArchArrays, UniqueOps, estimate_latencies
    from archplace.workloads.models import build_graph, preset

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt3-175b")
    ap.add_argument("--mbs", type=int, nargs="*", default=[1, 2, 4, 8])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "estimate_speed.json"))
    args = ap.parse_args()
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    except (AttributeError, OSError):
        pass
    t = time.perf_counter()
    space = enumerate_space()
    archs = ArchArrays.from_space(space)
    t_space = time.perf_counter() - t
    rows = []
    print(f"{args.model}: {len(space):,} feasible architectures (enumerated in {t_space:.2f} s)")
    print(f"{'tmp':>3s} {'mbs':>3s} {'ops':>7s} {'unique':>6s} {'pairs':>13s} {'build s':>8s} "
          f"{'estimate s':>10s}")
    for tmp in preset(args.model).tmp_widths:
        for mbs in args.mbs:
            t = time.perf_counter()
            g = build_graph(args.model, mbs=mbs, tmp=tmp)
            t_build = time.perf_counter() - t
            t = time.perf_counter()
            table = estimate_latencies(g, archs)
            t_est = time.perf_counter() - t
            uniq = len(UniqueOps.from_graph(g))
            pairs = g.num_nodes * len(space)
            rows.append({"tmp": tmp, "mbs": mbs, "ops": g.num_nodes, "unique_ops": uniq,
                         "architectures": len(space), "op_arch_pairs": pairs, "build_s": t_build,
                         "estimate_s": t_est, "checksum_s": float(table.total_sequential_s().sum())})
            print(f"{tmp:3d} {mbs:3d} {g.num_nodes:7,d} {uniq:6d} {pairs:13,d} {t_build:8.2f} {t_est:10.2f}")
    total = sum(r["estimate_s"] for r in rows)
    worst = max(r["estimate_s"] for r in rows)
    print(f"every width and microbatch together: {total:.2f} s; slowest single graph {worst:.2f} s "
          f"(target: every op on every architecture under 10 s) -> {'ok' if worst < 10 else 'MISSED'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "estimate_speed", "model": args.model,
                                          "space_s": t_space, "total_estimate_s": total,
                                          "rows": rows}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
