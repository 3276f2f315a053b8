"""Co-design targets of ``archplace search --target``: the hardware and its placement searched together
for a chiplet package (``mcm``) or a GPU cluster shape (``gpu-cluster``), as Ray Tune experiments. The
``accelerator`` target is the Phaze search of ``platform/search.py``.

One Tune trial evaluates one hardware point of the target's space for every model (``mcm``: each model
partitioned by the chosen placer and evaluated by the MCM simulator, ``platform/mcm_trial.py``;
``gpu-cluster``: the pipeline DP per model, ``platform/gpu_cluster_trial.py``, another helper's
module). What the Phaze search gives, this gives too:

* the rows stream into the append-only result store (``store.ResultStore`` with this target's schema:
  one row per hardware point × model), so a killed driver loses nothing a trial reported, and
  ``--resume`` reloads the store, tells the searcher what was evaluated and evaluates only the rest;
* ``best.json``: the best design by the single objective (``throughput_per_kusd``: the average over
  models of throughput per thousand dollars of package or hourly price), its hardware and every model's
  partition or plan, the best design per model, and the Pareto front of (average throughput, cost);
* ``report.md`` with the throughput-vs-cost Pareto plot (``codesign_report.py``).

Searchers: ``grid`` (an evenly strided subset of the space's product order, all of it when the budget
covers it), ``random`` (a seeded permutation), ``optuna`` (seeded TPE on the single objective) and
``pareto`` (Optuna's NSGA-II, ``optuna.samplers.NSGAIISampler``, through Tune's ``OptunaSearch`` with the
two metrics ``throughput_avg`` (max) and ``cost_usd`` (min)).

Everything Ray runs for the search is owned by this driver; it attaches to ``--address`` or starts
its own Ray as the Phaze search does (``search.connect``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from .codesign_report import OBJECTIVE, pareto_mask, write_report
from .store import ResultStore

TARGETS = ("accelerator", "mcm", "gpu-cluster")
SEARCHERS = ("random", "grid", "optuna", "pareto")
FAULT_ENV = "ARCHPLACE_FAULT_INJECT"

_BASE = [("order", pa.int64()), ("trial_id", pa.string()), ("searcher", pa.string()),
         ("arch_key", pa.string()), ("arch_label", pa.string()), ("space_index", pa.int64()),
         ("model", pa.string()), ("status", pa.string()), ("error", pa.string()),
         ("throughput", pa.float64()), ("cost_usd", pa.float64()), ("throughput_per_kusd", pa.float64()),
         ("is_reference", pa.bool_()), ("hardware_json", pa.string()), ("finished_at", pa.float64()),
         ("hostname", pa.string()), ("pid", pa.int64()), ("total_s", pa.float64())]
MCM_COLUMNS = [("num_chiplets", pa.int64()), ("pe", pa.int64()), ("clock_mhz", pa.float64()),
               ("sram_mb", pa.float64()), ("link_gbs", pa.float64()), ("link_pj_per_bit", pa.float64()),
               ("topology", pa.string()), ("chiplet_area_mm2", pa.float64()), ("phy_area_mm2", pa.float64()),
               ("silicon_area_mm2", pa.float64()), ("die_yield", pa.float64()), ("kgd_usd", pa.float64()),
               ("package_yield", pa.float64()), ("package_usd", pa.float64()), ("peak_tops", pa.float64()),
               ("placer", pa.string()), ("max_latency_s", pa.float64()), ("chips_used", pa.int64()),
               ("nodes", pa.int64()), ("link_bytes", pa.float64()), ("d2d_energy_per_sample_j", pa.float64()),
               ("greedy_throughput", pa.float64()), ("subsolves", pa.int64()), ("det_time", pa.float64()),
               ("stopped", pa.string()), ("fallback", pa.bool_()), ("placer_s", pa.float64()),
               ("trained_subsolves", pa.int64()),
               ("partition_json", pa.string())]
GPU_COLUMNS = [("iteration_time_s", pa.float64()), ("cost_per_step_usd", pa.float64()),
               ("memory_fit", pa.bool_()), ("price_per_hour_usd", pa.float64()), ("plan_json", pa.string())]


@dataclass(frozen=True)
class Target:
    """What the driver needs of a target: its space (loaded, enumerated), the columns of its rows and
    what its cost column is."""

    name: str
    columns: list
    cost_label: str          # what cost_usd means, for best.json and the report
    throughput_label: str

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(_BASE + self.columns)


TARGET_INFO = {
    "mcm": Target("mcm", MCM_COLUMNS, "package cost (USD)", "samples/s"),
    "gpu-cluster": Target("gpu-cluster", GPU_COLUMNS, "price per hour (USD)", "training samples/s"),
}


def _gpu():
    """The GPU-cluster target's core modules (``hardware/gpu_cluster_space.py``, ``cluster_prices.py``,
    ``platform/gpu_cluster_trial.py``), imported when that target is used."""
    from ..hardware import cluster_prices, gpu_cluster_space
    from . import gpu_cluster_trial

    return gpu_cluster_space, cluster_prices, gpu_cluster_trial


# ---------------------------------------------------------------------- spaces
def load_space(target: str, spec: str | dict | None) -> dict[str, Any]:
    """The target's space as JSON-able content with ``axes`` (name -> values): shipped to the trials."""
    if target == "mcm":
        from .mcm_trial import load_space as mcm_space

        return mcm_space(spec)
    space_mod, _, _ = _gpu()
    if isinstance(spec, dict) and "axes" in spec:   # this module's form of the content (a resume)
        spec = {"cluster": spec["axes"], "training": spec.get("training") or {}}
    loaded = space_mod.load_space(spec)
    return json.loads(json.dumps({"axes": loaded["cluster"], "training": loaded["training"]}))


def axes_of(space: dict[str, Any]) -> dict[str, list]:
    return space["axes"]


def all_points(space: dict[str, Any]) -> list[dict[str, Any]]:
    import itertools

    axes = axes_of(space)
    names = list(axes)
    return [dict(zip(names, v)) for v in itertools.product(*(axes[a] for a in names))]


def _config_key(config: dict[str, Any], names: list[str]) -> tuple:
    return tuple(str(config[a]) for a in names)


# ---------------------------------------------------------------------- evaluation (in the trial)
def evaluate_point(target: str, config: dict[str, Any], space: dict[str, Any], graphs: dict[str, Any],
                   opts: dict[str, Any], policy_state: dict | None = None) -> list[dict[str, Any]]:
    """One hardware point's rows (one per model), with the common columns filled."""
    if target == "mcm":
        from ..hardware.chiplet_cost import CostParams
        from .mcm_trial import MCMDesign, PlacerOptions, evaluate_design

        design = MCMDesign.from_config(config)
        rows = evaluate_design(design, graphs, PlacerOptions(**opts), CostParams.from_dict(space.get("cost")),
                               policy_state)
        for r in rows:
            r["cost_usd"] = r["package_usd"]
            r["hardware_json"] = json.dumps(design.to_dict())
        return rows
    space_mod, _, trial = _gpu()
    shape = space_mod.shape_from_config(config)
    flat = trial.evaluate_cluster(shape, list(graphs), **(space.get("training") or {}))
    price = float(flat["price_per_hour_usd"])
    rows = []
    for m in graphs:
        fit = bool(flat[f"{m}.memory_fit"])
        tp = float(flat[f"{m}.throughput_samples_per_s"] or 0.0) if fit else 0.0
        plan = {k[len(m) + 1:]: v for k, v in flat.items() if k.startswith(f"{m}.")}
        rows.append({"arch_key": shape.name, "arch_label": shape.name, "model": m,
                     "status": "ok" if tp > 0 else "infeasible",
                     "error": flat.get(f"{m}.memory_reason") or "",
                     "throughput": tp, "cost_usd": price, "throughput_per_kusd": tp / price * 1e3,
                     "iteration_time_s": _nan(flat[f"{m}.iteration_time_s"]), "memory_fit": fit,
                     "price_per_hour_usd": price, "cost_per_step_usd": _nan(flat[f"{m}.cost_per_step_usd"]),
                     "plan_json": json.dumps(plan, default=str), "hardware_json": json.dumps(shape.to_dict()),
                     "is_reference": False})
    return rows


def _nan(v: Any) -> float:
    return math.nan if v is None else float(v)


def codesign_trainable(config: dict[str, Any], target: str, space: dict[str, Any], graphs: dict,
                       opts: dict[str, Any], policy_state: dict | None = None, faults: str = "",
                       out_dir: str = "") -> None:
    """The Tune function trainable: one hardware point, reported with its rows (the driver's callback
    moves them into the store and out of Tune's result)."""
    import socket

    from ray import tune

    from .trial import _inject_fault

    index = int(config["index"]) if "index" in config else _index(space, config)
    point = all_points_cached(space)[index]
    _inject_fault(str(index), out_dir, faults)   # "slow:*:S" etc. (trial.py), KEY = the point's index
    t0 = time.perf_counter()
    rows = evaluate_point(target, point, space, graphs, opts, policy_state)
    now, here = time.time(), {"hostname": socket.gethostname(), "pid": os.getpid()}
    for r in rows:
        r.update(here, space_index=index, trial_id=tune.get_context().get_trial_id(), finished_at=now,
                 total_s=r.get("total_s", time.perf_counter() - t0))
    feasible = all(r["status"] == "ok" for r in rows)   # as the store's designs(): every model placed
    tp = float(np.mean([r["throughput"] for r in rows])) if feasible else 0.0
    cost = float(rows[0]["cost_usd"])
    tune.report({"throughput_avg": tp, "cost_usd": cost, OBJECTIVE: tp / cost * 1e3, "feasible": feasible,
                 "space_index": index, "rows_json": json.dumps(rows)})


_POINTS: dict[str, list] = {}


def all_points_cached(space: dict[str, Any]) -> list[dict[str, Any]]:
    key = json.dumps(space, sort_keys=True)
    if key not in _POINTS:
        _POINTS.clear()
        _POINTS[key] = all_points(space)
    return _POINTS[key]


def _index(space: dict[str, Any], config: dict[str, Any]) -> int:
    names = list(axes_of(space))
    want = _config_key(config, names)
    for i, p in enumerate(all_points_cached(space)):
        if _config_key(p, names) == want:
            return i
    raise ValueError(f"config {config} is not a point of the space")


# ---------------------------------------------------------------------- the store and best.json
class CodesignStore(ResultStore):
    """The result store with a co-design target's columns, and its ``best()`` (module doc)."""

    def __init__(self, out_dir: str | Path, target: str, **kw: Any) -> None:
        info = TARGET_INFO[target]
        self.schema = info.schema
        defaults = {pa.int64(): 0, pa.float64(): math.nan, pa.string(): "", pa.bool_(): False}
        self.column_defaults = {f.name: defaults[f.type] for f in self.schema}
        self.target = info
        super().__init__(out_dir, **kw)

    def designs(self) -> list[dict[str, Any]]:
        """Per evaluated hardware point: its rows, average throughput, cost, objective, feasibility."""
        out = []
        for key, e in self._fin.items():
            rows = sorted(e["rows"], key=lambda r: r["model"])
            ok = all(r["status"] == "ok" for r in rows)
            tp = float(np.mean([r["throughput"] for r in rows])) if ok else 0.0
            cost = float(rows[0]["cost_usd"])
            out.append({"arch_key": key, "space_index": int(rows[0]["space_index"]), "rows": rows, "ok": ok,
                        "failed": e["failed"], "throughput_avg": tp, "cost_usd": cost,
                        OBJECTIVE: tp / cost * 1e3 if cost > 0 else 0.0})
        return out

    def _design(self, d: dict[str, Any], models: list[str]) -> dict[str, Any]:
        r0 = d["rows"][0]
        out = {"arch_key": d["arch_key"], "arch_label": r0["arch_label"], "space_index": d["space_index"],
               "hardware": json.loads(r0["hardware_json"] or "{}"), "throughput_avg": d["throughput_avg"],
               "cost_usd": d["cost_usd"], OBJECTIVE: d[OBJECTIVE]}
        if self.target.name == "mcm":
            out.update({k: _json(r0[k]) for k in ("chiplet_area_mm2", "silicon_area_mm2", "die_yield",
                                                 "kgd_usd", "package_yield", "package_usd", "peak_tops")})
        per = {}
        for r in d["rows"]:
            if self.target.name == "mcm":
                per[r["model"]] = {"throughput": r["throughput"], "status": r["status"], "error": r["error"],
                                   "chips_used": int(r["chips_used"]), "max_latency_s": r["max_latency_s"],
                                   "d2d_energy_per_sample_j": _json(r["d2d_energy_per_sample_j"]),
                                   "placer": r["placer"], "subsolves": int(r["subsolves"]),
                                   "det_time": _json(r["det_time"]), "fallback": bool(r["fallback"]),
                                   "partition": json.loads(r["partition_json"] or "[]")}
            else:
                per[r["model"]] = {"throughput": r["throughput"], "status": r["status"],
                                   "iteration_time_s": _json(r["iteration_time_s"]),
                                   "cost_per_step_usd": _json(r["cost_per_step_usd"]),
                                   "memory_fit": bool(r["memory_fit"]),
                                   "plan": json.loads(r["plan_json"] or "null")}
        out["per_model"] = per
        return out

    def best(self, meta: dict[str, Any]) -> dict[str, Any]:
        """Highest ``throughput_per_kusd`` (then lowest space index) among designs feasible for every
        model; per model the same on that model's row; the Pareto front of (throughput, cost)."""
        models = list(meta["models"])
        ds = self.designs()
        ok = [d for d in ds if d["ok"] and d["throughput_avg"] > 0]
        out: dict[str, Any] = {
            "target": self.target.name, "models": models, "searcher": meta.get("searcher"),
            "placer": meta.get("settings", {}).get("opts", {}).get("placer"), "objective": OBJECTIVE,
            "cost": self.target.cost_label, "throughput_unit": self.target.throughput_label,
            "evaluated": len(ds), "failed": sum(d["failed"] for d in ds),
            "infeasible": sum(not d["ok"] and not d["failed"] for d in ds),
            "common": None, "per_model": {}, "pareto": []}
        if ok:
            best = max(ok, key=lambda d: (d[OBJECTIVE], -d["space_index"]))
            out["common"] = self._design(best, models)
            tp = np.array([d["throughput_avg"] for d in ok])
            cost = np.array([d["cost_usd"] for d in ok])
            front = [ok[i] for i in np.flatnonzero(pareto_mask(tp, cost))]
            out["pareto"] = [{"arch_key": d["arch_key"], "arch_label": d["rows"][0]["arch_label"],
                              "space_index": d["space_index"], "throughput_avg": d["throughput_avg"],
                              "cost_usd": d["cost_usd"], OBJECTIVE: d[OBJECTIVE]}
                             for d in sorted(front, key=lambda d: (d["cost_usd"], d["space_index"]))]
        for m in models:
            cands = [(r["throughput_per_kusd"], -d["space_index"], d, r) for d in ds for r in d["rows"]
                     if r["model"] == m and r["status"] == "ok" and r["throughput"] > 0]
            if cands:
                _, _, d, r = max(cands, key=lambda c: (c[0], c[1]))
                one = self._design({**d, "rows": [r], "throughput_avg": r["throughput"],
                                    OBJECTIVE: r["throughput_per_kusd"]}, [m])
                out["per_model"][m] = one
        return out


def _json(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        return None if not math.isfinite(float(v)) else float(v)
    if isinstance(v, np.integer):
        return int(v)
    return v


# ---------------------------------------------------------------------- searchers
def point_order(searcher: str, n: int, budget: int, seed: int) -> list[int]:
    """The indices ``grid`` and ``random`` evaluate, in order: ``grid`` an evenly strided subset of the
    product order (all of it when ``budget >= n``), ``random`` a seeded permutation's first ``budget``."""
    if searcher == "grid":
        if budget >= n:
            return list(range(n))
        return [int(i) for i in np.unique(np.round(np.linspace(0, n - 1, budget)).astype(np.int64))]
    return [int(i) for i in np.random.default_rng(seed).permutation(n)[:budget]]


def _list_searcher(order: list[int]):
    from ray.tune.search import Searcher

    class ListSearcher(Searcher):
        """Hands out ``order`` one index per trial, then FINISHED (grid and random)."""

        def __init__(self, order: list[int]) -> None:
            super().__init__(metric=OBJECTIVE, mode="max")
            self.order, self.next = list(order), 0

        def set_search_properties(self, metric, mode, config, **spec) -> bool:
            return True

        def suggest(self, trial_id: str):
            if self.next >= len(self.order):
                return Searcher.FINISHED
            self.next += 1
            return {"index": self.order[self.next - 1]}

        def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
            pass

    return ListSearcher(order)


def _optuna_searcher(searcher: str, space: dict[str, Any], seed: int, done: list[dict[str, Any]]):
    """Tune's ``OptunaSearch`` over the axes as categorical parameters: TPE on the objective (``optuna``)
    or NSGA-II on (throughput_avg max, cost_usd min) (``pareto``); ``done`` (resume) told first.

    Every trial gets a point no earlier trial had: a draw that lands on one (a resumed search's seeded
    sampler draws its first points again; a categorical sampler repeats itself) is told that point's
    known result (an error while it is still running, as the service's studies do) and drawn again, so
    the budget counts distinct packages."""
    import optuna
    from ray.tune.search import Searcher
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = list(axes_of(space))
    dists = {a: optuna.distributions.CategoricalDistribution([str(v) for v in axes_of(space)[a]])
             for a in names}
    multi = searcher == "pareto"
    n = len(all_points_cached(space))

    class DistinctOptuna(OptunaSearch):
        def __init__(self, **kw) -> None:
            super().__init__(**kw)
            self.known: dict[tuple, Any] = {}   # point -> told values (None: failed or still running)

        def suggest(self, trial_id: str):
            for _ in range(200):
                cfg = super().suggest(trial_id)
                if not isinstance(cfg, dict):
                    return cfg
                key = tuple(str(cfg[a]) for a in names)
                if key not in self.known:
                    self.known[key] = None
                    return cfg
                if len(self.known) >= n:
                    return Searcher.FINISHED
                ot_trial = self._ot_trials.pop(trial_id)
                value = self.known[key]
                if value is None:
                    self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
                else:
                    self._ot_study.tell(ot_trial, value)
            return Searcher.FINISHED

        def on_trial_complete(self, trial_id: str, result=None, error: bool = False) -> None:
            ot_trial = self._ot_trials.get(trial_id)
            if multi and ot_trial is not None and result and not error and not result.get("feasible", True):
                # a package some model does not fit: no point of the front (its cost alone would make
                # it one), so NSGA-II is told it failed
                self._ot_study.tell(ot_trial, state=optuna.trial.TrialState.FAIL)
                self._completed_trials.add(trial_id)
                return
            if ot_trial is not None and result and not error:
                key = tuple(str(ot_trial.params[a]) for a in names)
                self.known[key] = ([result["throughput_avg"], result["cost_usd"]] if multi
                                   else result[OBJECTIVE])
            super().on_trial_complete(trial_id, result, error)

    if multi:
        s = DistinctOptuna(space=dists, metric=["throughput_avg", "cost_usd"], mode=["max", "min"],
                           sampler=optuna.samplers.NSGAIISampler(seed=seed))
    else:
        s = DistinctOptuna(space=dists, metric=OBJECTIVE, mode="max",
                           sampler=optuna.samplers.TPESampler(seed=seed))
    for d in done:
        params = {a: str(d["point"][a]) for a in names}
        failed = d["failed"] or (multi and not d["ok"])
        state = optuna.trial.TrialState.FAIL if failed else optuna.trial.TrialState.COMPLETE
        values = None if failed else ([d["throughput_avg"], d["cost_usd"]] if multi else d[OBJECTIVE])
        s.known[tuple(params[a] for a in names)] = values
        # OptunaSearch.add_evaluated_point takes one value; the study takes a list for two objectives
        s._ot_study.add_trial(optuna.trial.create_trial(
            state=state, params=params, distributions=dists,
            **({"values": values} if multi else {"value": values})))
    return s


# ---------------------------------------------------------------------- the driver
def run_codesign(target: str, models: tuple[str, ...], out_dir: str | Path, *, searcher: str = "random",
                 budget: int = 16, address: str | None = None, resume: bool = False,
                 workers: int | None = None,
                 seed: int = 0, space: str | dict | None = None, opts: dict[str, Any] | None = None,
                 seq: int | None = None, policy: str | None = None, max_failures: int = 0,
                 progress: bool = True, report: bool = True,
                 on_evaluated: Callable[[dict[str, Any]], None] | None = None,
                 cancel: threading.Event | None = None) -> dict[str, Any]:
    """Run (or resume) a co-design search; returns ``best.json``'s content plus run statistics."""
    from .lock import OutDirLock
    from .search import check_paths

    if target not in TARGET_INFO:
        raise ValueError(f"--target {target!r} unknown; allowed: {list(TARGETS)}")
    if searcher not in SEARCHERS:
        raise ValueError(f"--searcher {searcher!r} unknown for --target {target}; allowed: {list(SEARCHERS)}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"--budget must be a positive number of hardware points, got {budget!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    if not models:
        raise ValueError("models: give at least one model")
    if len(set(models)) != len(models):
        raise ValueError(f"models: {list(models)} lists a model twice")
    opts = dict(opts or {})
    content = load_space(target, space)
    if target == "gpu-cluster":
        from ..workloads.models import preset

        for m in models:
            preset(m)   # "unknown model ..." before Ray starts
        opts = {}
    if target == "mcm":
        from .mcm_trial import PlacerOptions

        opts = dataclasses.asdict(PlacerOptions(**opts))   # checked, with every default filled in
        for m in models:
            if m.endswith(".json") and not m.startswith("hf:"):
                from .mcm_trial import mcm_graph

                mcm_graph(m)   # the one-line refusal of profiled graph files
    out = Path(out_dir).resolve()
    check_paths(out, None)
    lock = OutDirLock(out).acquire()
    store = CodesignStore(out, target)
    fresh = not store.holds_search()
    try:
        return _run(target, tuple(models), store, searcher, budget, address, resume, workers, seed, content,
                    opts, seq, policy, max_failures, progress, report, on_evaluated, cancel)
    except BaseException:
        if fresh:
            store.discard_if_empty()
        raise
    finally:
        lock.release()


def point_key(target: str, point: dict[str, Any]) -> tuple[str, str]:
    """(arch_key, arch_label) of a hardware point, as its rows name it."""
    if target == "mcm":
        from .mcm_trial import MCMDesign

        d = MCMDesign.from_config(point)
        return d.key(), d.label()
    name = _gpu()[0].shape_from_config(point).name
    return name, name


def _run(target, models, store, searcher, budget, address, resume, workers, seed, content, opts, seq, policy,
         max_failures, progress, report, on_evaluated, cancel) -> dict[str, Any]:
    from .search import (
        _DRIVER_OBJECTS,
        SearchInterrupted,
        _cancel_stopper,
        _Either,
        _env,
        _Progress,
        _sigint_stops,
        _store_callback,
        connect,
    )

    out = store.dir
    meta_new = json.loads(json.dumps({
        "target": target, "models": list(models), "searcher": searcher, "seed": seed,
        "settings": {"models": list(models), "space": content, "opts": opts, "seq": seq, "policy": policy}}))
    if store.holds_search():
        if not resume:
            raise ValueError(f"--out {out} already holds a search; pass --resume to continue it or choose "
                             "another directory")
        old = store.read_meta()
        for k in ("target", "settings", "searcher", "seed"):
            if old.get(k) != meta_new[k]:
                raise ValueError(f"--resume: the search in {out} was run with a different {k} "
                                 f"({old.get(k)!r}); resume with the same options")
        store.load()
        if store.parts_on_disk():
            store.compact()
    points = all_points(content)
    n = len(points)
    designs = store.designs()
    done = {d["space_index"] for d in designs}
    if searcher in ("grid", "random"):
        todo = [i for i in point_order(searcher, n, budget, seed) if i not in done]
    else:
        todo = list(range(max(0, min(budget, n) - len(done))))   # Optuna picks them
    meta = {**meta_new, "budget": budget, "started_at": time.time()}
    store.write_meta(meta)
    stats: dict[str, Any] = {"resumed": len(done), "new_trials": 0, "space_points": n}
    t0 = time.perf_counter()
    interrupted = threading.Event()
    if todo:
        import ray
        from ray import tune

        from .tasks import wait_for_cpus

        graphs: dict[str, Any] = {m: None for m in models}
        policy_state = None
        if target == "mcm":
            from .mcm_trial import load_policy, mcm_graph

            graphs = {m: mcm_graph(m, seq) for m in models}
            if opts["placer"] == "ppo-pretrained":
                policy_state = load_policy(policy)
        connect(address, num_cpus=None)
        wait_for_cpus(600.0)
        if searcher in ("grid", "random"):
            alg = _list_searcher(todo)
        else:
            told = [{**d, "point": points[d["space_index"]]} for d in designs]
            alg = _optuna_searcher(searcher, content, seed, told)
        cpus = int(ray.cluster_resources().get("CPU", 1))
        limit = max(1, min(workers or cpus, cpus, len(todo)))
        alg = tune.search.ConcurrencyLimiter(alg, max_concurrent=limit)
        prog = _Progress(len(todo)) if progress else None
        sink = _Sink(store, meta, prog, on_evaluated, target, points, searcher)
        stop_when = _Either(cancel, interrupted)
        trainable = tune.with_resources(
            tune.with_parameters(codesign_trainable, target=target, space=content, graphs=graphs, opts=opts,
                                 policy_state=policy_state, faults=os.environ.get(FAULT_ENV, ""),
                                 out_dir=str(out)), {"cpu": 1})
        single = searcher != "pareto"
        tuner = tune.Tuner(trainable, param_space={}, tune_config=tune.TuneConfig(
            search_alg=alg, metric=OBJECTIVE if single else None, mode="max" if single else None,
            num_samples=-1 if searcher in ("grid", "random") else len(todo), reuse_actors=True),
            run_config=tune.RunConfig(name=f"trials-{int(time.time())}", storage_path=str(out / "tune"),
                                      verbose=0, callbacks=[_store_callback(sink)],
                                      stop=_cancel_stopper(stop_when),
                                      failure_config=tune.FailureConfig(max_failures=max_failures)))
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
        try:
            with _sigint_stops(interrupted), _env(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1"):
                stats["new_trials"] = len(tuner.fit())
        finally:
            if prog:
                prog.close()
            for obj in (stop_when, sink):
                _DRIVER_OBJECTS.pop(f"{os.getpid()}-{id(obj)}", None)
            stats["cancelled"] = bool(cancel is not None and cancel.is_set())
            stats["trial_errors"] = sink.errors
            best = store.close(meta)
        if interrupted.is_set():
            raise SearchInterrupted(f"interrupted after {len(store)} rows; resume with --resume")
    else:
        best = store.close(meta)
    stats["wall_s"] = time.perf_counter() - t0
    if report and len(store):
        write_report(out)
    return {**best, "out_dir": str(out), "stats": stats}


class _Sink:
    """In the driver: every reported hardware point into the store (and best.json); a trial that failed
    for good as failed rows."""

    def __init__(self, store, meta, progress, hook, target, points, searcher) -> None:
        self.store, self.meta, self.progress, self.hook = store, meta, progress, hook
        self.target, self.points, self.searcher, self.errors = target, points, searcher, 0

    def result(self, result: dict[str, Any]) -> None:
        rows = json.loads(result.pop("rows_json", None) or "[]")
        if not rows:
            return
        self.store.add(rows, self.searcher)
        self.store.write_best(self.meta)
        tp = float(np.mean([r["throughput"] for r in rows]))
        if self.progress:
            self.progress.update(tp)
        if self.hook is not None:
            self.hook({"space_index": rows[0]["space_index"], "arch_key": rows[0]["arch_key"],
                       "arch_label": rows[0]["arch_label"], "throughput_avg": tp,
                       "cost_usd": rows[0]["cost_usd"],
                       "status": "ok" if all(r["status"] == "ok" for r in rows) else "infeasible"})

    def error(self, trial) -> None:
        from .search import _error_text

        self.errors += 1
        cfg = trial.config or {}
        index = int(cfg["index"]) if "index" in cfg else _index({"axes": _axes(self.points)}, cfg)
        key, label = point_key(self.target, self.points[index])
        lines = _error_text(trial).strip().splitlines()
        last = lines[-1] if lines else "evaluation failed"
        msg = next((ln for ln in reversed(lines) if "rror" in ln), last)
        rows = [{"arch_key": key, "arch_label": label, "space_index": index, "model": m, "status": "failed",
                 "error": msg.strip()[:500], "throughput": 0.0, "cost_usd": math.nan,
                 "trial_id": trial.trial_id, "finished_at": time.time()} for m in self.meta["models"]]
        self.store.add(rows, self.searcher)
        if self.progress:
            self.progress.update(None, failed=True)
        self.store.write_best(self.meta)


def _axes(points: list[dict[str, Any]]) -> dict[str, list]:
    names = list(points[0])
    return {a: list(dict.fromkeys(p[a] for p in points)) for a in names}
