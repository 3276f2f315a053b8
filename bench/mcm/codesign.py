"""MCM co-design sweep (issue 32 items 3-4): which placer, inside a sweep of chiplet packages, finds the
best design, and does the pre-trained policy pay by amortisation?

    python bench/mcm/codesign.py mcm [--points 200] [--models bert-base,bert-large] [--seeds 0,1,2]
                                 [--placers greedy+lns,cpsat,ppo-pretrained,ppo-pretrained+ft64]
                                 [--sweep-s 3600]
                                 [--subsolves 16] [--det-time 0.25] [--workers N] [--address ADDR]
                                 [--out FILE.json]
    python bench/mcm/codesign.py pretrain [--train-points 8] [--train-models bert-48,hf:tests/data/...]
                                      [--subsolves 640]
                                      [--points 200 --seeds 0,1,2 --models bert-base,bert-large]
                                      [--policy FILE.npz]
    python bench/mcm/codesign.py scale [--points 200] [--placers greedy+lns] [--seed 0]
    python bench/mcm/codesign.py gpu [--points 1000] [--models bert-48,t5-3b] [--seed 0] [--workers N]
                                 [--address ADDR] [--out FILE.json]

**mcm.** For every seed and placer: ``archplace search --target mcm`` (``api.search``) over the packaged
space (``tune_configs/mcm_codesign.yaml``, 1,080 packages) with the ``random`` searcher, ``--points``
packages in the seed's order (the same packages in the same order for every placer of a seed; default
models bert-base and bert-large: t5-base and opt-350m fit no package of the space, their greedy partitions
break the 64 MB per chiplet at every size, and the placers all start from greedy), each
model partitioned by the placer on a deterministic budget (``--subsolves`` CP-SAT sub-solves of
``--det-time`` units; cpsat: the same work in one solve; ppo-pretrained: the pre-trained learned-LNS
policy zero-shot, ``bench/mcm/results/mcm_large_policy.npz``, or ``--policy``; ppo-pretrained+ftN: the
same policy fine-tuned by PPO for N sub-solves per model on each package first; ppo-untrained: the
learning-off control, the same network with ``pretrain``'s initial weights; ``split_placer``).
**Equal sweep time:** every (placer, seed) run is
stopped ``--sweep-s`` seconds after it starts (the trials in flight finish; ``api.search``'s cancel), so a
faster placer covers more packages. That cut-off is wall clock by the issue's definition of the
comparison; everything inside a point is load-independent, so a run's rows are a prefix of the
same-seed run on an idle machine. Ray and the model graphs are set up once before the first clock starts.

Per run: packages covered, the best design (throughput per k$ averaged over the models) and when it was
found (seconds from the run's start), the hypervolume of the (average throughput, package cost) front
against the reference point (0 throughput, the space's dearest package × 1.1), with throughput normalised
by the largest any run found. Per placer: those over seeds. The pre-trained policy "pays" when it reaches
the best design, or a larger hypervolume, at equal time. Runs are kept (``--runs-dir``) and a finished run
is not run again (same code version, settings).

**pretrain** (item 3: "pre-train one MCM partition policy on a training set of hardware points and
models; hold out some"): one learned-LNS policy trained by PPO (``train_hint_policy``, ``--subsolves``
sub-solves in all, default 640) on ``--train-points`` packages that none of the sweep's seeds draws (so
every sweep package is held out) and ``--train-models`` (default BERT-48 and the tests' small GPT-2
config; the sweep's bert-base and bert-large are held out). ``mcm --placers ppo-pretrained --policy
results/codesign_policy.npz`` then sweeps with it. Without ``--policy`` the sweep uses
``bench/mcm/mcm_large.py``'s policy (synthetic graphs on mcm-36: everything in the sweep is held out from it).

**scale** (item 4): the ``--points`` sweep with the first of ``--placers`` on the embedded Ray and through
``--address`` on a local two-node cluster, every row compared (``run_scale``).

**gpu.** ``archplace search --target gpu-cluster`` (random, ``--points`` shapes) through the same platform
path; the GPU-cluster sweep in plain Ray tasks is ``bench/gpu/codesign_gpu.py``.

Writes ``--out`` (default ``bench/mcm/results/codesign_mcm.json`` / ``codesign_gpu_search.json``) with commit,
command and load (``bench/_meta.py``) and a Pareto plot beside it (.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPO = Path(__file__).resolve().parents[2]
CODE = ("archplace.platform", "archplace.algorithms", "archplace.simulators", "archplace.hardware")


def designs(out: Path) -> list[dict]:
    """Per package of a run: average throughput over the models (0 unless all are feasible), cost,
    throughput per k$, and when its rows finished."""
    import pyarrow.parquet as pq

    by: dict[str, list[dict]] = {}
    for r in pq.read_table(out / "evaluations.parquet").to_pylist():
        by.setdefault(r["arch_key"], []).append(r)
    res = []
    for key, rs in by.items():
        ok = all(r["status"] == "ok" for r in rs)
        tp = float(np.mean([r["throughput"] for r in rs])) if ok else 0.0
        cost = float(rs[0]["cost_usd"])
        res.append({"arch_key": key, "ok": ok and tp > 0, "throughput_avg": tp, "cost_usd": cost,
                    "per_kusd": tp / cost * 1e3 if cost > 0 else 0.0,
                    "finished_at": max(float(r["finished_at"]) for r in rs)})
    return res


def hypervolume(points: list[tuple[float, float]], tp_norm: float, cost_ref: float) -> float:
    """Area dominated by (throughput / tp_norm, cost) points (max throughput, min cost) inside
    [0, 1] x [0, cost_ref]: the staircase over the points sorted by cost."""
    pts = sorted((c, t / tp_norm) for t, c in points if t > 0 and c < cost_ref)
    area, best = 0.0, 0.0
    for i, (c, t) in enumerate(pts):
        best = max(best, t)
        nxt = pts[i + 1][0] if i + 1 < len(pts) else cost_ref
        area += best * (nxt - c)
    return area


def untrained_path(policy: Path) -> Path:
    """Where ``pretrain`` writes the initial weights of the policy it trains (the learning-off control)."""
    return policy.with_name(policy.stem + "_untrained" + policy.suffix)


def split_placer(name: str) -> tuple[str, int]:
    """``ppo-pretrained+ftN`` is the pre-trained policy fine-tuned by PPO for N sub-solves per model and
    package before its search (``--finetune-subsolves N``); ``ppo-untrained`` is ppo-pretrained with the
    pre-trained policy's initial weights (``untrained_path``: learning switched off); every other name is
    the placer itself."""
    if name == "ppo-untrained":
        return "ppo-pretrained", 0
    if "+ft" in name:
        base, n = name.split("+ft", 1)
        if base != "ppo-pretrained" or not n.isdigit():
            raise SystemExit(f"--placers: {name!r}: +ftN applies to ppo-pretrained, N an integer")
        return base, int(n)
    return name, 0


def policy_for(placer: str, policy: str | None) -> str | None:
    if placer != "ppo-untrained":
        return policy
    if policy is None:
        raise SystemExit("--placers ppo-untrained needs --policy (a policy `pretrain` wrote, beside its "
                         "_untrained weights)")
    return str(untrained_path(Path(policy)))


def run_mcm(args) -> dict:
    from archplace import api
    from archplace.hardware.chiplet_cost import CostParams, package_cost
    from archplace.platform.mcm_trial import MCMDesign, all_points, load_space

    space = load_space(args.space)
    cost = CostParams.from_dict(space["cost"])
    dearest = max(package_cost(d.num_chiplets, d.pe, d.sram_mb, d.link_gbs, d.topology, cost).package_usd
                  for d in map(MCMDesign.from_config, all_points(space)))
    version = code_version(*CODE)
    runs_dir = Path(args.runs_dir)
    # Ray and the model graphs once, before any clock starts: the sweep time is the placers' and trials'
    from archplace.platform.mcm_trial import mcm_graph
    from archplace.platform.search import connect

    connect(args.address)
    for m in args.models:
        mcm_graph(m)
    runs: dict[str, dict] = {}
    for seed in args.seeds:
        for placer in args.placers:
            name = f"{placer}-s{seed}"
            out = runs_dir / name
            done = out / "bench_run.json"
            settings = {"placer": placer, "seed": seed, "points": args.points, "models": args.models,
                        "sweep_s": args.sweep_s, "subsolves": args.subsolves, "det_time": args.det_time,
                        "space": args.space, "policy": args.policy, "code_version": version}
            if done.exists() and json.loads(done.read_text()).get("settings") == settings:
                runs[name] = json.loads(done.read_text())
                print(f"{name}: kept", flush=True)
                continue
            if out.exists():
                import shutil

                shutil.rmtree(out)
            cancel = threading.Event()
            timer = threading.Timer(args.sweep_s, cancel.set)
            t0, load0 = time.time(), list(os.getloadavg())
            timer.start()
            base, ft = split_placer(placer)
            try:
                res = api.search(api.SearchRequest(
                    models=tuple(args.models), target="mcm", out_dir=str(out), searcher="random",
                    budget=args.points, seed=seed, placer=base, subsolves=args.subsolves,
                    det_time=args.det_time, workers=args.workers, address=args.address, space=args.space,
                    policy=policy_for(placer, args.policy) if base.startswith("ppo") else None,
                    finetune_subsolves=ft),
                    cancel=cancel)
            finally:
                timer.cancel()
            wall = time.time() - t0
            ds = designs(out)
            ok = [d for d in ds if d["ok"]]
            best = max(ok, key=lambda d: d["per_kusd"]) if ok else None
            run = {"settings": settings, "covered": len(ds), "feasible": len(ok), "wall_s": wall,
                   "loadavg_before": load0, "loadavg_after": list(os.getloadavg()), **git_state(),
                   "command": command(),
                   "cancelled": bool(res.stats.get("cancelled")),
                   "best": None if best is None else {**best, "found_after_s": best["finished_at"] - t0},
                   "front": [(d["throughput_avg"], d["cost_usd"]) for d in ok]}
            done.write_text(json.dumps(run))
            runs[name] = run
            print(f"{name}: {run['covered']} packages in {wall:.0f} s, best "
                  f"{best['arch_key'] if best else None}", flush=True)
    tp_norm = max((t for r in runs.values() for t, _ in r["front"]), default=1.0) or 1.0
    cost_ref = dearest * 1.1
    table = {}
    for placer in args.placers:
        rs = [runs[f"{placer}-s{s}"] for s in args.seeds]
        hv = [hypervolume(r["front"], tp_norm, cost_ref) / cost_ref for r in rs]
        for r, h in zip(rs, hv):
            r["hypervolume"] = h
        table[placer] = {"covered_mean": float(np.mean([r["covered"] for r in rs])),
                         "hypervolume_mean": float(np.mean(hv)), "hypervolume": hv,
                         "best_per_kusd": [r["best"]["per_kusd"] if r["best"] else 0.0 for r in rs],
                         "best_design": [r["best"]["arch_key"] if r["best"] else None for r in rs],
                         "best_found_after_s": [r["best"]["found_after_s"] if r["best"] else None
                                                for r in rs]}
    overall = max(((r["best"]["per_kusd"], n) for n, r in runs.items() if r["best"]), default=None)
    seeds = {}
    for seed in args.seeds:
        # the seed's best design over every placer's run, and who reached it (within 0.01%) how soon
        bests = {p: runs[f"{p}-s{seed}"]["best"] for p in args.placers}
        top = max((b["per_kusd"] for b in bests.values() if b), default=0.0)
        reached = {p: round(b["found_after_s"], 1) for p, b in bests.items()
                   if b and b["per_kusd"] >= top * (1 - 1e-4)}
        seeds[str(seed)] = {"best_per_kusd": top, "reached_by": reached}
    for placer in args.placers:
        table[placer]["reached_seed_best"] = sum(placer in v["reached_by"] for v in seeds.values())
        table[placer]["quality_vs_first_placer"] = quality(runs_dir, placer, args.placers[0], args.seeds)
    return {"runs": runs, "table": table, "seeds": seeds, "tp_norm": tp_norm, "cost_ref_usd": cost_ref,
            "best_overall": None if overall is None else {"per_kusd": overall[0], "run": overall[1]}}


def quality(runs_dir: Path, placer: str, ref: str, seeds: list[int]) -> dict:
    """Placement quality apart from coverage: on the packages that both ``placer``'s and ``ref``'s run of a
    seed covered and found feasible, the geomean of the average-throughput ratio placer / ref, and how
    many packages it was higher, equal, lower."""
    ratios = []
    for seed in seeds:
        a = {d["arch_key"]: d for d in designs(runs_dir / f"{placer}-s{seed}") if d["ok"]}
        b = {d["arch_key"]: d for d in designs(runs_dir / f"{ref}-s{seed}") if d["ok"]}
        ratios += [a[k]["throughput_avg"] / b[k]["throughput_avg"] for k in sorted(set(a) & set(b))]
    r = np.array(ratios)
    return {"packages": int(r.size), "geomean": float(np.exp(np.log(r).mean())) if r.size else None,
            "higher": int((r > 1 + 1e-9).sum()), "equal": int((abs(r - 1) <= 1e-9).sum()),
            "lower": int((r < 1 - 1e-9).sum())}


def plot_mcm(path: Path, result: dict, seed: int) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return
    from archplace.platform.codesign_report import pareto_mask

    fig = Figure(figsize=(7.0, 4.8))
    ax = fig.subplots()
    for i, (name, r) in enumerate(sorted(result["runs"].items())):
        if not name.endswith(f"-s{seed}") or not r["front"]:
            continue
        tp = np.array([t for t, _ in r["front"]])
        c = np.array([c for _, c in r["front"]])
        on = pareto_mask(tp, c)
        o = np.argsort(c[on])
        label = f"{name.rsplit('-s', 1)[0]} ({len(tp)} feasible)"
        ax.plot(c[on][o], tp[on][o], "o-", color=f"C{i}", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("package cost (USD)")
    ax.set_ylabel("average throughput (samples/s)")
    ax.set_title(f"MCM co-design: Pareto fronts at equal sweep time (seed {seed})")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110, format="png")


def run_pretrain(args) -> dict:
    """One learned-LNS policy (``mcm_lns_ppo.train_hint_policy``) on a training set of (package, model)
    problems: packages drawn from the space outside every sweep seed's packages (held-out hardware),
    models other than the sweep's (held-out models), each from its greedy partition; pairs whose greedy
    partition is invalid (the weights do not fit) are left out. Writes the weights for ``--policy``."""
    from archplace.algorithms.rl.mcm_lns_ppo import train_hint_policy
    from archplace.algorithms.rl.mcm_ppo import save_state
    from archplace.algorithms.search.mcm_baselines import greedy
    from archplace.platform.codesign import point_order
    from archplace.platform.mcm_trial import MCMDesign, all_points, load_space, mcm_graph
    from archplace.platform.search import connect
    from archplace.simulators.mcm import MCMProblem

    space = load_space(args.space)
    pts = all_points(space)
    swept = {i for s in args.seeds for i in point_order("random", len(pts), args.points, s)}
    rng = np.random.default_rng(100 + args.seed)
    pool = [i for i in rng.permutation(len(pts)) if int(i) not in swept]
    graphs = {m: mcm_graph(m) for m in args.train_models}
    problems, names = [], []
    for i in pool:
        if len(problems) >= args.train_points * len(graphs):
            break
        d = MCMDesign.from_config(pts[int(i)])
        for m, g in graphs.items():
            p = MCMProblem.from_graph(g, d.package())
            try:
                ok = greedy(p, seed=args.seed, time_limit_s=600.0)[1] > 0
            except RuntimeError:
                ok = False
            if ok:
                problems.append(p)
                names.append(f"{m}@{d.key()}")
    if not problems:
        raise SystemExit("pretrain: no (package, model) pair of the training set has a valid greedy "
                         "partition")
    connect(args.address)
    t0 = time.time()
    init, final, info = train_hint_policy(problems, args.subsolves, seed=args.seed, det_time=args.det_time)
    out = Path(args.policy or RESULTS / "codesign_policy.npz")
    save_state(out, final, problems=names, subsolves=info["subsolves"], seed=args.seed,
               det_time=args.det_time, held_out_models=args.models, swept_seeds=args.seeds)
    # the learning-off control (``--placers ppo-untrained``): the same network before any update
    save_state(untrained_path(out), init, problems=names, subsolves=0, seed=args.seed, det_time=args.det_time)
    return {"policy": str(out), "untrained_policy": str(untrained_path(out)), "problems": names,
            "wall_s": time.time() - t0,
            **{k: v for k, v in info.items() if k != "episode_return_mean"},
            "episode_return_mean": info["episode_return_mean"]}


def run_scale(args) -> dict:
    """Issue 32 item 4: the same ``--points`` MCM sweep (``--placers``' first, ``--seed``, no time cut) on
    the embedded Ray and through ``--address`` on a two-node ``ray start`` cluster on 127.0.0.1 (token
    auth on; ``tests/cluster_util.two_node_cluster``, one CPU per node so both runs have two trials in
    flight), then every row compared: package, model, throughput, partition and sub-solves."""
    import subprocess

    import pyarrow.parquet as pq

    from archplace import api

    sys.path.insert(0, str(REPO / "tests"))
    from cluster_util import two_node_cluster

    placer = args.placers[0]
    base, ft = split_placer(placer)
    runs_dir = Path(args.runs_dir)
    flags = ["--target", "mcm", "--searcher", "random", "--budget", str(args.points),
             "--seed", str(args.seed), "--placer", base, "--subsolves", str(args.subsolves),
             "--det-time", str(args.det_time), "--finetune-subsolves", str(ft)]
    res, nodes = {}, 0
    for where in ("embedded", "cluster"):
        out = runs_dir / f"scale-{placer}-s{args.seed}-{where}"
        marker = out / "scale_run.json"
        settings = {"flags": flags, "models": args.models, "code_version": code_version(*CODE)}
        if marker.exists() and json.loads(marker.read_text())["settings"] == settings:
            res[where] = json.loads(marker.read_text())["result"]   # a finished run of the same code
            print(f"{where}: kept", flush=True)
            continue
        if out.exists():
            import shutil

            shutil.rmtree(out)
        t0 = time.time()
        if where == "embedded":
            r = api.search(api.SearchRequest(models=tuple(args.models), target="mcm", out_dir=str(out),
                                             searcher="random", budget=args.points, seed=args.seed,
                                             placer=base, subsolves=args.subsolves, det_time=args.det_time,
                                             finetune_subsolves=ft, workers=2)).to_dict()
            import ray

            ray.shutdown()
        else:
            with two_node_cluster(runs_dir / "scale-cluster", head_cpus=1, worker_cpus=1) as c:
                argv = [sys.executable, "-m", "archplace.cli", "search", *args.models, *flags,
                        "--address", c.gcs_address, "--out", str(out), "--json"]
                done = subprocess.run(argv, cwd=REPO, env={**c.env, "PYTHONPATH": str(REPO)},
                                      capture_output=True, text=True, timeout=6 * 3600)
                if done.returncode:
                    raise SystemExit(f"cluster run failed:\n{done.stderr[-4000:]}")
                r = json.loads(done.stdout)
                nodes = len(c.list_nodes())
        rows = pq.read_table(out / "evaluations.parquet").to_pylist()
        res[where] = {"wall_s": time.time() - t0, "evaluated": r["evaluated"], "rows": len(rows),
                      "best": (r.get("common") or {}).get("arch_key"), "pareto": r.get("pareto"),
                      "nodes": nodes if where == "cluster" else 1,
                      "table": {f"{x['arch_key']}|{x['model']}": [x["throughput"], x["partition_json"],
                                                                  x["subsolves"], x["status"]] for x in rows}}
        marker.write_text(json.dumps({"settings": settings, "result": res[where], **git_state(),
                                      "command": command()}))
    a, b = res["embedded"].pop("table"), res["cluster"].pop("table")
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return {"placer": placer, "seed": args.seed, "points": args.points, "models": args.models, **res,
            "rows_compared": len(set(a) | set(b)), "rows_differ": differ,
            "identical": not differ and res["embedded"]["pareto"] == res["cluster"]["pareto"]}


def run_gpu(args) -> dict:
    from archplace import api

    out = Path(args.runs_dir) / f"gpu-s{args.seed}"
    res = api.search(api.SearchRequest(models=tuple(args.models), target="gpu-cluster", out_dir=str(out),
                                       searcher="random", budget=args.points, seed=args.seed,
                                       workers=args.workers, address=args.address, space=args.space,
                                       resume=out.exists()))
    d = res.to_dict()
    return {"evaluated": d["evaluated"], "infeasible": d["infeasible"], "best": d["common"],
            "pareto": d["pareto"], "wall_s": d["stats"].get("wall_s"), "out_dir": str(out)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("mcm", "pretrain", "scale", "gpu"))
    ap.add_argument("--policy", help="mcm: ppo-* weights (default bench/mcm/results/mcm_large_policy.npz); "
                                     "pretrain: where to write them (default results/codesign_policy.npz)")
    ap.add_argument("--train-points", type=int, default=8, help="pretrain: packages of the training set")
    ap.add_argument("--train-models", default=f"bert-48,hf:{REPO / 'tests/data/small_gpt2_config.json'}",
                    help="pretrain: models of the training set")
    ap.add_argument("--points", type=int)
    ap.add_argument("--models")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--placers", default="greedy+lns,cpsat,ppo-pretrained")
    ap.add_argument("--sweep-s", type=float, default=3600.0)
    ap.add_argument("--subsolves", type=int, default=16)
    ap.add_argument("--det-time", type=float, default=0.25)
    ap.add_argument("--workers", type=int)
    ap.add_argument("--address")
    ap.add_argument("--space")
    ap.add_argument("--runs-dir")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    load = tuple(os.getloadavg())
    if args.what in ("mcm", "pretrain", "scale"):
        args.points = args.points or 200
        args.models = (args.models or "bert-base,bert-large").split(",")
        args.seeds = [int(s) for s in args.seeds.split(",")]
        args.placers = args.placers.split(",")
        args.runs_dir = args.runs_dir or str(RESULTS / "codesign_mcm_runs")
        args.train_models = args.train_models.split(",")
    if args.what == "pretrain":
        args.subsolves = args.subsolves if args.subsolves != 16 else 640
        out = Path(args.out or RESULTS / "codesign_pretrain.json")
        result = run_pretrain(args)
        print(f"trained on {len(result['problems'])} problems, {result['subsolves']} sub-solves, "
              f"{result['wall_s']:.0f} s: {result['policy']}")
    elif args.what == "scale":
        out = Path(args.out or RESULTS / "codesign_mcm_scale.json")
        result = run_scale(args)
        print(f"{result['rows_compared']} rows, {len(result['rows_differ'])} differ; embedded "
              f"{result['embedded']['wall_s']:.0f} s, 2-node cluster {result['cluster']['wall_s']:.0f} s")
    elif args.what == "mcm":
        out = Path(args.out or RESULTS / "codesign_mcm.json")
        result = run_mcm(args)
        plot_mcm(out.with_suffix(".png"), result, args.seeds[0])
        for placer, row in result["table"].items():
            print(f"{placer:16s} covered {row['covered_mean']:.0f}  "
                  f"hypervolume {row['hypervolume_mean']:.4f}  "
                  f"best per k$ {[round(x, 1) for x in row['best_per_kusd']]}  found after "
                  f"{[None if s is None else round(s) for s in row['best_found_after_s']]} s; reached the "
                  f"seed's best {row['reached_seed_best']}/{len(args.seeds)}; vs {args.placers[0]} on shared "
                  f"packages {row['quality_vs_first_placer']}")
    else:
        args.points = args.points or 1000
        args.models = (args.models or "bert-48,t5-3b").split(",")
        args.runs_dir = args.runs_dir or str(RESULTS / "codesign_gpu_runs")
        out = Path(args.out or RESULTS / "codesign_gpu_search.json")
        result = run_gpu(args)
        print(f"{result['evaluated']} shapes, best {result['best'] and result['best']['arch_key']}, "
              f"front {len(result['pareto'])}")
    record = {**git_state(), "command": command(), "machine": machine(load),
              "code_version": code_version(*CODE), "settings": {k: v for k, v in vars(args).items()},
              "result": result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, default=lambda o: None if isinstance(o, float) and
                              not math.isfinite(o) else str(o)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
