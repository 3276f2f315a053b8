"""Per-trial cost of the search's result store (archplace.platform.store) at 100, 1,000 and 10,000
trials: does recording a trial stay flat as the search grows?

Each trial records 2 rows (one per model, every SCHEMA column filled with realistic values, a
distinct architecture per trial, one failed architecture in 50 and one infeasible in 20) and is
timed exactly as the search's Tune callback does it: ``store.add(rows)`` then
``store.write_best(meta)``, into a temporary directory. For N in (100, 1000, 10000) the table gives
the mean, median and max of the 100 trials ending at trial N; then the final ``close()`` (flush,
best.json, compaction into evaluations.parquet), a ``load()`` of the directory as ``--resume``
would do before compaction, and the file sizes.

Two modes:
  default  the store's default settings in a tight loop (flush every 512 rows; best.json at most
           every 2 s) — the bench the targets are for.
  paced    flush_interval_s = best_interval_s = 0: what a real search sees when trials finish more
           than 2 s apart — every trial writes a part file and best.json (worst-case per-trial cost,
           and one part file per trial until compaction).

Targets (printed, not asserted): the 10,000th trial's window mean < 20 ms and <= 2x the 100th's.

    python bench/platform/store_scale.py [--trials 10000] [--modes default,paced] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

MODELS = ("bert-large", "gpt2-xl")
WINDOW = 100
ERROR = "RayTaskError(RuntimeError): CP-SAT worker crashed in layer slice 17"


def trial_rows(i: int, rnd: random.Random) -> list[dict]:
    """Trial i's rows: architecture i (distinct key), one row per model, all SCHEMA columns."""
    num_tc, num_vc = rnd.choice((1, 2, 4, 8, 16, 32)), rnd.choice((1, 2, 4, 8))
    pe_x, pe_y = rnd.choice((32, 64, 128, 256)), rnd.choice((32, 64, 128, 256))
    pe_vc, glb = rnd.choice((16, 32, 64, 128)), rnd.choice((4.0, 8.0, 16.0, 32.0, 64.0, 128.0))
    key = f"{num_tc}-{num_vc}-{pe_x}-{pe_y}-{pe_vc}-glb{glb:g}-i{i}"
    label = f"{{{num_tc},{num_vc},{pe_x},{pe_y},{pe_vc}}} glb{glb:g}MB"
    status = "failed" if i % 50 == 7 else "infeasible" if i % 20 == 3 else "ok"
    rows = []
    for m in MODELS:
        ok = status == "ok"
        tp = rnd.uniform(100.0, 2000.0) if ok else 0.0
        p, t = rnd.choice((1, 2, 4, 8, 16)), rnd.choice((1, 2, 4, 8))
        stages = [{"first": s * 6, "last": s * 6 + 5, "devices": 1024 // p, "load_s": round(rnd.random(), 6),
                   "memory_gb": round(rnd.uniform(8, 30), 3)} for s in range(p)] if ok else []
        rows.append({
            "trial_id": f"search_trainable_{i:05d}_{rnd.getrandbits(20):05x}", "arch_key": key,
            "arch_label": label, "space_index": i, "num_tc": num_tc, "num_vc": num_vc, "pe_x": pe_x,
            "pe_y": pe_y, "pe_vc": pe_vc, "glb_mb": glb, "area_mm2": rnd.uniform(50.0, 900.0),
            "is_reference": i == 0, "model": m, "status": status,
            "error": ERROR if status == "failed" else "", "throughput": tp,
            "time_per_batch_s": 4096 / tp if ok else float("nan"),
            "p": p if ok else 0, "d": 1024 // (p * t) if ok else 0, "t": t if ok else 0,
            "microbatch": rnd.choice((1, 2, 4, 8)) if ok else 0, "num_stages": p if ok else 0,
            "hbm_gb": rnd.uniform(10.0, 80.0) if ok else float("nan"), "recompute": rnd.random() < 0.5,
            "stages_json": json.dumps(stages), "expert_throughput": 900.0 if i == 0 else float("nan"),
            "expert_pdt": "8,128,1" if i == 0 else "", "estimate_s": rnd.uniform(0.5, 3.0),
            "ilp_s": rnd.uniform(1.0, 30.0), "dp_s": rnd.uniform(0.1, 2.0), "total_s": rnd.uniform(2.0, 40.0),
            "ilp_solved": rnd.randrange(200), "cache_hits": rnd.randrange(400), "schedule": "ilp",
            "ilp_lookups": 400, "ilp_unique": 200,
            "node_id": "a3f2c9d1e0b74c5f8e6d2b1a09c8f7e6d5c4b3a2918070605040302",
            "hostname": "worker-node-3.cluster.local", "pid": 40000 + i % 997, "finished_at": 1.7e9 + i,
        })
    return rows


def run_mode(name: str, trials: int, store_kw: dict) -> dict:
    from archplace.platform.store import ResultStore

    rnd = random.Random(0)
    all_rows = [trial_rows(i, rnd) for i in range(trials)]  # built beforehand: only the store is timed
    meta = {"models": list(MODELS), "num_devices": 1024, "global_batch": 4096, "searcher": "phaze"}
    with tempfile.TemporaryDirectory(prefix="store_scale_") as d:
        out = Path(d) / "search"
        store = ResultStore(out, **store_kw)
        store.write_meta(meta)
        cost = []
        for rows in all_rows:
            t0 = time.perf_counter()
            store.add(rows, "phaze")
            store.write_best(meta)
            cost.append(time.perf_counter() - t0)
        parts = sorted((out / "evaluations").glob("part-*.parquet"))
        before = {"parts": len(parts), "parts_bytes": sum(p.stat().st_size for p in parts),
                  "wal_bytes": store.wal_path.stat().st_size if store.wal_path.exists() else 0}
        t0 = time.perf_counter()
        resumed = ResultStore(out)
        resumed.load()
        load_s = time.perf_counter() - t0
        assert len(resumed) == 2 * trials and len(resumed.finished()) == trials
        del resumed
        t0 = time.perf_counter()
        best = store.close(meta)
        close_s = time.perf_counter() - t0
        assert best["evaluated"] == trials
        sizes = {"evaluations.parquet": store.parquet_path.stat().st_size,
                 "best.json": (out / "best.json").stat().st_size}
    windows = {}
    for n in (100, 1000, 10000):
        if n <= trials:
            w = cost[n - WINDOW:n]
            windows[str(n)] = {"mean_ms": 1e3 * statistics.fmean(w), "median_ms": 1e3 * statistics.median(w),
                               "max_ms": 1e3 * max(w)}
    return {"mode": name, "store_settings": store_kw, "trials": trials, "windows": windows,
            "all_trials": {"mean_ms": 1e3 * statistics.fmean(cost), "max_ms": 1e3 * max(cost),
                           "total_s": sum(cost)},
            "before_close": before, "load_s": load_s, "close_s": close_s, "file_bytes": sizes}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=10000)
    ap.add_argument("--modes", default="default,paced", help="comma-separated: default, paced")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "store_scale.json"))
    args = ap.parse_args()
    modes = {"default": {}, "paced": {"flush_interval_s": 0.0, "best_interval_s": 0.0}}
    load_before = os.getloadavg()
    runs = [run_mode(m, args.trials, modes[m]) for m in args.modes.split(",")]
    load_after = os.getloadavg()

    targets = {}
    for r in runs:
        w = r["windows"]
        print(f"\nmode {r['mode']} {r['store_settings'] or '(defaults)'}: per-trial add() + write_best(), "
              f"window of the {WINDOW} trials ending at trial N")
        print(f"{'N':>7s} {'mean ms':>9s} {'median ms':>10s} {'max ms':>9s}")
        for n, v in w.items():
            print(f"{int(n):7,d} {v['mean_ms']:9.3f} {v['median_ms']:10.3f} {v['max_ms']:9.3f}")
        b = r["before_close"]
        print(f"before close: {b['parts']} part files ({b['parts_bytes'] / 1e6:.2f} MB), "
              f"log {b['wal_bytes'] / 1e3:.1f} kB; load() (resume) {r['load_s'] * 1e3:.0f} ms")
        size = r["file_bytes"]
        print(f"close() (flush + best.json + compaction): {r['close_s'] * 1e3:.1f} ms; evaluations.parquet "
              f"{size['evaluations.parquet'] / 1e6:.2f} MB, best.json {size['best.json']:,d} B")
        last = str(max(int(n) for n in w))
        if last != "100" and "100" in w:
            t = {"last_window_mean_ms": w[last]["mean_ms"], "under_20_ms": w[last]["mean_ms"] < 20.0,
                 "ratio_to_trial_100": w[last]["mean_ms"] / w["100"]["mean_ms"]}
            t["ratio_at_most_2"] = t["ratio_to_trial_100"] <= 2.0
            targets[r["mode"]] = t
            print(f"target: trial {int(last):,d} window mean {t['last_window_mean_ms']:.3f} ms < 20 ms: "
                  f"{t['under_20_ms']}; {t['ratio_to_trial_100']:.2f}x trial 100 (<= 2x): "
                  f"{t['ratio_at_most_2']}")

    out = {"bench": "store_scale", "git": git_state(), "command": command(),
           "machine": {**machine(load_before), "loadavg_after": load_after},
           "window": WINDOW, "models": list(MODELS), "runs": runs, "targets": targets}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
