"""``archplace tune-rl mcm|pipeline``: Ray Tune sweeps of the RL placers' hyperparameters.

Each trial is the placer's own RLlib ``Algorithm`` (PPO or DQN, built by ``ppo_config`` /
``dqn_config`` exactly as the placer builds it) run by Tune, which gets a result every training
iteration, so ASHA can stop poor trials early and PBT can exploit and explore. The metric is the mean
episode return, i.e. the placer's reward (MCM: throughput over the greedy heuristic's; pipeline:
L_unit / L), maximised. Results: ``OUT/trials.parquet`` (one row per trial: its config, the
iterations it ran, whether the scheduler stopped it early, its last and best metric), ``OUT/report.md``
and ``OUT/best_config.yaml``, the best trial's keys in the placer's YAML shape (``ppo:`` or ``dqn:``),
which ``archplace partition|pipeline --config FILE`` reads.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

PLACERS = ("mcm", "pipeline")
SCHEDULERS = ("asha", "pbt", "fifo")
METRIC = "env_runners/episode_return_mean"


def load_sweep(placer: str) -> dict[str, Any]:
    cfg = yaml.safe_load(resources.files("archplace.tune_configs").joinpath("rl_tune.yaml").read_text())
    return cfg[placer]


def _domain(spec: Any, key: str):
    from ray import tune

    if isinstance(spec, dict) and len(spec) == 1:
        ((kind, arg),) = spec.items()
        if kind == "loguniform":
            return tune.loguniform(float(arg[0]), float(arg[1]))
        if kind == "uniform":
            return tune.uniform(float(arg[0]), float(arg[1]))
        if kind == "choice":
            return tune.choice(list(arg))
    raise ValueError(
        f"space.{key} must be {{loguniform|uniform: [lo, hi]}} or {{choice: [...]}}, got {spec!r}"
    )


def _config(placer: str, case: dict[str, Any], seed: int):
    """The placer's AlgorithmConfig on its sweep case."""
    if placer == "pipeline":
        from ..algorithms.rl.pipeline_dqn import dqn_config
        from ..algorithms.rl.pipeline_plan import cluster_of, model_profile
        from ..algorithms.solvers.pipeline_exact import candidate_pivots

        prof, cl = model_profile(case["model"]), cluster_of(case.get("cluster", "B"))
        k = int(case.get("stages") or cl.num_servers)
        env = {
            "profile": prof,
            "cluster": cl,
            "num_stages": k,
            "radius": 3,
            "candidates": candidate_pivots(prof, cl, k, 3),
        }
        return dqn_config(env, seed=seed)
    from ..algorithms.rl.mcm_ppo import ppo_config
    from ..hardware.presets import mcm_package
    from ..simulators.mcm import MCMProblem
    from ..workloads.models import build_graph

    g = build_graph(case["model"], seq=case.get("seq"), mbs=1, training=False, bytes_per_element=1)
    p = MCMProblem.from_graph(g, mcm_package(int(case.get("chiplets", 36))))
    return ppo_config(
        [p], num_chips=p.num_chips, seed=seed, n_max=max(p.num_nodes, 1), e_max=max(p.num_edges, 1)
    )


def tune_rl(
    placer: str,
    *,
    scheduler: str = "asha",
    samples: int = 8,
    iterations: int | None = None,
    out: str | Path = "runs/tune-rl",
    seed: int = 0,
    case: dict[str, Any] | None = None,
    max_concurrent: int | None = None,
) -> dict[str, Any]:
    """Run the sweep; returns a summary (also written to ``out``). Ray must be connected."""
    import pandas as pd
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.search import BasicVariantGenerator

    if placer not in PLACERS:
        raise ValueError(f"placer {placer!r} unknown; allowed: {list(PLACERS)}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"--scheduler {scheduler!r} unknown; allowed: {list(SCHEDULERS)}")
    if samples < 1:
        raise ValueError(f"--samples must be >= 1, got {samples}")
    if not ray.is_initialized():
        raise RuntimeError("tune-rl runs on Ray: call archplace.platform.search.connect() first")
    sweep = load_sweep(placer)
    case = {**sweep["case"], **(case or {})}
    iterations = int(iterations or sweep["iterations"])
    if iterations < 2:
        raise ValueError(
            f"--iterations must be >= 2 (a scheduler needs a result to act on), got {iterations}"
        )
    space = {k: _domain(v, k) for k, v in sweep["space"].items()}
    config = _config(placer, case, seed)
    param_space = config.to_dict()
    param_space.update(space)
    if scheduler == "asha":
        sched = ASHAScheduler(
            time_attr="training_iteration",
            max_t=iterations,
            grace_period=max(1, iterations // 6),
            reduction_factor=2,
        )
    elif scheduler == "pbt":
        sched = PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=max(1, iterations // 4),
            hyperparam_mutations=space,
            seed=seed,
        )
    else:
        sched = FIFOScheduler()
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tuner = tune.Tuner(
        config.algo_class,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode="max",
            scheduler=sched,
            num_samples=samples,
            # seeded draws, so a sweep (and its test) is reproducible. The limit goes to the generator
            # itself: Tune ignores ``max_concurrent_trials`` (with only a log warning) when it is given
            # a SearchGenerator such as BasicVariantGenerator, and ASHA's rung decisions then depend on
            # which of the concurrent trials reports first
            search_alg=BasicVariantGenerator(random_state=seed, max_concurrent=max_concurrent or 0),
        ),
        run_config=tune.RunConfig(
            name="trials", storage_path=str(out / "tune"), verbose=0, stop={"training_iteration": iterations}
        ),
    )
    grid = tuner.fit()
    rows = []
    for r in grid:
        df = r.metrics_dataframe
        hist = df[METRIC].dropna() if df is not None and METRIC in df else pd.Series(dtype=float)
        its = int(r.metrics.get("training_iteration", 0) or 0)
        rows.append(
            {
                "trial_id": r.metrics.get("trial_id"),
                **{k: r.config.get(k) for k in space},
                "iterations": its,
                "stopped_early": its < iterations,
                "last": float(hist.iloc[-1]) if len(hist) else float("nan"),
                "best": float(hist.max()) if len(hist) else float("nan"),
                "error": str(r.error).splitlines()[0][:300] if r.error else "",
            }
        )
    # ties (seeded trials whose configs differ only where it has not mattered yet) go to the first trial
    table = pd.DataFrame(rows).sort_values(
        ["last", "trial_id"], ascending=[False, True], na_position="last", kind="stable"
    )
    table.to_parquet(out / "trials.parquet", index=False)
    ok = table[table["error"] == ""]
    if ok.empty:
        raise RuntimeError(f"every trial failed; first error: {table['error'].iloc[0]}")
    # the best of the trials that ran longest (a trial ASHA stopped at iteration 1 is not comparable)
    best = ok[ok["iterations"] == ok["iterations"].max()].iloc[0]
    section = "dqn" if placer == "pipeline" else "ppo"
    best_cfg = {section: {k: _plain(best[k]) for k in space}}
    (out / "best_config.yaml").write_text(
        f"# archplace tune-rl {placer} --scheduler {scheduler} --samples {samples}: best of {len(table)} "
        f"trials on {case} by {METRIC} at the last iteration ({best['last']:.4f})\n"
        + yaml.safe_dump(best_cfg)
    )
    summary = {
        "placer": placer,
        "scheduler": scheduler,
        "samples": samples,
        "iterations": iterations,
        "case": case,
        "metric": METRIC,
        "trials": len(table),
        "stopped_early": int(table["stopped_early"].sum()),
        "best_config": best_cfg,
        "best_last": float(best["last"]),
        "out": str(out),
        "wall_s": time.perf_counter() - t0,
    }
    (out / "report.md").write_text(_report(summary, table))
    return summary


def _plain(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    return float(v) if isinstance(v, float) else v


def _report(summary: dict[str, Any], table) -> str:
    lines = [
        f"# tune-rl {summary['placer']} ({summary['scheduler']})",
        "",
        f"{summary['trials']} trials on {summary['case']}, up to {summary['iterations']} iterations each; "
        f"{summary['stopped_early']} stopped early by the scheduler. Metric: `{summary['metric']}` "
        "(the placer's reward), maximised.",
        "",
        "Best config (`best_config.yaml`):",
        "",
        "```yaml",
        yaml.safe_dump(summary["best_config"]).strip(),
        "```",
        "",
        "```",
        table.to_string(index=False),
        "```",
    ]
    return "\n".join(lines) + "\n"
