"""Which stage of the MCM constraint repair produces the partition, for uniform proposals (issue 17).

    python bench/mcm/mcm_repair_stages.py [--repairs 50] [--big lstm0_t3_h256,...] [--out PATH]

For every graph and mode, ``--repairs`` seeded repairs of uniform proposals: FIX of a uniformly random
``y`` (chips in ``[0, C)``) and SAMPLE with uniform probabilities ``1 / C``. Per graph set (the six
8-chip small graphs of ``bench/mcm/mcm.py``: four corpus graphs and two two-step LSTMs; and a few of the
36-chip test graphs) and mode it reports the fraction of repairs ending in each stage (``eq4``,
``cpsat``, ``chain``, ``chain-cap<k>``, ``complete``; the chain rate counts every stage starting with
"chain"), the median fraction of nodes whose chip differs from ``y`` (FIX only: a uniform SAMPLE has no
proposal to differ from), the median number of chips used and the median repair wall time. Every output
is checked against Eqs. 2–4 (``simulators.mcm.static_valid``). ``--before PATH`` copies the summaries of
an earlier run (e.g. the code before a change) into the output as ``before``. Runs in one process; writes
``bench/mcm/results/mcm_repair_stages.json`` with the commit, the command and the machine load
(``bench/_meta.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SMALL_GRAPHS = ("cnn00_b2_i32", "dag00_n30_w7", "cnn23_b3_i32", "bert-l1-h256-s128")  # as bench/mcm/mcm.py
SMALL_LSTMS = {"lstm-s0_t2_h256": (2, 256, 101, 32), "lstm-s1_t2_h512": (2, 512, 102, 64)}
BIG_DEFAULT = "lstm0_t3_h256,lstm2_t5_h512,lstm4_t8_h512,bert-l2-h384-s128,llama-l2-h256-s64"


def run_graph(problem, repairs: int, seed: int) -> dict:
    from archplace.algorithms.solvers.mcm_repair import MCMRepairer
    from archplace.simulators.mcm import static_valid

    n, C = problem.num_nodes, problem.num_chips
    src, dst = np.asarray(problem.src), np.asarray(problem.dst)
    rep = MCMRepairer(C, src, dst, num_nodes=n)
    out = {"nodes": n, "chips": C, "edges": int(len(src))}
    for mode in ("fix", "sample"):
        stages: Counter = Counter()
        changed, chips, wall, bad = [], [], [], 0
        for k in range(repairs):
            s = seed * 1_000_003 + k
            y = np.random.default_rng(s).integers(0, C, n)
            if mode == "fix":
                res = rep.repair("fix", y=y, seed=s)
            else:
                res = rep.repair("sample", probs=np.full((n, C), 1.0 / C), seed=s)
            stages[res.stage if res.status == "valid" else f"{res.status}:{res.stage}"] += 1
            wall.append(res.wall_s)
            if res.partition is None:
                bad += 1
                continue
            bad += not bool(static_valid(problem, res.partition)[0])
            if mode == "fix":
                changed.append(res.changed / n)
            chips.append(int(res.partition.max()) + 1)
        chain = sum(v for k, v in stages.items() if k.startswith("chain"))
        out[mode] = {"stages": {k: v / repairs for k, v in sorted(stages.items())},
                     "chain_rate": chain / repairs, "invalid_or_missing": bad,
                     "median_changed_frac": float(np.median(changed)) if changed else None,
                     "median_chips_used": float(np.median(chips)) if chips else None,
                     "median_wall_s": float(np.median(wall)), "max_wall_s": float(np.max(wall)),
                     "total_wall_s": float(np.sum(wall))}
    return out


def summarize(per_graph: dict) -> dict:
    """Pooled over the graphs of a set: stage fractions, chain rate; medians of the per-graph medians."""
    res = {}
    for mode in ("fix", "sample"):
        rows = [g[mode] for g in per_graph.values()]
        st: Counter = Counter()
        for r in rows:
            for k, v in r["stages"].items():
                st[k] += v / len(rows)
        res[mode] = {"stages": dict(sorted(st.items())),
                     "chain_rate": float(np.mean([r["chain_rate"] for r in rows])),
                     "invalid_or_missing": int(sum(r["invalid_or_missing"] for r in rows)),
                     **{k: float(np.median([r[k] for r in rows if r[k] is not None]))
                        if any(r[k] is not None for r in rows) else None
                        for k in ("median_changed_frac", "median_chips_used", "median_wall_s")}}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repairs", type=int, default=50, help="repairs per graph and mode")
    ap.add_argument("--big", default=BIG_DEFAULT, help="36-chip test graphs (comma-separated; '' for none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "mcm_repair_stages.json"))
    ap.add_argument("--before", default="", help="an earlier output whose summaries to copy in")
    args = ap.parse_args()
    load0 = os.getloadavg()
    meta = {**git_state(), "command": command(), "code_version": code_version(
        "archplace.algorithms.solvers.mcm_repair")}

    from archplace.hardware.presets import mcm_package
    from archplace.simulators.mcm import MCMProblem
    from archplace.workloads.corpus import mcm_corpus, split_by_family
    from archplace.workloads.synthetic import rnn_graph

    corpus = mcm_corpus(seed=0)
    small = {g.name: MCMProblem.from_graph(g.graph, mcm_package(8)) for g in corpus if g.name in SMALL_GRAPHS}
    for name, (steps, hidden, seed, batch) in SMALL_LSTMS.items():
        g = rnn_graph(steps, hidden, seed, batch=batch, cell="lstm", bytes_per_element=1)
        small[name] = MCMProblem.from_graph(g, mcm_package(8))
    names = [n for n in args.big.split(",") if n]
    test = {g.name: g for g in split_by_family(corpus)["test"]}
    unknown = sorted(set(names) - set(test))
    if unknown:
        raise SystemExit(f"--big: {unknown} are not test graphs; allowed: {sorted(test)}")
    big = {n: MCMProblem.from_graph(test[n].graph, mcm_package(36)) for n in names}

    out: dict = {"meta": meta, "repairs_per_graph_and_mode": args.repairs, "seed": args.seed, "sets": {}}
    t0 = time.perf_counter()
    for label, probs in (("small_8chip", small), ("test_36chip", big)):
        if not probs:
            continue
        per = {}
        for name, p in probs.items():
            per[name] = run_graph(p, args.repairs, args.seed)
            f, s = per[name]["fix"], per[name]["sample"]
            print(f"[{time.perf_counter() - t0:6.0f} s] {label} {name} ({p.num_nodes} nodes): "
                  f"FIX chain {f['chain_rate']:.0%} changed {f['median_changed_frac'] or 0:.2f} "
                  f"chips {f['median_chips_used']:.0f} wall {f['median_wall_s'] * 1e3:.0f} ms {f['stages']} "
                  "| "
                  f"SAMPLE chain {s['chain_rate']:.0%} chips {s['median_chips_used']:.0f} "
                  f"wall {s['median_wall_s'] * 1e3:.0f} ms {s['stages']}", flush=True)
        out["sets"][label] = {"graphs": per, "summary": summarize(per)}
    if args.before:
        prev = json.loads(Path(args.before).read_text())
        out["before"] = {"meta": prev["meta"], **{k: v["summary"] for k, v in prev["sets"].items()}}
    out["meta"]["machine"] = machine(load0)
    out["meta"]["wall_s"] = time.perf_counter() - t0
    print("\nsummary (chain %, median changed fraction, median chips used, median wall ms):")
    for label, d in out["sets"].items():
        for mode, r in d["summary"].items():
            ch = "  -  " if r["median_changed_frac"] is None else f"{r['median_changed_frac']:.3f}"
            print(f"  {label:<12} {mode:<7} chain {r['chain_rate']:6.1%}  changed {ch}"
                  f"  chips {r['median_chips_used']:4.1f}  wall {r['median_wall_s'] * 1e3:7.1f} ms  "
                  f"invalid {r['invalid_or_missing']}  stages {r['stages']}")
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
