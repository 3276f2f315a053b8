"""``archplace search``: the architecture × placement co-search as a Ray Tune experiment.

The driver connects to Ray (embedded local instance, or ``--address`` to attach to a cluster),
starts the actor pools, runs one Tune trial per architecture with the chosen searcher, and streams
every finished trial into the result store (``evaluations.parquet``, ``best.json``). ``--resume``
reloads the store, feeds the finished evaluations to the searcher and only evaluates the rest.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from .store import ResultStore
from .trial import FAULT_ENV, METRIC, SearchSettings

SEARCHERS = ("phaze", "optuna", "random", "grid")


# ---------------------------------------------------------------------- validation
def validate(settings: SearchSettings, searcher: str, budget: int, workers: int | None) -> None:
    """Every input check that needs no Ray, with one-line errors naming the field."""
    from ..hardware.space import enumerate_space
    from ..workloads.models import PRESETS

    if not settings.models:
        raise ValueError("models: give at least one model")
    for m in settings.models:
        if m not in PRESETS:
            raise ValueError(f"model {m!r} unknown; allowed: {sorted(PRESETS)}")
    if len(set(settings.models)) != len(settings.models):
        raise ValueError(f"models: {list(settings.models)} lists a model twice")
    if searcher not in SEARCHERS:
        raise ValueError(f"--searcher {searcher!r} unknown; allowed: {list(SEARCHERS)}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"--budget must be a positive number of architectures, got {budget}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if settings.num_devices < 1:
        raise ValueError(f"--accelerators must be >= 1, got {settings.num_devices}")
    if settings.global_batch < 1:
        raise ValueError(f"--global-batch must be >= 1, got {settings.global_batch}")
    if not any(settings.global_batch % m == 0 for m in settings.microbatches):
        raise ValueError(f"--microbatches: none of {list(settings.microbatches)} divides the global batch "
                         f"{settings.global_batch}")
    if not settings.hbm_gb or any(h <= 0 for h in settings.hbm_gb):
        raise ValueError(f"--hbm: need positive sizes in GB, got {list(settings.hbm_gb)}")
    if not settings.ilp_time_limit_s > 0:
        raise ValueError(f"--ilp-time-limit must be > 0, got {settings.ilp_time_limit_s}")
    for m in settings.models:
        if not settings.widths(m):
            raise ValueError(f"model {m!r}: no TMP width fits in {settings.num_devices} accelerators")
    enumerate_space(settings.space_path)  # raises for a missing file or an empty space


def connect(address: str | None, num_cpus: int | None = None) -> None:
    """Start the embedded Ray, or attach to the cluster at ``address`` ("auto" or HOST:PORT).
    An unreachable address is a one-line ValueError, not a hang or a traceback."""
    import ray

    if address is not None and address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--address must be 'auto' or HOST:PORT, got {address!r}")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as e:
            raise ValueError(f"--address {address}: cannot reach a Ray cluster there ({e.strerror or e})"
                             ) from None
    if ray.is_initialized():
        return
    kw = {"log_to_driver": False, "configure_logging": True, "logging_level": "ERROR"}
    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, **kw)
        return
    try:
        ray.init(address=address, **kw)
    except (ConnectionError, RuntimeError, ValueError) as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--address {address}: could not attach to a Ray cluster: {msg} (a cluster with "
                         "token authentication needs RAY_AUTH_MODE=token and its token, see deploy/README.md)"
                         ) from None


# ---------------------------------------------------------------------- progress
class _Progress:
    def __init__(self, total: int, stream=None) -> None:
        self.total, self.done, self.failed = total, 0, 0
        self.t0 = time.monotonic()
        self.best = 0.0
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def update(self, value: float | None, failed: bool = False) -> None:
        self.done += 1
        self.failed += failed
        if value is not None:
            self.best = max(self.best, value)
        el = time.monotonic() - self.t0
        eta = el / self.done * (self.total - self.done)
        width = 24
        fill = int(width * self.done / max(self.total, 1))
        line = (f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} architectures  "
                f"elapsed {_hms(el)}  ETA {_hms(eta)}  best avg {self.best:,.1f} samples/s"
                + (f"  failed {self.failed}" if self.failed else ""))
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.done:
            self.stream.write("\n")
            self.stream.flush()


def _hms(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _store_callback(store: ResultStore, meta: dict[str, Any], progress: _Progress | None):
    """A Tune Callback (built lazily so this module imports without Ray) that records every
    finished trial, including those that failed after all their retries."""
    from ray.tune import Callback

    from ..algorithms.search import nearest_index
    from ..hardware.space import enumerate_space
    from .trial import SearchSettings, arch_columns

    settings = SearchSettings.from_dict(meta["settings"])

    class StoreCallback(Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            rows = json.loads(result["rows_json"])
            store.add(rows, meta["searcher"])
            store.write_best(meta)
            if progress:
                progress.update(result.get(METRIC))

        def on_trial_error(self, iteration, trials, trial, **info):
            space = enumerate_space(settings.space_path)
            idx = nearest_index(space, trial.config)
            acc = space.accelerator(idx)
            text = _error_text(trial).strip().splitlines()
            msg = next((ln for ln in reversed(text) if "Error" in ln or "error" in ln),
                       text[-1] if text else "evaluation failed")
            rows = [{**arch_columns(acc), "space_index": idx, "model": m, "status": "failed",
                     "error": msg.strip()[:500], "throughput": 0.0,
                     "trial_id": trial.trial_id, "finished_at": time.time()} for m in settings.models]
            store.add(rows, meta["searcher"])
            store.write_best(meta)
            if progress:
                progress.update(None, failed=True)

    return StoreCallback()


def _error_text(trial) -> str:
    """The trial's last error as text (Tune keeps it pickled and as a text file)."""
    for get in (lambda: trial.get_pickled_error(), lambda: Path(trial.error_file).read_text(),
                lambda: trial.get_error()):
        try:
            err = get()
        except Exception:
            continue
        if err is not None and str(err).strip():
            return str(err)
    return ""


# ---------------------------------------------------------------------- the search
def run_search(settings: SearchSettings, out_dir: str | Path, *, searcher: str = "phaze", budget: int = 16,
               address: str | None = None, resume: bool = False, workers: int | None = None, seed: int = 0,
               hysteresis: int = 6, area_bucket_mm2: float = 0.01, max_failures: int = 2,
               progress: bool = True, report: bool = True) -> dict[str, Any]:
    """Run (or resume) a search; returns ``best.json``'s content plus run statistics."""
    validate(settings, searcher, budget, workers)
    out = Path(out_dir).resolve()
    store = ResultStore(out)
    meta_new = {"settings": settings.to_dict(), "searcher": searcher, "seed": seed, "hysteresis": hysteresis,
                "area_bucket_mm2": area_bucket_mm2, "models": list(settings.models),
                "num_devices": settings.num_devices, "global_batch": settings.global_batch}
    meta_new = json.loads(json.dumps(meta_new))  # compare as stored: lists, not tuples
    if store.holds_search():
        if not resume:
            raise ValueError(f"--out {out} already holds a search; pass --resume to continue it or choose "
                             "another directory")
        old = store.read_meta() if store.settings_path.exists() else meta_new
        for k in ("settings", "searcher", "seed", "hysteresis", "area_bucket_mm2"):
            if old.get(k) != meta_new[k]:
                raise ValueError(f"--resume: the search in {out} was run with a different {k} "
                                 f"({old.get(k)!r}); resume with the same options")
        store.load()
    finished = store.finished()
    remaining = budget - len(finished)

    import ray
    from ray import tune

    from ..algorithms.search import make_searcher
    from ..hardware.space import enumerate_space
    from .pools import NAMESPACE, TRIAL_CPUS, Pools
    from .trial import search_trainable

    # our progress line replaces Tune's tables; failed trials are recorded with their error, so
    # Tune's own tracebacks stay in its logs (DIR/tune) rather than on the terminal
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    connect(address, num_cpus=None)
    if resume and store.settings_path.exists():
        old_meta = store.read_meta()
        if old_meta.get("actor_prefix"):  # a killed driver leaves its detached actors behind
            Pools(old_meta["actor_prefix"], 0, 0).stop(max_index=int(old_meta.get("workers", 64)))
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    # one worker = one trial + one solver + one simulator (0.8 CPU): more workers than CPUs would
    # leave actors unschedulable, so the pool is capped at the cluster's CPUs
    W = max(1, min(workers or cpus, cpus, max(remaining, 1)))
    pools = Pools(f"search-{uuid.uuid4().hex[:8]}", num_solvers=W, num_simulators=W)
    meta = {**meta_new, "actor_prefix": pools.prefix, "namespace": NAMESPACE, "workers": W,
            "budget": budget, "started_at": time.time()}
    store.write_meta(meta)
    t0 = time.perf_counter()
    stats: dict[str, Any] = {"resumed": len(finished), "new_trials": 0, "workers": W}
    if remaining > 0:
        space = enumerate_space(settings.space_path)
        alg = make_searcher(searcher, settings.space_path, seed=seed, hysteresis=hysteresis,
                            area_bucket_mm2=area_bucket_mm2, max_concurrent=W)
        for e in finished.values():
            cfg = ({"arch": e["space_index"]} if searcher != "optuna" else
                   {f: _py(getattr(space, f)[e["space_index"]]) for f in
                    ("num_tc", "num_vc", "pe_x", "pe_y", "glb_mb")})
            alg.add_evaluated_point(cfg, e["value"], error=e["failed"])
        pools.start()
        prog = _Progress(remaining) if progress else None
        trainable = tune.with_resources(
            tune.with_parameters(search_trainable, settings_dict=settings.to_dict(), pools=pools,
                                 out_dir=str(out), faults=os.environ.get(FAULT_ENV, "")),
            # SPREAD: on a cluster, successive trials go to the least-loaded node
            tune.PlacementGroupFactory([{"CPU": TRIAL_CPUS}], strategy="SPREAD"))
        tuner = tune.Tuner(
            trainable, param_space={"searcher": searcher},  # non-empty, so Tune passes metric/mode on
            tune_config=tune.TuneConfig(search_alg=alg, metric=METRIC, mode="max", num_samples=remaining,
                                        max_concurrent_trials=W, reuse_actors=True),
            run_config=tune.RunConfig(name=f"trials-{pools.prefix}", storage_path=str(out / "tune"),
                                      verbose=0, callbacks=[_store_callback(store, meta, prog)],
                                      failure_config=tune.FailureConfig(max_failures=max_failures)))
        try:
            grid = tuner.fit()
            stats["new_trials"] = len(grid)
            stats["cache"] = pools.cache_stats()
        finally:
            if prog:
                prog.close()
            pools.stop()
    stats["wall_s"] = time.perf_counter() - t0
    best = store.write_best(meta)
    if report and store.rows:
        from .report import write_report

        write_report(out)
    return {**best, "out_dir": str(out), "stats": stats}


def _py(v: Any) -> Any:
    f = float(v)
    return int(f) if f.is_integer() else f
