"""Architecture searchers as Ray Tune ``Searcher`` objects: Phaze (spec ``phaze.md`` §1.3, §2.4),
random, grid, and Optuna's TPE.

Trial configs (the platform's trainable relies on this):

* ``PhazeSearcher``, ``RandomSearcher`` and ``GridSearcher`` suggest ``{"arch": i}``, an index into
  ``enumerate_space(space_path)`` (feasible architectures, largest area first; index 0 is the reference
  architecture, TPUv4 for the packaged space). Every searcher suggests index 0 first.
* Optuna suggests the five fields ``num_tc, num_vc, pe_x, pe_y, glb_mb`` drawn (categorically) from the
  YAML axis values; ``nearest_index(space, config)`` maps such a config to a feasible architecture.

Metric and mode are normally left ``None`` at construction and set by Tune through
``set_search_properties`` (``TuneConfig(metric=..., mode=...)``). Note that Tune only calls it when the
``param_space`` is non-empty; ``suggest`` raises if the metric or mode is still unset. A failed trial
(``error=True``, no result, or a non-finite metric) counts as 0.0.
"""

from __future__ import annotations

import logging
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.search.optuna import OptunaSearch

from archplace.hardware.space import (
    ARCH_FIELDS,
    ArchSpace,
    SpaceSpec,
    _values,
    enumerate_space,
    load_space_config,
)

from .phaze import PhazeGenerator

__all__ = ["SEARCHERS", "GridSearcher", "PhazeSearcher", "RandomSearcher", "ArchOptunaSearch",
           "make_searcher", "nearest_index", "optuna_space", "reference_fields"]

logger = logging.getLogger(__name__)

SEARCHERS = ("phaze", "optuna", "random", "grid")


# ------------------------------------------------------------------------------------------------
# config <-> index


def _check_arch(space: ArchSpace, arch: Any) -> int:
    n = len(space)
    if isinstance(arch, bool) or not isinstance(arch, (int, np.integer)) or not 0 <= arch < n:
        raise ValueError(f"config field 'arch' must be an integer in [0, {n}), got {arch!r}")
    return int(arch)


def _field_values(config: Mapping[str, Any]) -> np.ndarray:
    missing = [f for f in ARCH_FIELDS if f not in config]
    if missing:
        raise ValueError(f"config field(s) {missing} missing; need 'arch' or all of {list(ARCH_FIELDS)}")
    out = np.empty(len(ARCH_FIELDS))
    for k, f in enumerate(ARCH_FIELDS):
        v = config[f]
        number = not isinstance(v, bool) and isinstance(v, (int, float, np.number))
        if not (number and math.isfinite(v) and v > 0):
            raise ValueError(f"config field {f!r} must be a positive finite number, got {v!r}")
        out[k] = float(v)
    return out


def _columns(space: ArchSpace) -> np.ndarray:
    return np.stack([np.asarray(getattr(space, f), dtype=np.float64) for f in ARCH_FIELDS], axis=1)


def nearest_index(space: ArchSpace, config: Mapping[str, Any]) -> int:
    """The feasible architecture of ``space`` that ``config`` stands for.

    ``{"arch": i}`` returns ``i`` (checked to be in range). Otherwise ``config`` must hold the five
    fields ``num_tc, num_vc, pe_x, pe_y, glb_mb``; the result is the feasible architecture nearest in
    Euclidean distance over their log2 values, ties going to the larger area (the lower index).
    Other keys of ``config`` are ignored.
    """
    if "arch" in config:
        return _check_arch(space, config["arch"])
    want = np.log2(_field_values(config))
    d = np.square(np.log2(_columns(space)) - want).sum(axis=1)
    return int(np.argmin(d))  # first minimum: the lowest index, i.e. the largest area


def _exact_index(space: ArchSpace, params: Mapping[str, Any]) -> int:
    """Index of an evaluated point: ``{"arch": i}`` or the five fields of a feasible architecture."""
    if "arch" in params:
        return _check_arch(space, params["arch"])
    i = nearest_index(space, params)
    if not np.array_equal(_columns(space)[i], _field_values(params)):
        shown = {f: params[f] for f in ARCH_FIELDS}
        raise ValueError(f"{shown} is not a feasible architecture of the space")
    return i


def _plain(v: float) -> int | float:
    return int(v) if float(v).is_integer() else float(v)


def reference_fields(space: ArchSpace, index: int = 0) -> dict[str, int | float]:
    """The five fields of architecture ``index`` (default the reference, index 0) as plain numbers."""
    return {f: _plain(getattr(space, f)[index]) for f in ARCH_FIELDS}


# ------------------------------------------------------------------------------------------------
# index-suggesting searchers


class _ArchSearcher(Searcher):
    """Common part: trial bookkeeping, result parsing, evaluated points, retries, save/restore.

    Batches: with ``archs_per_trial = N > 1`` a trial gets ``{"archs": [i1, ..., iN]}`` (the next N
    indices), so sweeps of 10^4+ cheap evaluations do not pay Tune's per-trial overhead 10^4 times.
    A trial may report several times; every result carries ``evaluated`` (a list of
    ``[index, value]``) and each index is observed as soon as its value arrives.

    Budget: at most ``budget`` indices are handed out (retries and ``retry_first`` not counted),
    so a search can run Tune with an open number of trials and still stop at its budget.

    Retries: an index whose trial failed before reporting it is handed out again (first, in a new
    trial) up to ``max_retries`` times; after that it is observed as 0.0 and listed in
    ``final_failures[trial_id]`` so the platform records it as failed. Retrying per index rather
    than per trial (Tune's ``FailureConfig``) means an index a failed batch had already reported is
    never evaluated twice.
    """

    def __init__(self, space_path: SpaceSpec = None, metric: str | None = None,
                 mode: str | None = None, archs_per_trial: int = 1, max_retries: int = 0,
                 retry_first: list[int] | None = None, budget: int | None = None):
        self._check_mode(mode)
        super().__init__(metric=metric, mode=mode)
        if isinstance(archs_per_trial, bool) or not isinstance(archs_per_trial, int) or archs_per_trial < 1:
            raise ValueError(f"archs_per_trial must be an integer >= 1, got {archs_per_trial!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        self.space_path = str(space_path) if isinstance(space_path, (str, Path)) else space_path
        self.space = enumerate_space(self.space_path)
        self.archs_per_trial = archs_per_trial
        self.max_retries = max_retries
        self._live: dict[str, list[int]] = {}   # trial id -> suggested indices
        self._reported: dict[str, set[int]] = {}
        self._results: dict[int, float] = {}    # index -> observed value (failures 0.0)
        self._attempts: dict[int, int] = {}     # index -> failed attempts so far
        self._retry: list[int] = [int(i) for i in (retry_first or [])]
        self.budget = budget          # new indices to hand out (retries not counted); None: no limit
        self._handed = 0
        self._inflight: set[int] = set()
        self.final_failures: dict[str, list[int]] = {}

    # --- hooks -------------------------------------------------------------------------------
    def _next_index(self) -> int | None:
        raise NotImplementedError

    def _observe(self, index: int, value: float) -> None:
        pass

    def _check_mode(self, mode: str | None) -> None:
        if mode is not None and mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")

    # --- Tune API ----------------------------------------------------------------------------
    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        self._check_mode(mode)
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        return True

    def _config(self, indices: list[int]) -> dict:
        return {"arch": indices[0]} if self.archs_per_trial == 1 else {"archs": list(indices)}

    def _take(self) -> int | None:
        while self._retry:
            i = self._retry.pop(0)
            if i not in self._results and i not in self._inflight:
                return i
        if self.budget is not None and self._handed >= self.budget:
            return None
        while True:
            i = self._next_index()
            if i is None:
                return None
            if i in self._inflight or i in self._results:
                continue   # a retried index the walk reaches again
            self._handed += 1
            return i

    def suggest(self, trial_id: str) -> dict | str | None:
        if not self._metric or not self._mode:
            raise RuntimeError(f"{type(self).__name__}: metric and mode are not set (metric="
                               f"{self._metric!r}, mode={self._mode!r}); set them in TuneConfig (with a "
                               f"non-empty param_space) or call set_search_properties")
        if trial_id in self._live:
            return self._config(self._live[trial_id])
        batch: list[int] = []
        while len(batch) < self.archs_per_trial:
            i = self._take()
            if i is None:
                break
            batch.append(i)
        if not batch:
            # with retries, a live trial that fails hands its indices out again: not finished yet
            return None if self._live and self.max_retries else Searcher.FINISHED
        self._live[trial_id] = batch
        self._inflight.update(batch)
        self._reported[trial_id] = set()
        return self._config(batch)

    def mark_suggested(self, trial_id: str, indices: list[int]) -> None:
        """Record a trial that was suggested elsewhere (another service replica, or this searcher's
        earlier life before a restart) so its indices are never handed out again; its completion
        then arrives through ``on_trial_complete`` as for a trial this searcher suggested."""
        batch = [_check_arch(self.space, i) for i in indices]
        if trial_id in self._live:
            return
        self._live[trial_id] = batch
        self._inflight.update(batch)
        self._reported[trial_id] = set()
        self._handed += len(batch)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        for i, v in self._pairs(trial_id, result):
            self._reported.setdefault(trial_id, set()).add(i)
            self._record(i, self._finite(v))

    def _pairs(self, trial_id: str, result: dict | None) -> list[tuple[int, Any]]:
        if not result:
            return []
        if "evaluated" in result:
            return [(int(i), v) for i, v in result["evaluated"]]
        live = self._live.get(trial_id)
        if live and len(live) == 1:
            return [(live[0], self._value(trial_id, result, False))]
        return []

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if trial_id not in self._live:
            logger.warning("%s: completion of unknown trial %s ignored", type(self).__name__, trial_id)
            return
        if not error:
            self.on_trial_result(trial_id, result or {})
        batch = self._live.pop(trial_id)
        done = self._reported.pop(trial_id, set())
        self._inflight.difference_update(batch)
        for i in batch:
            if i in done or i in self._results:
                continue
            self._attempts[i] = self._attempts.get(i, 0) + 1
            if error and self._attempts[i] <= self.max_retries:
                self._retry.append(i)   # handed out again, before any new index
            else:
                self.final_failures.setdefault(trial_id, []).append(i)
                self._record(i, 0.0)

    def add_evaluated_point(self, parameters: dict, value: float | None, error: bool = False,
                            pruned: bool = False, intermediate_values: list[float] | None = None) -> None:
        """Feed in an evaluation made elsewhere (e.g. a resumed search); it is never suggested again."""
        i = _exact_index(self.space, parameters)
        self._record(i, 0.0 if error or pruned else self._finite(value))

    # --- values ------------------------------------------------------------------------------
    @staticmethod
    def _finite(value: Any) -> float:
        try:
            v = float(value)
        except (TypeError, ValueError):
            return 0.0
        return v if math.isfinite(v) else 0.0

    def _value(self, trial_id: str, result: dict | None, error: bool) -> float:
        if error or not result:
            return 0.0
        if not self._metric:
            raise RuntimeError(f"{type(self).__name__}: metric is not set")
        if self._metric not in result:
            raise ValueError(f"result of trial {trial_id} has no metric {self._metric!r}; "
                             f"keys: {sorted(result)[:20]}")
        return self._finite(result[self._metric])

    def _record(self, index: int, value: float) -> None:
        self._results[index] = max(self._results.get(index, value), value)
        self._observe(index, value)

    @property
    def results(self) -> dict[int, float]:
        """Observed values by architecture index (failures 0.0), a copy."""
        return dict(self._results)

    @property
    def best_index(self) -> int | None:
        """Best observed index (ties: the lower index, i.e. the larger area)."""
        if not self._results:
            return None
        sign = -1.0 if self._mode == "min" else 1.0
        return min(self._results, key=lambda j: (-sign * self._results[j], j))

    @property
    def best_value(self) -> float | None:
        j = self.best_index
        return None if j is None else self._results[j]

    # --- state -------------------------------------------------------------------------------
    def get_state(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k != "space"}
        return pickle.loads(pickle.dumps(state))  # a deep copy

    def set_state(self, state: dict) -> None:
        if state.get("space_path", self.space_path) != self.space_path or not hasattr(self, "space"):
            self.space = enumerate_space(state.get("space_path"))
        self.__dict__.update(state)

    def save(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "wb") as fh:
            pickle.dump(self.get_state(), fh)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as fh:
            self.set_state(pickle.load(fh))


class PhazeSearcher(_ArchSearcher):
    """Phaze's pruned search: decreasing area from the reference (index 0), stopping by hysteresis.

    Suggests ``{"arch": i}`` for i = 0, 1, 2, ... (skipping indices fed in by ``add_evaluated_point``)
    and returns ``Searcher.FINISHED`` once ``PhazeGenerator`` has converged or every index has been
    suggested (see ``archplace.algorithms.search.phaze`` for the rule). Maximises the metric only.
    """

    def __init__(self, space_path: SpaceSpec = None, hysteresis: int = 6,
                 area_bucket_mm2: float = 0.01, metric: str | None = None, mode: str | None = None,
                 **batching: Any):
        super().__init__(space_path, metric, mode, **batching)
        self.generator = PhazeGenerator(self.space.area_mm2, hysteresis, area_bucket_mm2)

    def _check_mode(self, mode: str | None) -> None:
        if mode is not None and mode != "max":
            raise ValueError(f"PhazeSearcher maximises the metric (throughput); mode must be 'max', "
                             f"got {mode!r}")

    def _next_index(self) -> int | None:
        return self.generator.next_index()

    def _observe(self, index: int, value: float) -> None:
        self.generator.observe(index, value)

    @property
    def converged(self) -> bool:
        return self.generator.converged


class _OrderedSearcher(_ArchSearcher):
    """Walks a fixed permutation of the indices (index 0 first), skipping evaluated ones."""

    def _make_order(self) -> np.ndarray:
        raise NotImplementedError

    def __init__(self, space_path: SpaceSpec = None, metric: str | None = None,
                 mode: str | None = None, **batching: Any):
        super().__init__(space_path, metric, mode, **batching)
        self.order = self._make_order()
        self._cursor = 0

    def _next_index(self) -> int | None:
        while self._cursor < len(self.order) and int(self.order[self._cursor]) in self._results:
            self._cursor += 1
        if self._cursor >= len(self.order):
            return None
        i = int(self.order[self._cursor])
        self._cursor += 1
        return i


class RandomSearcher(_OrderedSearcher):
    """Uniform random sampling of the feasible architectures without replacement (index 0 first)."""

    def __init__(self, space_path: SpaceSpec = None, seed: int = 0, metric: str | None = None,
                 mode: str | None = None, **batching: Any):
        self.seed = seed
        super().__init__(space_path, metric, mode, **batching)

    def _make_order(self) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        return np.r_[0, 1 + rng.permutation(len(self.space) - 1)].astype(np.int64)


class GridSearcher(_OrderedSearcher):
    """Every feasible architecture, index 0 first, then the grid's lexicographic order of
    ``(num_tc, num_vc, pe_x, pe_y, glb_mb)`` (ascending)."""

    def _make_order(self) -> np.ndarray:
        s = self.space
        lex = np.lexsort((s.glb_mb, s.pe_y, s.pe_x, s.num_vc, s.num_tc))
        return np.r_[0, lex[lex != 0]].astype(np.int64)


# ------------------------------------------------------------------------------------------------
# Optuna


def optuna_space(space_path: SpaceSpec = None) -> dict[str, Any]:
    """Categorical Optuna distributions over the YAML axis values of the five fields."""
    from optuna.distributions import CategoricalDistribution

    arch = load_space_config(space_path)["architecture"]
    return {f: CategoricalDistribution([_plain(v) for v in _values(arch[f], f"architecture.{f}")])
            for f in ARCH_FIELDS}


class ArchOptunaSearch(OptunaSearch):
    """``OptunaSearch`` over a fixed space that still takes metric and mode from Tune.

    The stock ``OptunaSearch`` given a space at construction ignores ``set_search_properties`` (and so
    never learns the metric set in ``TuneConfig``); this one keeps the space aside and sets the study up
    when Tune hands it the metric and mode.
    """

    def __init__(self, space: dict[str, Any], points_to_evaluate: list[dict] | None = None,
                 sampler: Any = None, metric: str | None = None, mode: str | None = None):
        super().__init__(space=None, metric=metric, mode=mode, points_to_evaluate=points_to_evaluate,
                         sampler=sampler)
        self._arch_space = dict(space)
        self._pending_points: list[tuple] = []  # evaluated points fed in before the study exists
        if metric and mode:
            self._space = self._arch_space
            self._setup_study(mode)

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if self._ot_study is not None:  # already set up: accept only the same metric and mode
            return (not metric or metric == self._metric) and (not mode or mode == self._mode)
        if metric:
            self._metric = metric
        if mode:
            self._mode = mode
        self._space = self._arch_space
        # a warm-start point (the reference) already evaluated in a resumed search is not enqueued again
        done = [{f: float(p[f]) for f in ARCH_FIELDS} for p, *_ in self._pending_points
                if all(f in p for f in ARCH_FIELDS)]
        self._points_to_evaluate = [p for p in self._points_to_evaluate
                                    if {f: float(p[f]) for f in ARCH_FIELDS} not in done]
        self._setup_study(self._mode)
        pending, self._pending_points = self._pending_points, []
        for args in pending:
            self.add_evaluated_point(*args)
        return True

    def add_evaluated_point(self, parameters: dict, value: float | None, error: bool = False,
                            pruned: bool = False, intermediate_values: list[float] | None = None) -> None:
        """As ``OptunaSearch.add_evaluated_point``; points given before Tune has set the metric and mode
        (a resumed search feeds them in before ``Tuner.fit``) are kept and added once it has."""
        if self._ot_study is None or not self._metric or not self._mode:
            self._pending_points.append((dict(parameters), value, error, pruned, intermediate_values))
            return
        if not (error or pruned) and (value is None or not math.isfinite(float(value))):
            error = True  # Optuna refuses NaN values: record the point as failed
        super().add_evaluated_point(parameters, value, error, pruned, intermediate_values)


# ------------------------------------------------------------------------------------------------


def make_searcher(name: str, space_path: SpaceSpec = None, seed: int = 0, hysteresis: int = 6,
                  area_bucket_mm2: float = 0.01, max_concurrent: int = 1, archs_per_trial: int = 1,
                  max_retries: int = 0, retry_first: list[int] | None = None,
                  budget: int | None = None) -> Searcher:
    """A Tune searcher by name: ``phaze``, ``optuna``, ``random`` or ``grid``.

    Metric and mode are left for ``TuneConfig``. Optuna (TPE, seeded) suggests one architecture per
    trial (``archs_per_trial`` must be 1; Tune's own ``FailureConfig`` retries its trials) and is
    wrapped in a ``ConcurrencyLimiter`` when ``max_concurrent > 1``; the index searchers batch
    ``archs_per_trial`` indices per trial and retry failed indices themselves (``max_retries``),
    ``retry_first`` before anything new; their concurrency is left to the platform's limiter.
    """
    if name not in SEARCHERS:
        raise ValueError(f"searcher {name!r} unknown; allowed: {list(SEARCHERS)}")
    if isinstance(max_concurrent, bool) or not isinstance(max_concurrent, int) or max_concurrent < 1:
        raise ValueError(f"max_concurrent must be an integer >= 1, got {max_concurrent!r}")
    batching = {"archs_per_trial": archs_per_trial, "max_retries": max_retries, "retry_first": retry_first,
                "budget": budget}
    if name == "phaze":
        return PhazeSearcher(space_path, hysteresis=hysteresis, area_bucket_mm2=area_bucket_mm2, **batching)
    if name == "random":
        return RandomSearcher(space_path, seed=seed, **batching)
    if name == "grid":
        return GridSearcher(space_path, **batching)
    if archs_per_trial != 1:
        raise ValueError(f"--archs-per-trial {archs_per_trial}: the optuna searcher suggests one "
                         "architecture per trial; use phaze, random or grid for batched trials")
    import optuna

    ref = reference_fields(enumerate_space(space_path))
    searcher: Searcher = ArchOptunaSearch(space=optuna_space(space_path), points_to_evaluate=[ref],
                                          sampler=optuna.samplers.TPESampler(seed=seed))
    if max_concurrent > 1:
        searcher = ConcurrencyLimiter(searcher, max_concurrent=max_concurrent)
    return searcher
