"""Ask/tell over the platform's Tune searchers, for one study.

A ``StudySearcher`` is a cache, never the truth: it is rebuilt from the study's trial rows whenever a
replica starts or finds that others wrote to the study since it last looked (``catch_up``). The
searchers are the ones ``archplace search`` uses (``phaze``, ``optuna`` TPE, ``random``, ``grid``),
driven here by trial numbers instead of Tune trials:

* a COMPLETED trial tells its first objective's value;
* INFEASIBLE, FAILED and ABANDONED trials tell an error, never a number. What a searcher makes of an
  error is its own rule: Phaze's hysteresis counts it as 0 throughput (the paper's meaning of an
  architecture with no feasible placement), Optuna marks the trial FAIL and leaves it out of TPE's
  model, random and grid ignore it. The database keeps the state and reason, and no value.
"""

from __future__ import annotations

from typing import Any

from ..algorithms.search.tune_searchers import (
    ArchOptunaSearch,
    make_searcher,
    nearest_index,
    reference_fields,
)
from ..hardware.space import enumerate_space, load_space_config

METRIC = "objective"


def study_space(config: dict[str, Any]) -> dict[str, Any] | None:
    """The study's search space as content: its ``space`` (default Phaze Table 1) with the area
    constraint folded in; None for the packaged space unchanged."""
    space, amax = config.get("space"), config.get("max_area_mm2")
    if amax is None:
        return space
    cfg = dict(load_space_config(space))
    cfg["constraints"] = {**(cfg.get("constraints") or {}), "area_max_mm2": float(amax)}
    return cfg


def arch_params(space, index: int) -> dict[str, Any]:
    acc = space.accelerator(index)
    return {
        **reference_fields(space, index),
        "pe_vc": int(acc.pe_vc),
        "area_mm2": float(space.area_mm2[index]),
        "label": acc.label(),
    }


class StudySearcher:
    def __init__(self, config: dict[str, Any]) -> None:
        self.space_spec = study_space(config)
        self.space = enumerate_space(self.space_spec)
        self.name = config.get("searcher", "phaze")
        self.mode = "max" if config["objectives"][0]["goal"] == "maximize" else "min"
        self.searcher = make_searcher(
            self.name,
            self.space_spec,
            seed=int(config.get("seed", 0)),
            hysteresis=int(config.get("hysteresis", 6)),
            area_bucket_mm2=float(config.get("area_bucket_mm2", 0.01)),
        )
        self.searcher.set_search_properties(METRIC, self.mode, {"arch": 0})
        self.optuna = isinstance(self.searcher, ArchOptunaSearch)
        self.seq = 0  # the study's sequence number this cache has seen
        self.known: set[int] = set()  # trial numbers it has been told about
        self.used: dict[int, float | None] = {}  # architecture index -> told value (None: pending/error)
        self._dups = 0

    # ------------------------------------------------------------------ ask
    def ask(self, number: int) -> int | None:
        """The next architecture index for trial ``number``, or None when the searcher is done."""
        for _ in range(200):
            cfg = self.searcher.suggest(f"t{number}")
            if cfg is None or cfg == "FINISHED" or not isinstance(cfg, dict):
                return None
            i = nearest_index(self.space, cfg)
            if i not in self.used:
                self.used[i] = None
                self.known.add(number)
                return i
            # Optuna's categorical draw can land on an architecture already tried: tell it the known
            # result under a throw-away id and draw again
            self._dups += 1
            tid = f"dup{self._dups}"
            trials = self.searcher._ot_trials  # OptunaSearch's trial id -> optuna trial
            trials[tid] = trials.pop(f"t{number}")
            v = self.used[i]
            self.searcher.on_trial_complete(tid, {METRIC: v} if v is not None else None, error=v is None)
        return None

    # ------------------------------------------------------------------ replay
    def mark(self, number: int, index: int) -> None:
        """A trial created elsewhere (another replica, or before a restart)."""
        if number in self.known:
            return
        self.known.add(number)
        self.used.setdefault(index, None)
        if not self.optuna:
            self.searcher.mark_suggested(f"t{number}", [index])

    def tell(self, number: int, index: int, state: str, value: float | None) -> None:
        ok = state == "COMPLETED" and value is not None
        self.used[index] = value if ok else None
        tid = f"t{number}"
        if self.optuna:
            live = tid in self.searcher._ot_trials and tid not in self.searcher._completed_trials
        else:
            live = tid in self.searcher._live
        if live:
            self.searcher.on_trial_complete(tid, {METRIC: value} if ok else None, error=not ok)
        else:
            params = reference_fields(self.space, index) if self.optuna else {"arch": index}
            self.searcher.add_evaluated_point(params, value if ok else None, error=not ok)

    @property
    def done_reason(self) -> str:
        if self.name == "phaze" and getattr(self.searcher, "converged", False):
            return "phaze: the hysteresis rule has converged"
        return "every architecture of the space has been suggested"
