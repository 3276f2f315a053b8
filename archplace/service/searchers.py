"""Ask/tell for one study: the searchers of ``archplace search`` (``phaze``, ``optuna`` TPE, ``random``,
``grid``), driven by trial numbers and kept as a cache of the study's trial rows.

A ``StudySearcher`` is never the truth: a replica builds it from the rows and brings it up to date with
what others wrote since it last looked (``studies.StudyService._sync``). It works on the same numbers
as the Tune searchers of ``archplace search`` (the same enumeration, Phaze's generator, the same
random permutation and grid order, Optuna's seeded TPE with the reference architecture first), but
holds only what a service needs, as numpy arrays:

* the feasible space, enumerated afresh (never from ``enumerate_space``'s process-wide cache, which
  would keep a deleted study's arrays alive) with 32-bit integer columns;
* for ``random`` and ``grid`` their order as one int32 array and a cursor; for ``phaze`` the
  generator (areas and bucket numbers); for ``optuna`` its in-memory study (per trial, not per
  architecture) and, once it is first asked, the int8 log2 exponents of the five fields;
* per *trial*, never per architecture: which trial holds which architecture and the told values.

Proposals are made outside the database's write lock: ``propose`` returns an architecture no trial
it knows of holds; the caller then reserves it in a transaction and calls ``commit`` (it became trial
N) or ``retract`` (another replica took it meanwhile, or it was not needed). ``release`` gives an
architecture back to the pool (a PENDING trial whose lease expired): it is proposed again before
anything new.

Errors: INFEASIBLE, FAILED and (client-)ABANDONED trials tell an error, never a number. Phaze counts
it as 0 throughput (the paper's meaning of an architecture with no feasible placement), Optuna marks
its trial FAIL and leaves it out of TPE's model, random and grid ignore it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np
import sqlalchemy as sa

from ..algorithms.search.phaze import PhazeGenerator
from ..algorithms.search.tune_searchers import nearest_index, optuna_space, reference_fields
from ..hardware.space import ARCH_FIELDS, ArchSpace, _enumerate, load_space_config
from .db import studies
from .fifo_lock import FifoLock


def study_space(config: dict[str, Any]) -> dict[str, Any] | None:
    """The study's search space as content: its ``space`` (default Phaze Table 1) with the area
    constraint folded in; None for the packaged space unchanged."""
    space, amax = config.get("space"), config.get("max_area_mm2")
    if amax is None:
        return space
    cfg = dict(load_space_config(space))
    cfg["constraints"] = {**(cfg.get("constraints") or {}), "area_max_mm2": float(amax)}
    return cfg


def build_space(spec: dict[str, Any] | None) -> ArchSpace:
    """The feasible architectures of ``spec``, enumerated for this study alone (freed with it), the
    integer columns narrowed to int32 where they fit (core and PE counts under an area budget do)."""
    space = _enumerate(load_space_config(spec))
    narrow = {}
    for f in ("num_tc", "num_vc", "pe_x", "pe_y"):
        col = getattr(space, f)
        narrow[f] = col.astype(np.int32) if len(col) and int(col.max()) < 2**31 else col
    return dataclasses.replace(space, **narrow)


class MCMStudySpace:
    """A ``target: mcm`` study's space (``platform/mcm_trial.py``): the packages of its axes, in their
    product order, built point by point (nothing enumerated). A trial's params are the package's axis
    values, its label, cost and areas (``hardware/chiplet_cost.py``)."""

    def __init__(self, spec: dict[str, Any] | None) -> None:
        from ..platform.mcm_trial import load_space, space_size

        self.spec = load_space(spec)
        self.n = space_size(self.spec)

    def __len__(self) -> int:
        return self.n

    def axis_params(self, index: int) -> dict[str, str]:
        """The point as Optuna's categorical parameters (strings)."""
        from ..platform.mcm_trial import point

        return {a: str(v) for a, v in point(self.spec, index).items()}

    def params(self, index: int) -> dict[str, Any]:
        from ..hardware.chiplet_cost import CostParams, package_cost
        from ..platform.mcm_trial import MCMDesign, point

        p = point(self.spec, index)
        d = MCMDesign.from_config(p)
        pc = package_cost(d.num_chiplets, d.pe, d.sram_mb, d.link_gbs, d.topology,
                          CostParams.from_dict(self.spec["cost"]))
        return {**p, "label": d.label(), "package_usd": pc.package_usd,
                "chiplet_area_mm2": pc.chiplet_area_mm2, "silicon_area_mm2": pc.silicon_area_mm2}


def arch_params(space: ArchSpace | MCMStudySpace, index: int) -> dict[str, Any]:
    if isinstance(space, MCMStudySpace):
        return space.params(index)
    acc = space.accelerator(index)
    return {
        **reference_fields(space, index),
        "pe_vc": int(acc.pe_vc),
        "area_mm2": float(space.area_mm2[index]),
        "label": acc.label(),
    }


class StudySearcher:
    def __init__(self, config: dict[str, Any], lane: tuple[int, int] = (0, 1)) -> None:
        self.mcm = config.get("target") == "mcm"
        self.space_spec = config.get("space") if self.mcm else study_space(config)
        self.space = MCMStudySpace(self.space_spec) if self.mcm else build_space(self.space_spec)
        self.name = config.get("searcher", "phaze")
        self.maximize = config["objectives"][0]["goal"] == "maximize"
        self.seq = 0  # the study's sequence number this cache has seen
        self.known: set[int] = set()  # trial numbers created (here or elsewhere) it has been told of
        self.told: set[int] = set()  # trial numbers whose result it has been told
        self.holder: dict[int, int] = {}  # architecture index -> the trial number holding it
        self.values: dict[int, float | None] = {}  # architecture index -> told value (None: error)
        self._requeue: list[int] = []  # released architectures, proposed first
        self._retracted: list[int] = []  # proposals not reserved, proposed next
        # proposed, neither committed nor retracted yet: never proposed twice (an index can sit in both
        # queues, retracted once and released later by the trial that took it meanwhile)
        self._proposed: set[int] = set()
        n = len(self.space)
        self.generator = self.order = self._study = None
        self._cursor = 0
        # (rank, replicas): replica ``rank`` of ``replicas`` proposes its own lane of the random or grid
        # order first (positions rank, rank + replicas, ...), then whatever is left of the whole order,
        # and seeds TPE with seed + rank, so replicas sharing a study rarely propose the same
        # architecture (each clash costs a retry). One replica: (0, 1), exactly the order as before.
        replicas = max(int(lane[1]), 1)
        self.lane = (int(lane[0]) % replicas, replicas)
        self._pass2 = 0  # the cursor over the whole order once the lane is done
        self._live: dict[int, Any] = {}  # optuna: architecture index -> its asked, untold trial
        self._exp: np.ndarray | None = None
        if self.mcm and self.name == "phaze":
            raise ValueError("target mcm: searcher must be random, grid or optuna")
        if self.name == "phaze":
            h, bucket = int(config.get("hysteresis", 6)), float(config.get("area_bucket_mm2", 0.01))
            self.generator = PhazeGenerator(self.space.area_mm2, h, bucket)
        elif self.name == "random":  # as RandomSearcher: the reference first, then a seeded permutation
            rng = np.random.default_rng(int(config.get("seed", 0)))
            self.order = np.r_[0, 1 + rng.permutation(n - 1)].astype(np.int32)
        elif self.name == "grid" and self.mcm:  # the axes' product order (archplace search's grid strides it)
            self.order = np.arange(n, dtype=np.int32)
        elif self.name == "grid":  # as GridSearcher: the reference, then the grid's lexicographic order
            s = self.space
            lex = np.lexsort((s.glb_mb, s.pe_y, s.pe_x, s.num_vc, s.num_tc))
            self.order = np.r_[0, lex[lex != 0]].astype(np.int32)
        elif self.name == "optuna":
            self._setup_optuna(int(config.get("seed", 0)) + self.lane[0])  # rank 0 alone: the seed itself
        else:
            raise ValueError(f"searcher {self.name!r} unknown; allowed: phaze, optuna, random, grid")

    @property
    def points(self) -> int:
        return len(self.space)

    # ------------------------------------------------------------------ optuna
    def _setup_optuna(self, seed: int) -> None:
        """As ``ArchOptunaSearch`` in ``archplace search``: seeded TPE over the axis values, the
        reference architecture enqueued as the first point."""
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if self.mcm:  # categorical over each axis's values (as archplace search --target mcm)
            axes = self.space.spec["axes"]
            self._dists = {a: optuna.distributions.CategoricalDistribution([str(v) for v in axes[a]])
                           for a in axes}
        else:
            self._dists = optuna_space(self.space_spec)
        self._study = optuna.create_study(
            direction="maximize" if self.maximize else "minimize",
            sampler=optuna.samplers.TPESampler(seed=seed),
        )
        if not self.mcm:
            self._study.enqueue_trial(reference_fields(self.space, 0))

    def _fields(self, index: int) -> dict[str, Any]:
        return self.space.axis_params(index) if self.mcm else reference_fields(self.space, index)

    def _nearest(self, params: dict[str, Any]) -> int:
        """``nearest_index`` without its N x 5 float64 temporaries: every axis value of a schema-checked
        space is a power of two, so the log2 distances are integers over int8 exponents. An mcm study's
        params are exactly one point's."""
        if self.mcm:
            from ..platform.mcm_trial import index_of

            return index_of(self.space.spec, params)
        if self._exp is None:
            cols = [np.log2(np.asarray(getattr(self.space, f), dtype=np.float64)) for f in ARCH_FIELDS]
            if not all(np.array_equal(c, np.round(c)) and c.min() >= 0 and c.max() < 127 for c in cols):
                return nearest_index(self.space, params)  # not powers of two: the general rule
            self._exp = np.stack([c.astype(np.int8) for c in cols], axis=1)
        want = [float(np.log2(float(params[f]))) for f in ARCH_FIELDS]
        if not all(w.is_integer() for w in want):
            return nearest_index(self.space, params)
        d = np.zeros(len(self._exp), dtype=np.int32)
        for k, w in enumerate(want):
            diff = self._exp[:, k].astype(np.int32) - int(w)
            d += diff * diff
        return int(np.argmin(d))  # first minimum: the lowest index, i.e. the largest area

    def _optuna_tell(self, trial: Any, value: float | None) -> None:
        from optuna.trial import TrialState

        if value is None:
            self._study.tell(trial, state=TrialState.FAIL)
        else:
            self._study.tell(trial, value)

    def _optuna_propose(self) -> int | None:
        for _ in range(200):
            trial = self._study.ask(fixed_distributions=self._dists)
            i = self._nearest(trial.params)
            if self._free(i):
                self._live[i] = trial
                return i
            # the categorical draw landed on an architecture already held: tell this draw its known
            # result (an error while it is pending) and draw again
            self._optuna_tell(trial, self.values.get(i))
        return None

    # ------------------------------------------------------------------ ask
    def propose(self) -> int | None:
        """An architecture no known trial holds (not yet reserved: ``commit`` or ``retract`` it), or
        None when the searcher suggests nothing more."""
        i = self._propose()
        if i is not None:
            self._proposed.add(i)
        return i

    def _free(self, i: int) -> bool:
        return i not in self.holder and i not in self._live and i not in self._proposed

    def _propose(self) -> int | None:
        for queue in (self._requeue, self._retracted):
            while queue:
                i = queue.pop(0)
                if self._free(i):
                    if self._study is not None:
                        self._live[i] = None  # proposed outside TPE: its result is added as a point
                    return i
        if self._study is not None:
            return self._optuna_propose()
        if self.generator is not None:
            while True:
                i = self.generator.next_index()
                if i is None or self._free(i):
                    return i
        rank, replicas = self.lane
        n = len(self.order)
        while rank + self._cursor * replicas < n:  # the lane (all of the order for one replica)
            i = int(self.order[rank + self._cursor * replicas])
            self._cursor += 1
            if self._free(i):
                return i
        while replicas > 1 and self._pass2 < n:  # then the other lanes' leftovers
            i = int(self.order[self._pass2])
            self._pass2 += 1
            if self._free(i):
                return i
        return None

    def commit(self, number: int, index: int) -> None:
        """The proposal ``index`` was reserved as trial ``number``."""
        self._proposed.discard(index)
        self.known.add(number)
        self.holder[index] = number

    def retract(self, index: int) -> None:
        """The proposal ``index`` was not reserved: propose it again later unless a trial holds it."""
        self._proposed.discard(index)
        trial = self._live.pop(index, None)
        if trial is not None:
            self._optuna_tell(trial, None)  # TPE forgets a FAIL; the architecture comes back below
        self._retracted.insert(0, index)

    # ------------------------------------------------------------------ replay
    def mark(self, number: int, index: int) -> None:
        """A trial created elsewhere (another replica, or before this cache was built)."""
        if number in self.known:
            return
        self.known.add(number)
        self.holder[index] = number

    def tell(self, number: int, index: int, state: str, value: float | None) -> None:
        if number in self.told:
            return
        self.told.add(number)
        self.known.add(number)
        self.holder[index] = number
        v = value if state == "COMPLETED" and value is not None else None
        self.values[index] = v
        if self.generator is not None:
            self.generator.observe(index, 0.0 if v is None else float(v))
        elif self._study is not None:
            trial = self._live.pop(index, None)
            if trial is not None:
                self._optuna_tell(trial, v)
            else:
                import optuna
                from optuna.trial import TrialState

                self._study.add_trial(
                    optuna.trial.create_trial(
                        params=self._fields(index),
                        distributions=self._dists,
                        value=v,
                        state=TrialState.COMPLETE if v is not None else TrialState.FAIL,
                    )
                )

    def release(self, number: int, index: int) -> None:
        """Trial ``number``'s lease expired: its architecture goes back to the pool (proposed next)."""
        self.known.add(number)
        if self.holder.get(index) != number:
            return  # already released, or held by a later trial
        del self.holder[index]
        trial = self._live.pop(index, None)
        if trial is not None:
            self._optuna_tell(trial, None)
        self._requeue.append(index)

    @property
    def done_reason(self) -> str:
        if self.generator is not None and self.generator.converged:
            return "phaze: the hysteresis rule has converged"
        return "every architecture of the space has been suggested"


class Entry:
    """A replica's cache of one study: its searcher, built on first use, and the lock that keeps one
    thread at a time in it (first come, first served: see ``FifoLock``)."""

    def __init__(self, uid: str, points: int) -> None:
        self.uid, self.points = uid, points
        self.lock = FifoLock()
        self.searcher: StudySearcher | None = None
        self._config: tuple[str, dict] | None = None   # (config_json, parsed): parsed once per study
        # proposals made ahead of the requests that take them (StudyService's pool): proposed in the
        # searcher, neither reserved nor retracted yet
        self.pool: list[int] = []
        self.refill_queued = False
        self.where: tuple[str, str] | None = None       # (owner, name), for the refill

    def config(self, text: str) -> dict:
        """The study's configuration, parsed once (a study's config never changes; the text checks it)."""
        got = self._config
        if got is None or got[0] != text:
            got = self._config = (text, json.loads(text))
        return got[1]


class SearcherCache:
    """A replica's searchers by study uid (a study deleted and created again has a new one), at most
    ``max_points`` architectures in all (least recently used out first: a searcher is rebuilt from
    the rows when needed again). Nothing else holds a searcher between requests, so dropping an
    entry frees its arrays."""

    def __init__(self, max_points: int, sweep_s: float) -> None:
        self.max_points, self.sweep_s = max_points, sweep_s
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._guard = threading.Lock()
        self._swept = 0.0

    def entry(self, row) -> Entry:
        """The entry of the study in ``row`` (a mapping with ``uid`` and ``space_size``)."""
        with self._guard:
            e = self._entries.get(row["uid"])
            if e is None:
                e = self._entries[row["uid"]] = Entry(row["uid"], row["space_size"])
            self._entries.move_to_end(row["uid"])
            total = sum(x.points for x in self._entries.values())
            for uid in list(self._entries):
                if total <= self.max_points or uid == row["uid"]:
                    break
                total -= self._entries.pop(uid).points
        return e

    def get(self, uid: str | None) -> Entry | None:
        """The cached entry of study ``uid``, or None (never created here, evicted or swept)."""
        with self._guard:
            return self._entries.get(uid) if uid is not None else None

    def drop(self, uid: str) -> None:
        with self._guard:
            self._entries.pop(uid, None)

    def uids(self) -> list[str]:
        with self._guard:
            return list(self._entries)

    def sweep(self, conn: sa.Connection) -> None:
        """Drop the entries of studies deleted through another replica (at most every ``sweep_s``)."""
        now = time.monotonic()
        if now - self._swept < self.sweep_s:
            return
        self._swept = now
        cached = self.uids()
        if cached:
            alive = set(conn.execute(sa.select(studies.c.uid).where(studies.c.uid.in_(cached))).scalars())
            for uid in set(cached) - alive:
                self.drop(uid)
