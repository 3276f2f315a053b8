"""``archplace search``: the architecture × placement co-search as a Ray Tune experiment.

The driver checks its input and files, locks ``--out``, connects to Ray (its own instance on
127.0.0.1, never a cluster it was not given, or ``--address`` to attach to one), waits for a CPU,
traces the model graphs once (Ray tasks whose results the trials share), and runs Tune trials of
one or more architectures with the chosen searcher behind an in-flight limit that follows the
cluster (``limiter.py``). Every reported architecture streams into
the append-only result store and every solved slice into the schedule cache file; at the end the
store is compacted into ``evaluations.parquet``. ``--resume`` reloads the store, feeds the finished
evaluations to the searcher and only evaluates the rest (``--retry-failed``: the failed ones too).
Everything Ray runs for the search is owned by this driver, so nothing outlives it. Ctrl-C stops
the trials in flight, keeps what finished and raises ``SearchInterrupted``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from . import ray_connect
from .lock import OutDirLock
from .progress import _hms, _Progress, _status, run_start, set_run_start  # noqa: F401  (re-exported)
from .ray_connect import _loopback_only, check_address, connect  # noqa: F401  (re-exported)
from .schedule_cache import ScheduleCacheFile
from .settings import SearchSettings
from .store import ResultStore

# trial.SCHEDULES; trial (the Tune trainable) imports Ray and the solvers, seconds that an input error
# should not wait for, so it is imported where the search runs
SCHEDULES = ("ilp", "sequential")

# A trial only submits tasks and waits, so it reserves memory (its process) and no CPU: the tasks take
# whole CPUs, and even 0.01 CPU per trial would leave a node 0.99 CPU short of its last task (on a
# 1-CPU cluster, of every task). Tune needs a non-empty bundle, hence memory rather than nothing.
TRIAL_RESOURCES = {"memory": 256 * 2**20}

SEARCHERS = ("phaze", "optuna", "random", "grid", "screen")   # screen: platform/screen.py


# ---------------------------------------------------------------------- validation
def validate(settings: SearchSettings, searcher: str, budget: int, workers: int | None,
             archs_per_trial: int = 1) -> None:
    """Every input check that needs no Ray, with one-line errors naming the field: first those that
    need no model (names, numbers, the space), then those that read one (an ``hf:`` config imports
    transformers and builds the model on the meta device: seconds), so that a wrong flag is said at
    once."""
    from ..hardware.space import enumerate_space
    from ..workloads.byom import is_hf_ref
    from ..workloads.models import PRESETS, preset

    if not settings.models:
        raise ValueError("models: give at least one model")
    for m in settings.models:
        if not is_hf_ref(m) and m not in PRESETS:
            raise ValueError(f"model {m!r} unknown; allowed: {sorted(PRESETS)}, or a transformers config "
                             "(--hf-config)")
    if len(set(settings.models)) != len(settings.models):
        raise ValueError(f"models: {list(settings.models)} lists a model twice")
    if searcher not in SEARCHERS:
        raise ValueError(f"--searcher {searcher!r} unknown; allowed: {list(SEARCHERS)}")
    if not isinstance(budget, int) or budget < 1:
        raise ValueError(f"--budget must be a positive number of architectures, got {budget}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if not isinstance(archs_per_trial, int) or archs_per_trial < 1:
        raise ValueError(f"--archs-per-trial must be >= 1, got {archs_per_trial}")
    if archs_per_trial > 1 and searcher == "optuna":
        raise ValueError("--archs-per-trial: the optuna searcher suggests one architecture per trial; "
                         "use phaze, random or grid for batched trials")
    if settings.schedule not in SCHEDULES:
        raise ValueError(f"--schedule {settings.schedule!r} unknown; allowed: {list(SCHEDULES)}")
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
    if not settings.ilp_budget > 0:
        raise ValueError(f"--ilp-budget must be > 0 deterministic seconds, got {settings.ilp_budget}")
    enumerate_space(settings.space)  # raises for an empty space
    for m in settings.models:
        _check_widths(m, settings.tmp_widths.get(m, ()))   # powers of two first, then the heads
        preset(m)  # an hf: config is read and checked here, before Ray starts
        if not settings.widths(m):
            raise ValueError(f"model {m!r}: no TMP width fits in {settings.num_devices} accelerators")


def _check_widths(model: str, widths: tuple[int, ...]) -> None:
    """``--tmp-widths`` against the model's attention heads, here rather than in the Ray task that
    slices the graph (which failed after Ray's start-up with a task traceback, issue 29). The model's
    own widths need no check: its preset lists widths that slice."""
    if not widths:
        return
    from ..workloads.hf_config import attention_heads
    from ..workloads.models import preset
    from ..workloads.transforms import check_head_widths

    for t in widths:
        if t < 1 or t & (t - 1):
            raise ValueError(f"--tmp-widths: {t} is not a power of two; allowed: 1, 2, 4, 8, ...")
    heads = attention_heads(preset(model).make_config())
    for t in widths:
        try:
            check_head_widths({"model": model, "heads": heads}, t)
        except ValueError as e:
            raise ValueError(f"--tmp-widths: {e}") from None


def check_paths(out: Path, schedule_cache: str | Path | None) -> None:
    """``--out`` must be (or become) a directory and ``--schedule-cache`` a file: one-line errors
    naming the flag, before the lock, the store or Ray touch either (issue 29: an ``OSError`` that
    named neither flag, and for the cache only after Ray had started)."""
    def first_existing(p: Path) -> Path:
        while not p.exists() and p != p.parent:
            p = p.parent
        return p

    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory; choose a directory")
    up = first_existing(out)
    if not up.is_dir():
        raise ValueError(f"--out {out}: {up} is a file, not a directory; choose another path")
    if schedule_cache is not None:
        c = Path(schedule_cache)
        if c.is_dir():
            raise ValueError(f"--schedule-cache {c} is a directory; give a file (JSON lines), e.g. "
                             f"{c / 'schedule_cache.jsonl'}")
        up = first_existing(c.parent)
        if not up.is_dir():
            raise ValueError(f"--schedule-cache {c}: {up} is a file, not a directory")


# Tune pickles its stopper and callbacks with the experiment state, and a caller's Event or progress
# function need not pickle: they hold a key into this registry of the driver process instead.
_DRIVER_OBJECTS: dict[str, Any] = {}


def _driver_key(obj: Any) -> str | None:
    if obj is None:
        return None
    key = f"{os.getpid()}-{id(obj)}"
    _DRIVER_OBJECTS[key] = obj
    return key


def _driver_object(key: str | None) -> Any:
    from archplace.platform import search  # through the module, so a pickled method captures nothing

    return search._DRIVER_OBJECTS.get(key) if key else None


def _cancel_stopper(cancel: threading.Event | None):
    from ray.tune import Stopper

    class CancelStopper(Stopper):
        """Ends the experiment once ``cancel`` is set (Tune lets trials in flight finish)."""

        def __init__(self, key: str | None) -> None:
            self.key = key

        def __call__(self, trial_id, result) -> bool:
            return False

        def stop_all(self) -> bool:
            from archplace.platform.search import _driver_object

            ev = _driver_object(self.key)
            return ev is not None and ev.is_set()

    return CancelStopper(_driver_key(cancel))


class _Either:
    """Set when either event is (the caller's ``cancel``, or Ctrl-C)."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class SearchInterrupted(KeyboardInterrupt):
    """Ctrl-C (or, from the command line, SIGTERM) stopped the search: the trials in flight were
    stopped, every architecture that finished is stored, and ``--resume`` continues."""

    hint = "resume with --resume"   # the command line's stop line ends with it


@contextlib.contextmanager
def _sigint_stops(event: threading.Event):
    """While Tune runs, the first Ctrl-C (SIGINT; from the command line SIGTERM too) sets ``event``:
    the stopper ends the experiment, the store is closed with every finished row, and ``run_search``
    raises ``SearchInterrupted``; a second one raises ``KeyboardInterrupt`` at once. Tune's own
    handler is kept out: it ended the run as if it had finished, so ``archplace search`` exited 0 with
    a normal summary (issue 29). A stop that came before (and that a library swallowed) stops it at
    once. Only the main thread may set signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if event.is_set():
            raise KeyboardInterrupt
        ray_connect.note_stop(signum, handled=True)   # the command's exit status names it
        event.set()

    if ray_connect.stop_signal() is not None:
        ray_connect.note_stop(ray_connect.stop_signal(), handled=True)
        event.set()
    # SIGTERM only in the command line's process (its stop handlers): a Python caller's is its own
    sigs = ray_connect.STOP_SIGNALS if ray_connect.stop_handlers_installed() else (signal.SIGINT,)
    old = {sig: signal.signal(sig, handler) for sig in sigs}
    old_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        if old_env is None:
            os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
        else:
            os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = old_env


@contextlib.contextmanager
def _env(**values: str):
    """Environment variables set for the block and restored after it (Tune reads some of its
    switches from the environment when a run starts)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _StoreSink:
    """What the Tune callback does, in the driver: every reported architecture into the result store,
    newly solved slices into the schedule cache, and the architectures a failed trial left
    unevaluated (once the searcher has given up on them) as failed rows."""

    def __init__(self, store: ResultStore, meta: dict[str, Any], progress: _Progress | None, searcher,
                 cache_file: ScheduleCacheFile, space, on_evaluated: Callable[[dict[str, Any]], None] | None):
        self.store, self.meta, self.progress, self.searcher = store, meta, progress, searcher
        self.cache_file, self.space, self.hook = cache_file, space, on_evaluated
        self.settings = SearchSettings.from_dict(meta["settings"])
        self.counts = {"lookups": 0, "unique": 0, "cache_hits": 0, "solved": 0, "trial_errors": 0}

    def result(self, result: dict[str, Any]) -> None:
        # the rows and slices leave the result here (Tune lets a callback change it in place), so
        # Tune's experiment state keeps only the metric and the small fields (issue 29)
        rows_json = result.pop("rows_json", None) or "[]"
        solved_json = result.pop("solved_json", None) or "{}"
        by_arch: dict[str, list[dict[str, Any]]] = {}
        c = self.counts
        for r in json.loads(rows_json):
            by_arch.setdefault(r["arch_key"], []).append(r)
            c["lookups"] += int(r.get("ilp_lookups", 0))
            c["unique"] += int(r.get("ilp_unique", 0))
            c["cache_hits"] += int(r.get("cache_hits", 0))
            c["solved"] += int(r.get("ilp_solved", 0))
        values = []
        for rows in by_arch.values():
            self.store.add(rows, self.meta["searcher"])
            value = float(np.mean([r["throughput"] for r in rows]))
            values.append(value)
            if self.hook is not None:
                self.hook({"space_index": rows[0].get("space_index"), "arch_key": rows[0]["arch_key"],
                           "arch_label": rows[0].get("arch_label"), "throughput_avg": value,
                           "status": "ok" if all(r.get("status") == "ok" for r in rows) else "infeasible"})
        if self.progress and values:
            self.progress.update_many(values)
        self.cache_file.append(json.loads(solved_json))
        if by_arch:
            self.store.write_best(self.meta)

    def error(self, trial) -> None:
        from ..algorithms.search import nearest_index
        from .evaluate import arch_columns

        self.counts["trial_errors"] += 1
        final = getattr(self.searcher, "final_failures", None)
        if final is not None:
            indices = final.pop(trial.trial_id, [])
        else:   # optuna: one architecture per trial, retried by Tune itself
            indices = [nearest_index(self.space, trial.config)]
        text = _error_text(trial).strip().splitlines()
        msg = next((ln for ln in reversed(text) if "Error" in ln or "error" in ln),
                   text[-1] if text else "evaluation failed")
        for idx in indices:
            acc = self.space.accelerator(idx)
            rows = [{**arch_columns(acc), "space_index": idx, "model": m, "status": "failed",
                     "error": msg.strip()[:500], "throughput": 0.0, "schedule": self.settings.schedule,
                     "trial_id": trial.trial_id, "finished_at": time.time()} for m in self.settings.models]
            self.store.add(rows, self.meta["searcher"])
            if self.progress:
                self.progress.update(None, failed=True)
            if self.hook is not None:
                self.hook({"space_index": idx, "arch_key": rows[0]["arch_key"],
                           "arch_label": rows[0]["arch_label"], "throughput_avg": None, "status": "failed",
                           "error": rows[0]["error"]})
        self.store.write_best(self.meta)


def _store_callback(sink: _StoreSink):
    """The Tune Callback (built lazily so this module imports without Ray) that hands results and
    errors to ``sink``. It holds only the sink's registry key: Tune pickles its callbacks into
    ``tuner.pkl``, and a callback holding the store pickled every resumed row there (issue 29)."""
    from ray.tune import Callback

    class StoreCallback(Callback):
        def __init__(self, key: str | None) -> None:
            self.key = key

        def on_trial_result(self, iteration, trials, trial, result, **info):
            from archplace.platform.search import _driver_object

            _driver_object(self.key).result(result)

        def on_trial_error(self, iteration, trials, trial, **info):
            from archplace.platform.search import _driver_object

            _driver_object(self.key).error(trial)

    return StoreCallback(_driver_key(sink))


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
               address: str | None = None, resume: bool = False, retry_failed: bool = False,
               workers: int | None = None, seed: int = 0, hysteresis: int = 6, area_bucket_mm2: float = 0.01,
               max_failures: int = 2, archs_per_trial: int = 1, schedule_cache: str | Path | None = None,
               wait_timeout_s: float = 600.0, task_timeout_s: float = 1800.0, progress: bool = True,
               report: bool = True, on_evaluated: Callable[[dict[str, Any]], None] | None = None,
               cancel: threading.Event | None = None) -> dict[str, Any]:
    """Run (or resume) a search; returns ``best.json``'s content plus run statistics.

    One driver per ``out_dir`` (a lock; a second one gets a ValueError). ``retry_failed`` (with
    ``resume``) evaluates the architectures recorded as failed again, before anything new.
    ``wait_timeout_s`` bounds the wait for the cluster's first CPU and the model graphs;
    ``task_timeout_s`` any one wait of a trial on its tasks. ``on_evaluated(info)`` is called for
    every finished architecture (its index, label, status and across-model throughput);
    ``cancel.set()`` stops the search after the trials in flight (what finished is kept, and a
    ``--resume`` continues it); the result's ``stats.cancelled`` says so.
    """
    started = run_start()
    validate(settings, searcher, budget, workers, archs_per_trial)
    if searcher == "screen":   # two phases of plain Ray tasks, not a Tune experiment (api.search routes it)
        raise ValueError("searcher 'screen' runs through archplace.platform.screen.run_screen")
    if retry_failed and not resume:
        raise ValueError("--retry-failed re-runs the failed architectures of an earlier search: "
                         "pass --resume too")
    out = Path(out_dir).resolve()
    check_paths(out, schedule_cache)
    check_address(address)   # an unreachable cluster is an error before --out is created
    created = not out.exists()
    lock = OutDirLock(out).acquire()
    store = ResultStore(out)
    fresh = not store.holds_search()
    try:
        return _run_locked(settings, store, searcher=searcher, budget=budget, address=address, resume=resume,
                           retry_failed=retry_failed, workers=workers, seed=seed, hysteresis=hysteresis,
                           area_bucket_mm2=area_bucket_mm2, max_failures=max_failures,
                           archs_per_trial=archs_per_trial, schedule_cache=schedule_cache,
                           wait_timeout_s=wait_timeout_s, task_timeout_s=task_timeout_s, progress=progress,
                           report=report, on_evaluated=on_evaluated, cancel=cancel, started=started)
    except BaseException as e:
        # a new search that stored nothing (bad input found late, Ray failing, Ctrl-C while starting)
        # leaves no search.json behind: it made the corrected command fail with "already holds a
        # search" (issue 29)
        if fresh:
            store.discard_if_empty()
            if created and not len(store):
                lock.release()
                remove_created(out, schedule_cache)
        if isinstance(e, KeyboardInterrupt):
            # stopped: a search that keeps rows says so (--resume continues it), whenever the stop came;
            # one that stored none was removed above, and there is nothing to resume
            if store.holds_search() and not isinstance(e, SearchInterrupted):
                raise SearchInterrupted(f"interrupted with {len(store)} rows stored; resume with --resume"
                                        ) from None
            if not store.holds_search() and isinstance(e, SearchInterrupted):
                raise KeyboardInterrupt("interrupted before any row was stored") from None
        raise
    finally:
        lock.release()


def remove_created(out: Path, schedule_cache: str | Path | None = None) -> None:
    """A failed start leaves no --out behind: the folder this run created, and only what the run
    itself puts there (the lock, Tune's experiment folder, an empty schedule cache, the store's
    empty files), is removed; anything else found in it keeps it."""
    import shutil

    ours = {".lock", "tune", "schedule_cache.jsonl", "search.json", "best.json", "evaluations.parquet",
            "plots", "report.md"}
    try:
        names = {p.name for p in out.iterdir()}
    except OSError:
        return
    cache = out / "schedule_cache.jsonl"
    if schedule_cache is None and cache.exists() and cache.stat().st_size:
        return   # slices were solved: worth keeping for the next try
    if names - ours - {n for n in names if n.startswith(("evaluations", "."))}:
        return
    shutil.rmtree(out, ignore_errors=True)


def _run_locked(settings: SearchSettings, store: ResultStore, *, searcher: str, budget: int,
                address: str | None, resume: bool, retry_failed: bool, workers: int | None, seed: int,
                hysteresis: int, area_bucket_mm2: float, max_failures: int, archs_per_trial: int,
                schedule_cache: str | Path | None, wait_timeout_s: float, task_timeout_s: float,
                progress: bool, report: bool, on_evaluated: Callable[[dict[str, Any]], None] | None = None,
                cancel: threading.Event | None = None, started: float | None = None) -> dict[str, Any]:
    out = store.dir
    started = time.time() if started is None else started
    meta_new = {"settings": settings.to_dict(), "searcher": searcher, "seed": seed, "hysteresis": hysteresis,
                "area_bucket_mm2": area_bucket_mm2, "models": list(settings.models),
                "num_devices": settings.num_devices, "global_batch": settings.global_batch}
    meta_new = json.loads(json.dumps(meta_new))  # compare as stored: lists, not tuples
    if store.holds_search():
        if not resume:
            raise ValueError(f"--out {out} already holds a search; pass --resume to continue it or choose "
                             "another directory")
        old = store.read_meta() if store.settings_path.exists() else meta_new
        if isinstance(old.get("settings"), dict):  # fields added since (at their defaults) match
            try:
                normal = SearchSettings.from_dict(old["settings"]).to_dict()
                old = dict(old, settings=json.loads(json.dumps(normal)))
            except (KeyError, TypeError, ValueError):
                pass  # settings this version cannot read: they differ, said below
        for k in ("settings", "searcher", "seed", "hysteresis", "area_bucket_mm2"):
            if old.get(k) != meta_new[k]:
                raise ValueError(f"--resume: the search in {out} was run with a different {k} "
                                 f"({old.get(k)!r}); resume with the same options")
        store.load()
        if store.parts_on_disk():
            store.compact()   # a resume starts from one file, whatever the killed driver left
    finished = store.finished()
    retry = sorted(e["space_index"] for e in finished.values() if e["failed"]) if retry_failed else []
    kept = {k: e for k, e in finished.items() if not (retry_failed and e["failed"])}
    remaining = budget - len(kept)

    cache_file = ScheduleCacheFile(schedule_cache or out / "schedule_cache.jsonl")
    # read before Ray starts, so an unreadable file is an error before any start-up cost
    cache = cache_file.load() if settings.schedule == "ilp" and remaining > 0 else {}
    if remaining > 0:   # a resume with nothing left to do needs no Ray
        connect(address, num_cpus=None)   # names the phase before Ray's own import (seconds)

    import ray
    from ray import tune

    from ..algorithms.search import make_searcher
    from ..hardware.space import enumerate_space
    from .limiter import AdaptiveLimiter, pruning_cap
    from .tasks import build_graph_task, get, wait_for_cpus
    from .trial import FAULT_ENV, METRIC, search_trainable

    # our progress line replaces Tune's tables; failed trials are recorded with their error, so
    # Tune's own tracebacks stay in its logs (DIR/tune) rather than on the terminal
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)
    meta = {**meta_new, "budget": budget, "started_at": started, "archs_per_trial": archs_per_trial}
    store.write_meta(meta)
    stats: dict[str, Any] = {"resumed": len(kept), "retried": len(retry), "new_trials": 0}
    if remaining > 0:
        if ray.is_initialized() and float(ray.cluster_resources().get("CPU", 0.0)) < 1:
            _status.info(f"waiting for the cluster's first CPU (at most --wait-timeout {wait_timeout_s:g} s)")
        wait_for_cpus(wait_timeout_s)
        space = enumerate_space(settings.space)
        stats["cache_loaded"] = len(cache)
        if cache_file.note:
            stats["cache_note"] = cache_file.note
        # every graph traced once per search, shared by all trials through the object store
        keys = settings.graph_keys()
        names = sorted({_model_label(k[0]) for k in keys})
        _status.info(f"capturing the graphs of {', '.join(names)} ({len(keys)} graph(s): a cached one is "
                     "read in seconds, a first capture takes a minute or more)")
        graphs = {k: build_graph_task.remote(k[0], settings.seq, k[1], k[2], settings.capture_blocks)
                  for k in keys}
        get(list(graphs.values()), f"building {len(graphs)} model graph(s)", wait_timeout_s)
        alg = make_searcher(searcher, settings.space, seed=seed, hysteresis=hysteresis,
                            area_bucket_mm2=area_bucket_mm2, archs_per_trial=archs_per_trial,
                            max_retries=max_failures, retry_first=retry,
                            budget=None if searcher == "optuna" else remaining - len(retry))
        for e in kept.values():
            cfg = ({"arch": e["space_index"]} if searcher != "optuna" else
                   {f: _py(getattr(space, f)[e["space_index"]]) for f in
                    ("num_tc", "num_vc", "pe_x", "pe_y", "glb_mb")})
            alg.add_evaluated_point(cfg, e["value"], error=e["failed"])
        trials_needed = -(-remaining // archs_per_trial)
        prune = pruning_cap(searcher, budget, hysteresis, archs_per_trial)

        def capacity() -> int:
            cpus = int(ray.cluster_resources().get("CPU", 1))
            return max(1, min(workers or cpus, cpus, prune or cpus, trials_needed))

        interrupted = threading.Event()   # Ctrl-C: set by _sigint_stops, read by the stopper
        stop_when = _Either(cancel, interrupted)
        limiter = AdaptiveLimiter(alg, capacity)
        evaluating = (f"evaluating {remaining} architecture(s)"
                      + (f", {archs_per_trial} per trial" if archs_per_trial > 1 else "")
                      + f", up to {capacity()} trial(s) in flight")
        prog = _Progress(remaining, start=started, phase=evaluating) if progress else None
        if prog is None:
            _status.info(evaluating)
        sink = _StoreSink(store, meta, prog, alg, cache_file, space, on_evaluated)
        callback = _store_callback(sink)
        trainable = tune.with_resources(
            tune.with_parameters(search_trainable, settings_dict=settings.to_dict(), graphs=graphs,
                                 cache=cache,
                                 out_dir=str(out), faults=os.environ.get(FAULT_ENV, ""),
                                 timeout_s=task_timeout_s),
            # SPREAD: on a cluster, successive trials go to the least-loaded node
            tune.PlacementGroupFactory([TRIAL_RESOURCES], strategy="SPREAD"))
        tuner = tune.Tuner(
            trainable, param_space={"searcher": searcher},  # non-empty, so Tune passes metric/mode on
            tune_config=tune.TuneConfig(search_alg=limiter, metric=METRIC, mode="max",
                                        num_samples=remaining if searcher == "optuna" else -1,
                                        reuse_actors=True),
            run_config=tune.RunConfig(name=f"trials-{int(time.time())}", storage_path=str(out / "tune"),
                                      verbose=0, callbacks=[callback],
                                      stop=_cancel_stopper(stop_when),
                                      # index searchers retry per architecture themselves
                                      failure_config=tune.FailureConfig(
                                          max_failures=max_failures if searcher == "optuna" else 0)))
        try:
            # the result store is the search's record: Tune's per-trial result.json / progress.csv /
            # TensorBoard files only repeated it (OUT/tune was about 150x evaluations.parquet, issue
            # 29). Only while this search runs: tune-rl in the same process reads progress.csv
            with _sigint_stops(interrupted), _env(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1"):
                grid = tuner.fit()
            stats["new_trials"] = len(grid)
        finally:
            if prog:
                prog.close()
            c = sink.counts
            for obj in (stop_when, sink):   # the registry holds them only while Tune runs
                _DRIVER_OBJECTS.pop(f"{os.getpid()}-{id(obj)}", None)
            stats["cancelled"] = bool(cancel is not None and cancel.is_set())
            stats["in_flight_limits"] = [lim for _, lim in limiter.history]
            stats["trial_errors"] = c["trial_errors"]
            stats["cache"] = {
                "layer_lookups": c["lookups"], "distinct_per_arch": c["unique"],
                "within_arch_dedup": c["lookups"] - c["unique"],
                "within_arch_dedup_rate": ((c["lookups"] - c["unique"]) / c["lookups"] if c["lookups"]
                                           else 0.0),
                "cross_trial_hits": c["cache_hits"], "solved": c["solved"],
                "cross_trial_hit_rate": c["cache_hits"] / c["unique"] if c["unique"] else 0.0}
            _status.info(f"writing {out / 'evaluations.parquet'}")
            best = store.close(meta)
        if interrupted.is_set():
            raise SearchInterrupted(f"interrupted after {len(store)} rows; resume with --resume")
    else:
        _status.info(f"writing {out / 'evaluations.parquet'}")
        best = store.close(meta)
    # one clock: the summary's wall time, the progress line's elapsed and report.md's wall time all count
    # from the run's start (the command's process start from the CLI), and report.md reads this one
    stats["wall_s"] = time.time() - started
    store.write_meta({**meta, "wall_s": stats["wall_s"]})
    if settings.schedule == "ilp":
        from .store import ilp_overall

        stats["ilp"] = ilp_overall(store.rows)
    # a model with no feasible placement anywhere: why, from the rows' errors (most frequent first)
    why: dict[str, dict[str, int]] = {}
    for r in store.rows:
        if r["model"] not in best["per_model"] and r["status"] in ("infeasible", "failed"):
            reasons = why.setdefault(r["model"], {})
            text = r["error"] or r["status"]
            reasons[text] = reasons.get(text, 0) + 1
    stats["no_placement"] = {m: dict(sorted(c.items(), key=lambda kv: -kv[1])) for m, c in why.items()}
    if report and len(store):
        from .report import write_report

        _status.info(f"writing {out / 'report.md'}")
        write_report(out)
    return {**best, "out_dir": str(out), "stats": stats}


def _model_label(ref: str) -> str:
    """A model's name for people: the preset, or the config file of an ``hf:`` reference."""
    if ref.startswith("hf:"):
        path = ref[3:].split("?", 1)[0]
        return f"{Path(path).parent.name}/{Path(path).name}" if Path(path).parent.name else Path(path).name
    return ref


def _py(v: Any) -> Any:
    f = float(v)
    return int(f) if f.is_integer() else f
