"""Time and peak memory of capturing every preset's training graph (issue: < 60 s, < 4 GB each).

Each model runs in a fresh Python process so its peak resident memory is its own. Captures the
full training graph (forward + backward) at the preset's sequence length, microbatch 1, for every
TMP width the preset lists. Prints a table and writes JSON (default
bench/platform/results/graph_capture.json).

    python bench/platform/graph_capture.py [--models bert-large gpt3-175b] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401  (import cost reported separately)
from archplace.workloads.models import PRESETS, build_graph
t1 = time.perf_counter()
name = sys.argv[1]
rows = []
for t in PRESETS[name].tmp_widths:
    s = time.perf_counter()
    g = build_graph(name, mbs=1, tmp=t)
    rows.append({"tmp": t, "ops": g.num_nodes, "edges": g.num_edges, "seconds": time.perf_counter() - s})
total = time.perf_counter() - t1
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"model": name, "import_s": t1 - t0, "capture_s": total, "peak_rss_bytes": peak,
                  "widths": rows, "layers": len(g.meta["layers"])}))
"""


def main() -> int:
    from archplace.workloads.models import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=list(PRESETS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "graph_capture.json"))
    args = ap.parse_args()
    results = []
    print(f"{'model':15s} {'layers':>6s} {'tmp widths':>10s} {'ops (t=1)':>10s} {'capture s':>10s} "
          f"{'import s':>9s} {'peak RSS GB':>11s}  target")
    for name in args.models:
        out = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{name:15s} FAILED: {out.stderr.strip().splitlines()[-1]}")
            results.append({"model": name, "error": out.stderr.strip().splitlines()[-1]})
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        r["meets_target"] = r["capture_s"] < 60 and r["peak_rss_bytes"] < 4e9
        results.append(r)
        widths = ",".join(str(w["tmp"]) for w in r["widths"])
        print(f"{name:15s} {r['layers']:6d} {widths:>10s} {r['widths'][0]['ops']:10,d} "
              f"{r['capture_s']:10.2f} {r['import_s']:9.2f} {r['peak_rss_bytes'] / 1e9:11.2f}  "
              f"{'ok' if r['meets_target'] else 'MISSED'}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"benchmark": "graph_capture", "results": results}, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
