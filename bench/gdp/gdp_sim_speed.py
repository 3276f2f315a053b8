"""The GPU-placement simulator's placements per second on the 5,000-op DAG (issue 18's target: >= 1,000/s),
comparing source trees in one run so that before and after see the same machine.

    python bench/gdp/gdp_sim_speed.py --tree after@COMMIT=. --tree before@COMMIT=PATH [--rounds 5] [--out F]

Each ``--tree LABEL@COMMIT=PATH`` is a checkout of ``archplace`` (PATH holds the ``archplace`` package;
COMMIT is recorded, since a copied tree may have no git). The rounds alternate between the trees, each
round a fresh subprocess with ``PYTHONPATH=PATH`` that builds ``workloads.synthetic.layered_dag(5000,
50, seed=0)`` on 8 ``p100-pcie`` GPUs (as ``bench/gdp/gdp_scaling.py``), compiles the kernel outside the
timing and times batches of 64 placements of two kinds: contiguous blocks (few transfers) and uniform
random placements (a transfer on most edges), on one thread (``NUMBA_NUM_THREADS=1``). The result per
tree and kind is the median over rounds of each round's median of 3 timed batches. Only the simulator's
numpy + numba code runs, so the script also runs where Ray and PyTorch are missing (the GPU machine).
Writes the JSON with the commits, command and machine load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import command, git_state, machine  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
from archplace.hardware.gpu_machines import gpu_machine
from archplace.simulators.gpu_placement import PlacementProblem, simulate_batch
from archplace.workloads.synthetic import layered_dag

p = PlacementProblem.from_graph(layered_dag(5000, 50, seed=0), gpu_machine("p100-pcie", 8))
rng = np.random.default_rng(0)
n = p.num_nodes
# topological blocks, as bench/gdp/gdp_scaling.py
blocks = np.repeat(np.arange(8), -(-n // 8))[:n][p.priority]
kinds = {"blocks": np.tile(blocks, (64, 1)), "random": rng.integers(0, 8, size=(64, n))}
out = {"ops": n, "edges": p.num_edges}
for k, P in kinds.items():
    simulate_batch(p, P[:1])
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        simulate_batch(p, P)
        ts.append(time.perf_counter() - t0)
    out[k] = 64 / float(np.median(ts))
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", action="append", required=True, help="LABEL@COMMIT=PATH (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="", help="the machine, in words (recorded)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "gdp_sim_speed.json"))
    args = ap.parse_args()
    load = os.getloadavg()
    trees = []
    for t in args.tree:
        if "=" not in t or "@" not in t.split("=", 1)[0]:
            raise SystemExit(f"--tree {t!r}: expected LABEL@COMMIT=PATH")
        head, path = t.split("=", 1)
        label, commit = head.split("@", 1)
        if not (Path(path) / "archplace" / "simulators").is_dir():
            raise SystemExit(f"--tree {t!r}: {path}/archplace/simulators does not exist")
        trees.append((label, commit, str(Path(path).resolve())))
    rates: dict[str, list[dict]] = {label: [] for label, _, _ in trees}
    for r in range(args.rounds):
        for label, _, path in trees:
            env = {**os.environ, "PYTHONPATH": path, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
            res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                                 timeout=900, cwd=path)
            if res.returncode:
                raise SystemExit(f"tree {label}: the measurement failed:\n{res.stderr[-2000:]}")
            rates[label].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r} {label}: " + ", ".join(f"{k} {rates[label][-1][k]:.0f}/s"
                                                      for k in ("blocks", "random")), flush=True)
    import numpy as np

    summary = {label: {k: float(np.median([x[k] for x in rates[label]])) for k in ("blocks", "random")}
               for label in rates}
    out = {**git_state(), "command": command(), "machine": machine(load), "device": args.device,
           "trees": [{"label": lb, "commit": c} for lb, c, _ in trees], "rounds": args.rounds,
           "placements_per_s": summary, "per_round": rates, "target_per_s": 1000}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    for label, s in summary.items():
        print(f"{label}: blocks {s['blocks']:.0f}/s, random {s['random']:.0f}/s (one thread, 5,000-op DAG)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
