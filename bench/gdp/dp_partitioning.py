"""Max-load placement on every dnn-partitioning input (issue 4, part 3).

For each file of throughput-inputs/LayerGraphs and throughput-inputs/OperatorGraphs: the optimum of
``solve_max_load`` (method ``auto``: the exact DP over ideals when they number at most 250,000, which
holds for every published file), its status, gap and time, the README's reference value and the
relative difference where there is one; and, as an independent check, CP-SAT on the chain model
(method ``milp``) with its proven bound. Prints a table and writes JSON (default
bench/gdp/results/dp_partitioning.json).

    python bench/gdp/dp_partitioning.py [--time-limit 60] [--milp-time-limit 60] [--budget 600] [--no-milp]
                                    [FILE ...]

Time limits are per file and per method (defaults: 60 s for the DP, 60 s for CP-SAT), and every
limit is cut so that the whole run stays within ``--budget`` seconds (default 600; each later file
keeps at least 3 s per method). On a 2-core machine the run takes about 3 minutes: the DP needs at
most ~15 s per file (~22 s for all 16), CP-SAT up to its limit (inceptionv3_training needs ~55 s to
prove its optimum). ``--no-milp`` runs the DP alone (~25 s).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from archplace.workloads.dnn_partitioning import DATA_DIR as DEFAULT_DATA  # noqa: E402  (bundled)


def _fmt(x: float | None, spec: str = ".6f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf"
    return repr(float(x)) if spec == "repr" else format(x, spec)


def _clean(x):
    """JSON-able: numpy scalars to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from archplace.algorithms.solvers.maxload import reference_value, solve_max_load
    from archplace.workloads.dnn_partitioning import load_dnn_partitioning

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*",
                    help="input files (default: every LayerGraphs and OperatorGraphs file)")
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="the dnn-partitioning folder")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per file for the DP (auto)")
    ap.add_argument("--milp-time-limit", type=float, default=60.0, help="seconds per file for CP-SAT")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--no-milp", action="store_true", help="skip the CP-SAT cross-check")
    ap.add_argument("--out",
                    default=str(Path(__file__).resolve().parent / "results" / "dp_partitioning.json"))
    args = ap.parse_args()

    data = Path(args.data)
    files = [Path(f) for f in args.files] or [
        *sorted((data / "throughput-inputs" / "LayerGraphs").glob("*.json")),
        *sorted((data / "throughput-inputs" / "OperatorGraphs").glob("*.json"))]
    if not files:
        print(f"no input files under {data}", file=sys.stderr)
        return 1
    rows = []
    head = (f"{'file':<40s} {'nodes':>5s} {'k':>2s} {'ideals':>6s} {'max-load':>19s} {'status':>8s} "
            f"{'gap':>7s} {'reference':>19s} {'rel.diff':>8s} {'time s':>6s} | {'milp max-load':>19s} "
            f"{'milp bound':>17s} {'status':>8s} {'time s':>6s}")
    print(head)
    print("-" * len(head))
    t_all = time.perf_counter()
    methods = 1 if args.no_milp else 2

    def limit(cap: float, runs_after: int) -> float:
        """``cap``, cut so that the budget still leaves 3 s to every later run."""
        left = args.budget - (time.perf_counter() - t_all) - 3.0 * runs_after
        return max(1.0, min(cap, left))

    for n_file, path in enumerate(files):
        name = f"{path.parent.name}/{path.name}"
        g = load_dnn_partitioning(path)
        runs_after = methods * (len(files) - n_file) - 1
        dp_limit = limit(args.time_limit, runs_after)
        res = solve_max_load(g, method="auto", time_limit_s=dp_limit)
        ref = reference_value(path)
        rel = (res.max_load - ref) / ref if ref is not None and math.isfinite(res.max_load) else None
        row = {"file": name, "nodes": g.num_nodes, "k": g.meta["max_accs"], "cpus": g.meta["max_cpus"],
               "supernodes": res.stats.get("supernodes"), "ideals": res.stats.get("ideals"),
               "max_load": res.max_load, "status": res.status, "lower_bound": res.lower_bound,
               "gap": res.gap, "method": res.method, "time_s": res.solve_time_s, "time_limit_s": dp_limit,
               "reference": ref,
               "rel_diff": rel, "loads": res.loads,
               "dp_attempts": res.stats.get("dp_attempts"), "seed_max_load": res.stats.get("seed_max_load")}
        milp = None
        if not args.no_milp:
            milp_limit = limit(args.milp_time_limit, runs_after - 1)
            m = solve_max_load(g, method="milp", time_limit_s=milp_limit)
            agrees = None
            if res.status == "optimal":  # CP-SAT's bound below the DP optimum, and its split at it
                agrees = m.lower_bound <= res.max_load * (1 + 1e-9) and (
                    m.status != "optimal" or abs(m.max_load - res.max_load) <= 1e-6 * res.max_load)
            milp = {"max_load": m.max_load, "lower_bound": m.lower_bound, "status": m.status, "gap": m.gap,
                    "time_s": m.solve_time_s, "time_limit_s": milp_limit,
                    "cp_sat_status": m.stats.get("milp_status"),
                    "rounding_bound": m.stats.get("milp_rounding_bound"), "agrees": agrees}
            row["milp"] = milp
        rows.append(row)
        print(f"{name:<40s} {g.num_nodes:5d} {row['k']:2d} {str(row['ideals']):>6s} "
              f"{_fmt(res.max_load, 'repr'):>19s} {res.status:>8s} {_fmt(res.gap, '.1e'):>7s} "
              f"{_fmt(ref, 'repr'):>19s} {_fmt(rel, '.1e'):>8s} {res.solve_time_s:6.1f} | "
              + (f"{_fmt(milp['max_load'], 'repr'):>19s} {_fmt(milp['lower_bound'], '.10g'):>17s} "
                 f"{milp['status']:>8s} {milp['time_s']:6.1f}" if milp else ""), flush=True)
    total = time.perf_counter() - t_all
    with_ref = [r for r in rows if r["reference"] is not None]
    worst = max((abs(r["rel_diff"]) for r in with_ref if r["rel_diff"] is not None), default=None)
    summary = {
        "files": len(rows),
        "optimal": sum(r["status"] == "optimal" for r in rows),
        "with_reference": len(with_ref),
        "reference_reproduced_1e-6": sum(r["rel_diff"] is not None and abs(r["rel_diff"]) <= 1e-6
                                         for r in with_ref),
        "worst_rel_diff": worst,
        "dp_time_s": sum(r["time_s"] for r in rows),
        "milp_agrees": None if args.no_milp else sum(bool(r["milp"]["agrees"]) for r in rows),
        "total_s": total,
    }
    print(f"\n{summary['optimal']}/{summary['files']} optimal; references reproduced to 1e-6: "
          f"{summary['reference_reproduced_1e-6']}/{summary['with_reference']} (worst rel. diff "
          f"{_fmt(worst, '.1e')}); DP time {summary['dp_time_s']:.1f} s; total {total:.1f} s"
          + ("" if args.no_milp else f"; CP-SAT agrees on {summary['milp_agrees']}/{len(rows)}"))
    out = {"benchmark": "dp_partitioning", "time_limit_s": args.time_limit, "budget_s": args.budget,
           "milp_time_limit_s": None if args.no_milp else args.milp_time_limit, "summary": summary,
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(_clean(out), indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if summary["reference_reproduced_1e-6"] == summary["with_reference"] else 1


if __name__ == "__main__":
    sys.exit(main())
