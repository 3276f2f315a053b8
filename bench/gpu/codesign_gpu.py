"""GPU-cluster co-design sweep (issue 32 item 4: "a 1,000-point GPU-cluster sweep"): distinct shapes drawn
from ``tune_configs/gpu_cluster_space.yaml`` (seeded, without replacement), each evaluated by
``platform.gpu_cluster_trial.evaluate_cluster`` (the exact pipeline DP per model, price from the cited
on-demand table) in plain Ray tasks, one chunk of points per task; then the time-vs-cost Pareto front
over all models (one step of each in turn) and per model, and a plot.

The budget is counted in points (each point = one DP per model and stage count tried; the DP itself
stops on its deterministic sub-problem budget), so the answer does not depend on the machine's load;
``--max-wall-s`` is only an outer safety limit (a run cut by it says so and keeps what finished).

Writes ``--out`` (default bench/gpu/results/codesign_gpu.json) with commit, command, load
(``bench/_meta.py``), code version, the settings, every point as a compact table, the fronts and the
best designs, and ``--plot`` (default beside it, .png) when matplotlib is installed. Also (issue 44):

- ``network_price_sensitivity``: the all-model front again with the network's price per Gb/s-hour
  scaled by 0 (a free network, the first sweep's pricing), 0.25 and 2 (times do not depend on the
  price, so no point is re-planned);
- ``tracked``: where the ``--track`` shapes end up (on a front or not, their rank by cost per step and
  by time, and which front point beats them), each evaluated apart when the sample did not draw it.

    python bench/gpu/codesign_gpu.py [--points 1000] [--models bert-48,t5-3b] [--workers 1] [--seed 0]
                                 [--space FILE.yaml] [--out FILE.json] [--plot FILE.png] [--track A,B]
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _meta
from _meta import code_version, command, git_state, machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
# the columns of the compact table of every point (per model: M.<field>)
SHAPE_COLS = ("gpu", "gpus_per_server", "num_servers", "intra_class", "inter_class", "num_gpus",
              "network_gbps_per_server", "inter_server_bytes_per_s", "listed", "network_usd_per_hour",
              "price_per_hour_usd", "iteration_time_s", "cost_per_step_usd", "memory_fit", "wall_s")
# the issue-44 shape: 2 x p4d (its 400 Gb/s of EFA shared by 8 GPUs), and the same servers with a p5's
# 3,200 Gb/s network (the per-GPU rate the first sweep gave every "ib-ndr-400g" shape, at most PCIe)
TRACK = "a100-40gb-2x8-nvlink-efa-400g,a100-40gb-2x8-nvlink-efa-3200g"
NETWORK_PRICE_SCALES = (0.0, 0.25, 1.0, 2.0)
MODEL_COLS = ("iteration_time_s", "cost_per_step_usd", "memory_fit", "stages", "devices", "peak_memory_gib",
              "proven_optimal", "dp_states", "dp_subproblems", "simulator_calls", "dp_wall_s")


def evaluate_chunk(configs: list[dict], models: list[str], training: dict) -> list[dict]:
    """One Ray task: the rows of a chunk of points (the per-process profile cache is shared inside)."""
    from archplace.hardware.gpu_cluster_space import shape_from_config
    from archplace.platform.gpu_cluster_trial import evaluate_cluster

    return [evaluate_cluster(shape_from_config(c), models, **training) for c in configs]


def compact(rows: list[dict], models: list[str]) -> dict:
    cols = list(SHAPE_COLS) + [f"{m}.{c}" for m in models for c in MODEL_COLS]
    return {"columns": cols, "rows": [[r.get(c) for c in cols] for r in rows]}


def front_summary(front: list[dict], models: list[str], x: str, y: str) -> list[dict]:
    keep = ("shape", "gpu", "gpus_per_server", "num_servers", "intra_class", "inter_class", "num_gpus",
            "inter_server_bytes_per_s", "listed", "price_per_hour_usd", "network_usd_per_hour", "price_basis")
    out = []
    for r in front:
        d = {k: r[k] for k in keep}
        d.update({x: r[x], y: r[y]})
        for m in models:
            d[m] = {k: r[f"{m}.{k}"] for k in ("iteration_time_s", "cost_per_step_usd", "stages", "devices",
                                                "cut_layers", "peak_memory_gib")}
        out.append(d)
    return out


def config_of_name(name: str, space: dict) -> dict:
    """The shape config of a name ``GPU-SxG-INTRA-INTER`` (``ClusterShape.name``), read against the
    space's GPU and class lists (GPU and class names hold dashes); a one-line error otherwise."""
    from archplace.hardware.gpu_cluster_space import CLUSTER_GPUS, INTER_CLASSES, INTRA_CLASSES

    for g in CLUSTER_GPUS:
        for intra in INTRA_CLASSES:
            for inter in INTER_CLASSES:
                head, tail = f"{g}-", f"-{intra}-{inter}"
                if name.startswith(head) and name.endswith(tail):
                    mid = name[len(head):len(name) - len(tail)]
                    s, _, gp = mid.partition("x")
                    if s.isdigit() and gp.isdigit():
                        return {"gpu": g, "gpus_per_server": int(gp), "num_servers": int(s),
                                "intra_class": intra, "inter_class": inter}
    raise ValueError(f"--track shape {name!r} is not GPU-SxG-INTRA-INTER of the space's lists")


def repriced(rows: list[dict], models: list[str], scale: float) -> list[dict]:
    """The rows with prices at ``scale`` x the network's price per Gb/s-hour (times unchanged)."""
    from archplace.hardware.cluster_prices import NETWORK_USD_PER_GBPS_HOUR, price_per_hour_usd
    from archplace.hardware.gpu_cluster_space import shape_from_config

    out = []
    for r in rows:
        price = price_per_hour_usd(shape_from_config(r), scale * NETWORK_USD_PER_GBPS_HOUR)
        q = {**r, "price_per_hour_usd": price}
        for m in models:
            t = r[f"{m}.iteration_time_s"]
            q[f"{m}.cost_per_step_usd"] = None if t is None else t * price / 3600.0
        q["cost_per_step_usd"] = None if r["iteration_time_s"] is None else \
            r["iteration_time_s"] * price / 3600.0
        out.append(q)
    return out


def where(row: dict, rows: list[dict], front: list[dict], x: str, y: str) -> dict:
    """Where ``row`` stands among ``rows`` on (x, y): on the front, its rank on each axis (1 = best),
    and the front points that beat it on both."""
    if row.get(x) is None or row.get(y) is None:
        return {"fits": False}
    ok = [r for r in rows if r.get(x) is not None and r.get(y) is not None]
    beats = [f["shape"] for f in front if f[x] <= row[x] and f[y] <= row[y]
             and (f[x] < row[x] or f[y] < row[y])]
    return {"fits": True, x: row[x], y: row[y], "on_front": not beats,
            "rank_by_cost": 1 + sum(r[x] < row[x] for r in ok),
            "rank_by_time": 1 + sum(r[y] < row[y] for r in ok), "of": len(ok), "dominated_by": beats}


def plot(path: Path, rows: list[dict], models: list[str]) -> bool:
    """Time vs cost per step, one panel for all models and one per model, coloured by GPU, the Pareto front
    as a step line. matplotlib's Figure (never pyplot); False when matplotlib is missing."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return False
    from archplace.platform.gpu_cluster_trial import pareto_front

    panels = [("all models (one step each)", "cost_per_step_usd", "iteration_time_s")] + \
        [(m, f"{m}.cost_per_step_usd", f"{m}.iteration_time_s") for m in models]
    fig = Figure(figsize=(5.2 * len(panels), 4.4))
    gpus = sorted({r["gpu"] for r in rows})
    colours = dict(zip(gpus, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")))
    for i, (title, x, y) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        ok = [r for r in rows if r.get(x) is not None and r.get(y) is not None]
        for g in gpus:
            pts = [(r[x], r[y]) for r in ok if r["gpu"] == g]
            if pts:
                ax.scatter(*zip(*pts), s=9, alpha=0.45, color=colours[g], label=g)
        front = pareto_front(ok, x, y)
        if front:
            ax.step([r[x] for r in front], [r[y] for r in front], where="post", color="black", lw=1.2,
                    label=f"Pareto front ({len(front)})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("cost per training step (USD, on-demand)")
        ax.set_ylabel("iteration time (s)")
        n_oom = len(rows) - len(ok)
        ax.set_title(f"{title}\n{len(ok)} fit, {n_oom} out of memory", fontsize=9)
        ax.grid(True, which="both", alpha=0.25)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--points", type=int, default=1000, help="distinct shapes (the grid has 1,200)")
    ap.add_argument("--models", default="bert-48,t5-3b")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="Ray worker CPUs (0: a plain loop, no Ray)")
    ap.add_argument("--chunk", type=int, default=10, help="points per Ray task")
    ap.add_argument("--space", default=None, help="space YAML (default: the package's)")
    ap.add_argument("--max-wall-s", type=float, default=6 * 3600.0, help="outer safety limit only")
    ap.add_argument("--out", default=str(RESULTS / "codesign_gpu.json"))
    ap.add_argument("--plot", default=None, help="PNG (default: --out with .png)")
    ap.add_argument("--track", default=TRACK, help="shapes to place against the fronts (comma list)")
    args = ap.parse_args()
    load = os.getloadavg()

    from archplace.hardware.cluster_prices import NETWORK_USD_PER_GBPS_HOUR, PRICE_TABLE, network_usd_per_hour
    from archplace.hardware.gpu_cluster_space import NETWORKS, load_space, sample_points, shape_from_config
    from archplace.platform.gpu_cluster_trial import pareto_front

    models = [m for m in args.models.split(",") if m]
    space = load_space(args.space)
    training = space["training"]
    configs = sample_points(space, args.points, seed=args.seed)
    track = [config_of_name(n, space) for n in args.track.split(",") if n]
    chunks = [configs[i:i + args.chunk] for i in range(0, len(configs), args.chunk)]
    print(f"{len(configs)} points x {len(models)} models ({', '.join(models)}), {len(chunks)} chunks, "
          f"workers {args.workers}", flush=True)
    rows: list[dict] = []
    stopped = None
    t0 = time.perf_counter()
    if args.workers == 0:
        for i, ch in enumerate(chunks):
            if time.perf_counter() - t0 > args.max_wall_s:
                stopped = f"--max-wall-s {args.max_wall_s} after {len(rows)} points"
                break
            rows += evaluate_chunk(ch, models, training)
            print(f"[{time.perf_counter() - t0:7.1f} s] chunk {i + 1}/{len(chunks)}", flush=True)
        ray_init_s = 0.0
    else:
        import ray

        ti = time.perf_counter()
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
        ray_init_s = time.perf_counter() - ti
        task = ray.remote(num_cpus=1, max_retries=0)(evaluate_chunk)
        pending = {task.remote(ch, models, training): i for i, ch in enumerate(chunks)}
        by_chunk: dict[int, list[dict]] = {}
        while pending:
            left = args.max_wall_s - (time.perf_counter() - t0)
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(left, 0.0))
            if not done:
                stopped = f"--max-wall-s {args.max_wall_s} with {len(pending)} chunks left"
                for ref in pending:
                    ray.cancel(ref, force=True)
                break
            i = pending.pop(done[0])
            by_chunk[i] = ray.get(done[0])
            print(f"[{time.perf_counter() - t0:7.1f} s] chunk {i + 1}/{len(chunks)} ({len(pending)} left)",
                  flush=True)
        ray.shutdown()
        rows = [r for i in sorted(by_chunk) for r in by_chunk[i]]   # the sampled order, whatever finished
    wall = time.perf_counter() - t0

    axes = {"all": ("cost_per_step_usd", "iteration_time_s"),
            **{m: (f"{m}.cost_per_step_usd", f"{m}.iteration_time_s") for m in models}}
    fronts = {k: pareto_front(rows, *xy) for k, xy in axes.items()}
    fit = [r for r in rows if r["memory_fit"]]
    best_time = min(fit, key=lambda r: (r["iteration_time_s"], r["cost_per_step_usd"]), default=None)
    best_cost = min(fit, key=lambda r: (r["cost_per_step_usd"], r["iteration_time_s"]), default=None)
    sens = {}
    for scale in NETWORK_PRICE_SCALES:
        rp = repriced(rows, models, scale)
        f = pareto_front(rp, *axes["all"])
        sens[f"{scale:g}"] = {"network_usd_per_gbps_hour": scale * NETWORK_USD_PER_GBPS_HOUR,
                              "front": [(r["shape"], r["price_per_hour_usd"], r["iteration_time_s"],
                                         r["cost_per_step_usd"]) for r in f]}
    by_name = {r["shape"]: r for r in rows}
    tracked = {}
    for c in track:
        name = shape_from_config(c).name
        sampled = name in by_name
        r = by_name[name] if sampled else evaluate_chunk([c], models, training)[0]
        tracked[name] = {"sampled": sampled, "price_per_hour_usd": r["price_per_hour_usd"],
                         "price_basis": r["price_basis"],
                         "inter_server_bytes_per_s": r["inter_server_bytes_per_s"],
                         **{k: where(r, rows, fronts[k], *axes[k]) for k in axes}}
    calls = sum(r[f"{m}.simulator_calls"] for r in rows for m in models)
    states = sum(r[f"{m}.dp_states"] for r in rows for m in models)
    out = {"bench": "codesign_gpu", **git_state(), "command": command(), "machine": machine(load),
           "code_version": code_version("archplace.algorithms.solvers", "archplace.simulators",
                                        "archplace.hardware", "archplace.platform.gpu_cluster_trial"),
           "settings": {"points": args.points, "models": models, "seed": args.seed, "workers": args.workers,
                        "chunk": args.chunk, "space_content": space,
                        "space": args.space or "archplace/tune_configs/gpu_cluster_space.yaml"},
           "prices": {g: {**vars(r), "usd_per_gpu_hour": r.usd_per_gpu_hour} for g, r in PRICE_TABLE.items()},
           "network_usd_per_gbps_hour": NETWORK_USD_PER_GBPS_HOUR,
           "networks": {n: {**vars(v), "usd_per_server_hour": network_usd_per_hour(n)}
                        for n, v in NETWORKS.items()},
           "points_done": len(rows), "stopped": stopped, "wall_s": wall, "ray_init_s": ray_init_s,
           "mean_point_wall_s": (sum(r["wall_s"] for r in rows) / len(rows)) if rows else None,
           "dp_states": int(states), "simulator_calls": int(calls),
           "memory_fit_points": len(fit),
           "proven_optimal_all": all(r[f"{m}.proven_optimal"] for r in rows for m in models),
           "best_time": front_summary([best_time], models, "cost_per_step_usd", "iteration_time_s")[0]
           if best_time else None,
           "best_cost": front_summary([best_cost], models, "cost_per_step_usd", "iteration_time_s")[0]
           if best_cost else None,
           "pareto_front": {k: front_summary(v, models, *axes[k]) for k, v in fronts.items()},
           "network_price_sensitivity": sens, "tracked": tracked,
           "points": compact(rows, models)}
    png = (Path(args.plot) if args.plot else Path(args.out).with_suffix(".png")).resolve()
    root = Path(__file__).resolve().parents[2]
    out["plot"] = str(png.relative_to(root)) if png.is_relative_to(root) else str(png)
    if not plot(png, rows, models):
        out["plot"] = None
        print("matplotlib is not installed: no plot", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str, allow_nan=False) + "\n")

    print(f"\n{len(rows)} points in {wall:.1f} s (ray.init {ray_init_s:.1f} s), {len(fit)} fit every model; "
          f"{calls} simulator calls, {states} DP states" + (f"; STOPPED: {stopped}" if stopped else ""))
    print(f"{'shape':38s} {'$/h':>8s} {'time/step s':>12s} {'$/step':>10s}")
    for r in fronts["all"]:
        print(f"{r['shape']:38s} {r['price_per_hour_usd']:8.2f} {r['iteration_time_s']:12.4f} "
              f"{r['cost_per_step_usd']:10.5f}")
    for k, v in sens.items():
        print(f"network price x{k}: front {[f[0] for f in v['front']]}")
    for k, v in tracked.items():
        print(f"tracked {k}: sampled {v['sampled']}, all models {v['all']}")
    print(f"wrote {args.out}" + (f" and {png}" if out["plot"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
