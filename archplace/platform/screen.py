"""``archplace search --searcher screen``: two-phase search over a whole architecture space.

Phaze walks the space in decreasing area and stops by hysteresis, so neither it nor a reader knows
how much better an architecture lies further down the area order. The screen spends a cheap
evaluation on every feasible architecture and the exact one only where it can matter:

* **phase 1** evaluates every architecture of the space under the sequential schedule (no ILP: every
  operator intra-op parallel, Phaze's own baseline) with the full placement DP, in Ray tasks of
  ``--archs-per-trial`` architectures each (``tasks.sequential_task``, spread over the cluster);
* **phase 2** runs the layer ILP + DP (``trial.evaluate_architecture``) on the union of the top
  ``k = --screen-top-k`` architectures of phase 1 for each model and for the common objective (the
  across-model average), plus the TPUv4 reference (the baseline every ratio needs) and any
  ``extra_candidates`` a caller adds (the Table 2 bench's eight-workload common objective).

Why this is exact where it claims to be: the ILP never makes a layer slower than the sequential
schedule (all-intra-op is one of its feasible schedules), and for one architecture both phases run
the same DP. So the phase-2 winner of an objective equals the exhaustive ILP + DP winner whenever the
exhaustive winner ranks within phase 1's top k for that objective. The stats report each phase-2
winner's phase-1 rank and how many fell outside the top k/2: a winner that deep says k is tight.

**Pruning** (``prune=True``; ``screen_bound.py``): phase 1 computes an upper bound on every
architecture's phase-1 throughput (numpy over the whole space, no DP), evaluates in decreasing bound
and stops once no unevaluated architecture's bound reaches any objective's k-th best evaluated value.
Every objective's phase-1 top k, and so the phase-2 candidate set, is then the full screen's (ties
included); ranks below k count evaluated architectures only. The architectures left out are recorded,
each with its bounds and the thresholds, in ``screen_prune.json``; the bounds are cached in
``screen_bounds.npz``. A pruned search resumed without pruning completes the full screen.
``phase1_extra`` indices are screened in phase 1 whatever their bound (a caller's own objectives).

Rows of both phases go into the one result store, marked by the ``phase`` column (1 or 2; one-phase
searches write 0); phase-1 rows rank candidates and are never a best row (``store._common_ok``).
``--resume`` skips what is stored: the phase-1 architectures already screened and the phase-2
candidates already solved. The ILP's budget is deterministic (``--ilp-budget``), so a resumed or a
repeated screen gives the same answers on an idle and on a busy machine. Everything Ray runs here is
tasks owned by this driver (``--address`` attaches to a cluster, as for the other searchers).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from .lock import OutDirLock
from .schedule_cache import LOAD_DEPENDENT, ScheduleCacheFile
from .screen_bound import BOUND_NAME, bound_rank, prune_record, still_needed, throughput_bounds
from .settings import SearchSettings
from .store import ResultStore

DEFAULT_TOP_K = 32
PHASE_SCREEN, PHASE_EXACT = 1, 2
COMMON = "common"   # the objective name of the across-model average


# ---------------------------------------------------------------------- rankings (plain Python)
def rankings(entries: Iterable[dict[str, Any]], models: Iterable[str]) -> dict[str, list[int]]:
    """Per objective (each model, and ``COMMON``) the space indices with a feasible value, best first
    (highest value, then lowest index: the store's tie rule). ``entries`` are ``ResultStore.finished()``
    values of one phase. A model's value is its throughput (``ok`` rows only); the common value is the
    across-model average of a non-failed architecture, as the store's common best."""
    models = list(models)
    vals: dict[str, list[tuple[float, int]]] = {m: [] for m in [*models, COMMON]}
    for e in entries:
        i = int(e["space_index"])
        for r in e["rows"]:
            if r["model"] in vals and r["status"] == "ok" and r["throughput"] > 0:
                vals[r["model"]].append((-float(r["throughput"]), i))
        if not e["failed"] and e["value"] > 0:
            vals[COMMON].append((-float(e["value"]), i))
    return {k: [i for _, i in sorted(v)] for k, v in vals.items()}


def candidates(ranks: dict[str, list[int]], top_k: int, extra: Iterable[int] = ()) -> list[int]:
    """The phase-2 set: the union of every objective's top ``top_k`` and ``extra``, in index order."""
    out = set(int(i) for i in extra)
    for order in ranks.values():
        out.update(order[:top_k])
    return sorted(out)


def winner_ranks(phase1: dict[str, list[int]], phase2: dict[str, list[int]], top_k: int
                 ) -> dict[str, Any]:
    """Where each objective's phase-2 winner ranked in phase 1 (0 = phase 1's own best), and how many
    winners fall outside the top ``top_k // 2`` (k may be too small when some do) or the top k (then
    the screen's answer for that objective may not be the exhaustive one)."""
    per: dict[str, Any] = {}
    for obj, order in phase2.items():
        if not order:
            continue
        w = order[0]
        rank = phase1.get(obj, []).index(w) if w in phase1.get(obj, []) else None
        per[obj] = {"winner_index": w, "phase1_rank": rank,
                    "phase1_best_index": (phase1.get(obj) or [None])[0],
                    "within_top_k": rank is not None and rank < top_k,
                    "within_top_half": rank is not None and rank < max(1, top_k // 2)}
    return {"top_k": top_k, "objectives": len(per),
            "outside_top_half": sum(not v["within_top_half"] for v in per.values()),
            "outside_top_k": sum(not v["within_top_k"] for v in per.values()), "per_objective": per}


def _phase_entries(store: ResultStore, phase: int) -> dict[int, dict[str, Any]]:
    return {int(e["space_index"]): e for e in store.finished().values() if e["rows"][0].get("phase") == phase}


# ---------------------------------------------------------------------- the driver
def validate_screen(settings: SearchSettings, top_k: int) -> None:
    if settings.schedule != "ilp":
        raise ValueError("--schedule sequential: the screen searcher screens with the sequential schedule "
                         "and solves its top-k with the ILP; leave --schedule at ilp")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"--screen-top-k must be an integer >= 1, got {top_k!r}")


def run_screen(settings: SearchSettings, out_dir: str | Path, *, top_k: int = DEFAULT_TOP_K,
               address: str | None = None, resume: bool = False, retry_failed: bool = False,
               workers: int | None = None, seed: int = 0, hysteresis: int = 6,
               area_bucket_mm2: float = 0.01, archs_per_trial: int = 1,
               schedule_cache: str | Path | None = None, wait_timeout_s: float = 600.0,
               task_timeout_s: float = 1800.0, progress: bool = True, report: bool = True,
               on_evaluated: Callable[[dict[str, Any]], None] | None = None,
               cancel: threading.Event | None = None, extra_candidates: Iterable[int] = (),
               phase2: bool = True, prune: bool = False, phase1_extra: Iterable[int] = ()) -> dict[str, Any]:
    """Run (or resume) a two-phase screen; returns ``best.json``'s content plus run statistics
    (``stats.phase1``, ``stats.phase2``, ``stats.screen``: the winners' phase-1 ranks). ``phase2=False``
    stops after phase 1 (a caller that adds candidates from several searches, then resumes).
    ``prune`` screens in bound order and skips what cannot reach a top k (module docstring);
    ``phase1_extra`` indices are screened in phase 1 regardless."""
    from .search import SearchInterrupted, _sigint_stops, check_paths, validate

    validate(settings, "screen", 1, workers, archs_per_trial)
    validate_screen(settings, top_k)
    if retry_failed and not resume:
        raise ValueError("--retry-failed re-runs the failed architectures of an earlier search: "
                         "pass --resume too")
    extra = sorted({int(i) for i in extra_candidates})
    p1_extra = sorted({int(i) for i in phase1_extra})
    out = Path(out_dir).resolve()
    check_paths(out, schedule_cache)
    lock = OutDirLock(out).acquire()
    store = ResultStore(out)
    fresh = not store.holds_search()
    interrupted = threading.Event()
    try:
        run = _Screen(settings, store, top_k=top_k, address=address, resume=resume, retry_failed=retry_failed,
                      workers=workers, seed=seed, hysteresis=hysteresis, area_bucket_mm2=area_bucket_mm2,
                      archs_per_trial=archs_per_trial, schedule_cache=schedule_cache,
                      wait_timeout_s=wait_timeout_s, task_timeout_s=task_timeout_s, progress=progress,
                      on_evaluated=on_evaluated, stop=_Stop(cancel, interrupted), prune=prune,
                      phase1_extra=p1_extra)
        with _sigint_stops(interrupted):
            res = run.run(extra, phase2)
    except BaseException:
        if fresh:
            store.discard_if_empty()
        raise
    finally:
        lock.release()
    if interrupted.is_set():
        raise SearchInterrupted(f"interrupted after {len(store)} rows; resume with --resume")
    if report and len(store) and res.get("common") is not None:
        from .report import write_report

        write_report(out)
    return res


class _Stop:
    def __init__(self, *events: threading.Event | None) -> None:
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class _Screen:
    def __init__(self, settings: SearchSettings, store: ResultStore, *, top_k: int, address, resume,
                 retry_failed, workers, seed, hysteresis, area_bucket_mm2, archs_per_trial, schedule_cache,
                 wait_timeout_s, task_timeout_s, progress, on_evaluated, stop: _Stop, prune: bool = False,
                 phase1_extra: list[int] | None = None) -> None:
        self.settings, self.store, self.top_k = settings, store, top_k
        self.address, self.resume, self.retry_failed, self.workers = address, resume, retry_failed, workers
        self.archs_per_trial, self.wait_timeout_s = archs_per_trial, wait_timeout_s
        self.task_timeout_s = task_timeout_s
        self.progress, self.hook, self.stop = progress, on_evaluated, stop
        self.cache_file = ScheduleCacheFile(schedule_cache or store.dir / "schedule_cache.jsonl")
        self.meta = json.loads(json.dumps({
            "settings": settings.to_dict(), "searcher": "screen", "seed": seed, "hysteresis": hysteresis,
            "area_bucket_mm2": area_bucket_mm2, "models": list(settings.models),
            "num_devices": settings.num_devices, "global_batch": settings.global_batch}))
        self.graphs: dict | None = None
        self.here = {"hostname": socket.gethostname(), "pid": os.getpid()}
        self.prune, self.phase1_extra = prune, list(phase1_extra or [])
        self.bounds: dict[str, np.ndarray] | None = None     # objective -> (n,) bound (pruning only)
        self.values: dict[str, np.ndarray] | None = None     # objective -> (n,) phase-1 value, NaN unknown
        self.ranks: dict[str, np.ndarray] | None = None

    # -------------------------------------------------------------- helpers
    def _check_resume(self) -> None:
        store, out = self.store, self.store.dir
        if not store.holds_search():
            return
        if not self.resume:
            raise ValueError(f"--out {out} already holds a search; pass --resume to continue it or choose "
                             "another directory")
        old = store.read_meta() if store.settings_path.exists() else self.meta
        if isinstance(old.get("settings"), dict):
            try:
                normal = SearchSettings.from_dict(old["settings"]).to_dict()
                old = dict(old, settings=json.loads(json.dumps(normal)))
            except (KeyError, TypeError, ValueError):
                pass
        for k in ("settings", "searcher", "seed", "hysteresis", "area_bucket_mm2"):
            if old.get(k) != self.meta[k]:
                raise ValueError(f"--resume: the search in {out} was run with a different {k} "
                                 f"({old.get(k)!r}); resume with the same options")
        store.load()
        if store.parts_on_disk():
            store.compact()

    def _ray(self) -> None:
        """Ray and the model graphs, once, on the first phase that has work."""
        if self.graphs is not None:
            return
        from .search import connect
        from .tasks import build_graph_task, get, wait_for_cpus

        connect(self.address, num_cpus=None)
        wait_for_cpus(self.wait_timeout_s)
        s = self.settings
        self.graphs = {k: build_graph_task.remote(k[0], s.seq, k[1], k[2], s.capture_blocks)
                       for k in s.graph_keys()}
        get(list(self.graphs.values()), f"building {len(self.graphs)} model graph(s)", self.wait_timeout_s)

    def _capacity(self) -> int:
        import ray

        cpus = int(ray.cluster_resources().get("CPU", 1))
        return max(1, min(self.workers or cpus, cpus))

    def _add(self, index: int, rows: list[dict[str, Any]], phase: int, trial: str, prog) -> None:
        now = time.time()
        rows = [{**r, **self.here, "phase": phase, "space_index": index, "trial_id": trial,
                 "finished_at": r.get("finished_at") or now} for r in rows]
        self.store.add(rows, "screen")
        failed = any(r["status"] == "failed" for r in rows)
        value = 0.0 if failed else float(np.mean([r["throughput"] for r in rows]))
        if phase == PHASE_SCREEN and self.values is not None:
            self._know(index, rows, failed, value)
        if prog:
            prog.update(None if failed else value, failed=failed)
        if self.hook is not None:
            ok = all(r["status"] == "ok" for r in rows)
            status = "failed" if failed else "ok" if ok else "infeasible"
            self.hook({"phase": phase, "space_index": index, "arch_key": rows[0]["arch_key"],
                       "arch_label": rows[0]["arch_label"], "throughput_avg": None if failed else value,
                       "status": status, **({"error": rows[0]["error"]} if failed else {})})

    def _failed(self, index: int, space, error: str, phase: int, prog) -> None:
        from .evaluate import arch_columns

        cols = arch_columns(space.accelerator(index))
        schedule = "sequential" if phase == PHASE_SCREEN else "ilp"
        rows = [{**cols, "model": m, "status": "failed", "error": error[:500], "throughput": 0.0,
                 "schedule": schedule} for m in self.settings.models]
        self._add(index, rows, phase, f"screen-{phase}", prog)

    def _todo(self, phase: int, wanted: Iterable[int]) -> list[int]:
        done = _phase_entries(self.store, phase)
        return [i for i in wanted if i not in done or (self.retry_failed and done[i]["failed"])]

    # -------------------------------------------------------------- the phases
    def run(self, extra: list[int], phase2: bool) -> dict[str, Any]:
        from ..hardware.space import enumerate_space

        self._check_resume()
        space = enumerate_space(self.settings.space)
        bad = [i for i in [*extra, *self.phase1_extra] if not 0 <= i < len(space)]
        if bad:
            raise ValueError(f"extra candidates {bad[:5]} are not indices of the space (0..{len(space) - 1})")
        self.store.write_meta({**self.meta, "started_at": time.time(),
                               "archs_per_trial": self.archs_per_trial})
        t0 = time.perf_counter()
        stats: dict[str, Any] = {"resumed": len(self.store.finished())}
        stats["phase1"] = self._phase1(space)
        screened = _phase_entries(self.store, PHASE_SCREEN)
        ref = sorted(i for i, e in screened.items() if e["rows"][0]["is_reference"])   # TPUv4 if in space
        ranks1 = rankings(screened.values(), self.settings.models)
        cands = candidates(ranks1, self.top_k, [*extra, *ref[:1]])
        complete = stats["phase1"]["remaining"] == 0
        if phase2 and complete and not self.stop.is_set():
            stats["phase2"] = self._phase2(space, cands)
        stats["phase2_candidates"] = cands
        ranks2 = rankings(_phase_entries(self.store, PHASE_EXACT).values(), self.settings.models)
        stats["screen"] = winner_ranks(ranks1, ranks2, self.top_k)
        p2_rows = [r for e in _phase_entries(self.store, PHASE_EXACT).values() for r in e["rows"]]
        from .store import ilp_overall

        stats["ilp"] = ilp_overall(p2_rows)
        stats["solver_limits"] = {"phase1": {"schedule": "sequential", "ilp": None, "dp": "exact"},
                                  "phase2": {"schedule": "ilp", **self.settings.ilp_settings(),
                                             "budget_unit": "CP-SAT deterministic seconds per layer slice",
                                             "dp": "exact"}}
        stats["cancelled"] = self.stop.is_set()
        stats["wall_s"] = time.perf_counter() - t0
        stats["in_flight_limits"] = [self._capacity()] if self.graphs is not None else []
        best = self.store.close({**self.meta, "searcher": "screen"})
        return {**best, "out_dir": str(self.store.dir), "stats": stats}

    # -------------------------------------------------------------- pruning (screen_bound.py)
    def _objectives(self) -> list[str]:
        return [*self.settings.models, COMMON]

    def _know(self, index: int, rows: list[dict[str, Any]], failed: bool, value: float) -> None:
        """Record one architecture's phase-1 values (0 for infeasible or failed: ranked by nobody)."""
        by = {r["model"]: r for r in rows}
        for m in self.settings.models:
            r = by.get(m)
            ok = r is not None and not failed and r["status"] == "ok"
            self.values[m][index] = float(r["throughput"]) if ok else 0.0
        self.values[COMMON][index] = 0.0 if failed else value

    def _init_prune(self, space) -> None:
        """Bounds (cached in the out dir) and the values of the architectures already screened."""
        n = len(space)
        path = self.store.dir / "screen_bounds.npz"
        models = list(self.settings.models)
        b = None
        try:
            with np.load(path, allow_pickle=False) as z:
                if (str(z["bound"]) == BOUND_NAME and list(z["models"]) == models
                        and all(len(z[f"b{k}"]) == n for k in range(len(models)))):
                    b = {m: z[f"b{k}"] for k, m in enumerate(models)}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            b = None          # absent, or written by a killed run: computed again
        if b is None:
            b = throughput_bounds(space, self.settings)
            tmp = path.with_name("screen_bounds.tmp.npz")
            np.savez(tmp, bound=np.array(BOUND_NAME), models=np.array(models),
                     **{f"b{k}": b[m] for k, m in enumerate(models)})
            tmp.replace(path)
        b[COMMON] = np.mean([b[m] for m in models], axis=0)
        self.bounds = b
        self.ranks = {o: bound_rank(v) for o, v in b.items()}
        self.values = {o: np.full(n, np.nan) for o in self._objectives()}
        for i, e in _phase_entries(self.store, PHASE_SCREEN).items():
            if not (self.retry_failed and e["failed"]):
                self._know(i, e["rows"], e["failed"], float(e["value"]))

    def _wanted(self, n: int) -> list[int]:
        """Phase 1's remaining work: every unscreened index, or with pruning the ``phase1_extra`` not
        screened yet and then what ``still_needed`` says, most promising first."""
        if not self.prune:
            return self._todo(PHASE_SCREEN, range(n))
        known = ~np.isnan(self.values[COMMON])
        first = [i for i in self.phase1_extra if not known[i]]
        rest = [int(i) for i in still_needed(self.bounds, self.values, self.top_k, self.ranks)]
        seen = set(first)
        return first + [i for i in rest if i not in seen]

    def _write_prune_record(self) -> dict[str, Any]:
        rec = prune_record(self.bounds, self.values, self.top_k)
        rec["complete"] = not self._wanted(len(self.values[COMMON]))
        tmp = self.store.dir / "screen_prune.json.tmp"
        tmp.write_text(json.dumps(rec))
        tmp.replace(self.store.dir / "screen_prune.json")
        return {k: v for k, v in rec.items() if k not in ("pruned_index", "pruned_bound")}

    def _phase1(self, space) -> dict[str, Any]:
        import ray

        from .search import _Progress

        n = len(space)
        if self.prune:
            tb = time.perf_counter()
            self._init_prune(space)
            bound_s = time.perf_counter() - tb
        todo = self._wanted(n)
        t0 = time.perf_counter()
        out = {"architectures": n, "new": 0, "failed": 0, "wall_s": 0.0, "task_s": 0.0,
               "archs_per_task": self.archs_per_trial, "pruning": self.prune}
        if self.prune:
            out["bound_s"] = bound_s
        if todo:
            from .tasks import sequential_task

            self._ray()
            s1 = dataclasses.replace(self.settings, schedule="sequential")
            s1d, keys = s1.to_dict(), s1.graph_keys()
            graph_refs = [self.graphs[k] for k in keys]
            static = [todo[i:i + self.archs_per_trial] for i in range(0, len(todo), self.archs_per_trial)]
            prog = _Progress(len(todo)) if self.progress else None
            window, nxt, inflight, busy = 2 * self._capacity(), 0, {}, set()

            def next_chunk() -> list[int] | None:
                nonlocal nxt
                if not self.prune:        # the full screen: index order, fixed chunks
                    nxt += 1
                    return static[nxt - 1] if nxt <= len(static) else None
                queue = [i for i in self._wanted(n) if i not in busy]   # bounds move as values arrive
                if prog:
                    prog.total = prog.done + len(busy) + len(queue)
                return queue[:self.archs_per_trial] or None

            try:
                while True:
                    while len(inflight) < window and not self.stop.is_set():
                        chunk = next_chunk()
                        if chunk is None:
                            break
                        accs = [space.accelerator(i).to_dict() for i in chunk]
                        inflight[sequential_task.remote(accs, s1d, keys, *graph_refs)] = chunk
                        busy.update(chunk)
                    if not inflight or self.stop.is_set():
                        break
                    ready, _ = ray.wait(list(inflight), num_returns=1, timeout=self.task_timeout_s)
                    if not ready:
                        raise TimeoutError(f"no screen task finished within {self.task_timeout_s:.0f} s")
                    chunk = inflight.pop(ready[0])
                    busy.difference_update(chunk)
                    try:
                        results = ray.get(ready[0])
                    except ray.exceptions.RayError as e:
                        for i in chunk:
                            self._failed(i, space, _one_line(e), PHASE_SCREEN, prog)
                            out["failed"] += 1
                        continue
                    for i, res in zip(chunk, results):
                        out["task_s"] += float(sum(r["total_s"] for r in res["rows"]))
                        self._add(i, res["rows"], PHASE_SCREEN, f"screen-1-{chunk[0]}", prog)
                        out["new"] += 1
                    self.store.write_best(self.meta)
            finally:
                for ref in inflight:
                    ray.cancel(ref)   # a running task gets KeyboardInterrupt; its rows are not stored
                if prog:
                    prog.close()
        out["wall_s"] = time.perf_counter() - t0
        out["remaining"] = len(self._wanted(n))
        out["task_s_per_arch"] = out["task_s"] / out["new"] if out["new"] else None
        if self.prune:
            out["prune"] = self._write_prune_record()
        return out

    def _phase2(self, space, cands: list[int]) -> dict[str, Any]:
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        from .search import _Progress
        from .trial import evaluate_architecture

        todo = self._todo(PHASE_EXACT, cands)
        t0 = time.perf_counter()
        out: dict[str, Any] = {"candidates": len(cands), "new": 0, "failed": 0, "wall_s": 0.0}
        if todo:
            self._ray()
            cache = self.cache_file.load()
            out["cache_loaded"] = len(cache)
            lock = threading.Lock()

            def on_solved(slices: dict[str, list], final: bool) -> None:
                keep = {k: v for k, v in slices.items() if v[3] not in LOAD_DEPENDENT}
                if keep:
                    with lock:
                        self.cache_file.append(keep)
                        cache.update(keep)

            def one(i: int):
                return evaluate_architecture(space.accelerator(i), self.settings, self.graphs, cache,
                                             self.task_timeout_s, on_solved=on_solved)

            prog = _Progress(len(todo)) if self.progress else None
            n = min(self._capacity(), len(todo))
            with ThreadPoolExecutor(max_workers=n) as pool:
                pending, it = {}, iter(todo)
                for i in it:
                    pending[pool.submit(one, i)] = i
                    if len(pending) >= n:
                        break
                while pending:
                    done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                    for f in done:
                        i = pending.pop(f)
                        try:
                            _, rows, _ = f.result()
                        except Exception as e:   # noqa: BLE001 - recorded as the architecture's failure
                            self._failed(i, space, _one_line(e), PHASE_EXACT, prog)
                            out["failed"] += 1
                        else:
                            self._add(i, rows, PHASE_EXACT, "screen-2", prog)
                            out["new"] += 1
                        self.store.write_best(self.meta)
                        nxt = None if self.stop.is_set() else next(it, None)
                        if nxt is not None:
                            pending[pool.submit(one, nxt)] = nxt
            if prog:
                prog.close()
        out["wall_s"] = time.perf_counter() - t0
        out["wall_s_per_arch"] = out["wall_s"] / out["new"] if out["new"] else None
        out["parallel_evaluations"] = min(self._capacity(), len(todo)) if todo else 0
        return out


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    msg = next((ln for ln in reversed(text) if "Error" in ln or "error" in ln), text[-1] if text else "")
    return (msg or type(e).__name__).strip()
