"""The architecture × placement co-search on Ray Tune (``archplace search``)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..algorithms.solvers.grad_sync import SYNC_MODELS
from ..simulators.collectives import GRAD_REDUCE_DTYPES as _GRAD_DTYPE_BYTES
from ..workloads.layers import OPTIMIZERS
from ._common import (
    ExtraResult,
    ProgressFn,
    Request,
    Steps,
    check_bool,
    check_capture_blocks,
    check_choice,
    check_int,
    check_optional_str,
    check_positive_number,
    invalid,
    is_int,
    is_number,
)
from .codesign import CodesignResult

RECOMPUTE = {"both": (False, True), "stash": (False,), "recompute": (True,)}
SCHEDULES = ("ilp", "sequential")


@dataclass(frozen=True)
class SearchRequest(Request):
    models: tuple[str, ...]                 # model presets; one trial evaluates all of them
    out_dir: str | None = None              # result directory (None: runs/search-TIMESTAMP)
    accelerators: int = 1024
    global_batch: int = 4096
    searcher: str = "phaze"                 # phaze, optuna, random, grid
    budget: int = 16                        # most architectures to evaluate
    address: str | None = None              # Ray cluster: "auto" or HOST:PORT (None: embedded local Ray)
    resume: bool = False                    # continue the search in out_dir
    retry_failed: bool = False              # with resume: evaluate failed architectures again
    workers: int | None = None              # most trials in flight (None: the cluster's CPUs)
    archs_per_trial: int = 1
    schedule: str = "ilp"                   # ilp, or sequential (no ILP: fast screening)
    schedule_cache: str | None = None       # solved layer slices file (None: OUT/schedule_cache.jsonl)
    wait_timeout_s: float = 600.0           # for the cluster's first CPU and the model graphs
    microbatches: tuple[int, ...] = (1, 2, 4, 8)
    hbm_gb: tuple[float, ...] = (32.0, 64.0, 80.0)
    recompute: str = "both"                 # both, stash, recompute
    seq: int | None = None
    tmp_widths: tuple[int, ...] | None = None   # TMP widths for every model (None: each model's own)
    # per layer slice: the work budget in deterministic seconds (decides the answer) and the wall-clock
    # safety limit (platform.settings.SEARCH_ILP_BUDGET / SEARCH_ILP_TIME_LIMIT_S; a test keeps them equal)
    ilp_budget: float = 1.0
    ilp_time_limit_s: float = 300.0
    # False: the paper's model (concurrently running ops each get the full HBM/GLB bandwidth)
    contention: bool = True
    optimizer: str = "adam"                 # sgd, adam, adafactor: optimizer state in the HBM fit
    sync_model: str = "exposed"             # gradient sync: "exposed" (1F1B) or "paper" (eq. 18)
    grad_reduce_dtype: str = "bf16"         # the gradients' dtype: their memory and AllReduce bytes
    space: str | dict | None = None         # search-space YAML path or its content (None: Phaze Table 1)
    hysteresis: int = 6
    area_bucket_mm2: float = 0.01           # Phaze area bucket (0: exact areas)
    seed: int = 0
    max_failures: int = 2                   # retries of an architecture whose evaluation failed
    capture_blocks: int = 3                 # leading blocks captured per stack (more where kinds need)
    screen_top_k: int | None = None         # searcher screen: ILP + DP on the top k per objective (None: 32)
    screen_prune: bool = False              # searcher screen: skip the architectures whose proven bound
    #                                         cannot reach any top k (platform/screen_bound.py; same top k)
    # co-design targets (api/codesign.py): "accelerator" is the Phaze search above; "mcm" and "gpu-cluster"
    # search chiplet packages / GPU cluster shapes (their searcher "phaze" means their default, "pareto")
    target: str = "accelerator"
    placer: str = "greedy+lns"              # mcm: greedy, greedy+lns, cpsat, ppo-pretrained, ppo-lns
    subsolves: int = 16                     # mcm: CP-SAT sub-solves per model and design (cpsat: as work)
    det_time: float = 0.25                  # mcm: CP-SAT deterministic units per sub-solve
    finetune_subsolves: int = 0             # mcm ppo-pretrained: PPO fine-tune first (0: zero-shot)
    policy: str | None = None               # mcm ppo-*: weights (default tune_configs/mcm_large_policy.npz)

    def settings(self):
        """The ``SearchSettings`` that define the search's results. A ``space`` file that is not valid
        YAML is a one-line error naming the field and the file (the YAML parser's own error is a
        multi-line traceback)."""
        from ..platform.settings import SearchSettings

        return SearchSettings(
            models=tuple(self.models), num_devices=self.accelerators, global_batch=self.global_batch,
            microbatches=self.microbatches, hbm_gb=self.hbm_gb, recompute=RECOMPUTE[self.recompute],
            seq=self.seq, ilp_budget=self.ilp_budget, ilp_time_limit_s=self.ilp_time_limit_s,
            contention=self.contention, optimizer=self.optimizer, sync_model=self.sync_model,
            grad_reduce_dtype=self.grad_reduce_dtype, space=self._space_config(), schedule=self.schedule,
            tmp_widths={m: self.tmp_widths for m in self.models} if self.tmp_widths else {},
            capture_blocks=self.capture_blocks)

    def _space_config(self) -> dict | None:
        import yaml

        from ..hardware.space import load_space_config

        if self.space is None:
            return None
        try:
            return load_space_config(self.space)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f", line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            what = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
            raise invalid("space", f"{self.space}: not valid YAML ({what}{where})") from None

    def validate(self) -> None:
        """The shapes checked here, the rest by ``archplace.platform.search.validate`` (its messages
        name the CLI flags)."""
        from ..platform.search import validate as validate_search

        if self.target != "accelerator":
            from .codesign import validate_codesign

            return validate_codesign(self)
        if not (isinstance(self.models, tuple) and all(isinstance(m, str) for m in self.models)):
            raise invalid("models", f"must be a list of model preset names, got {self.models!r}")
        check_optional_str("out_dir", self.out_dir)
        for name in ("accelerators", "global_batch", "archs_per_trial", "hysteresis"):
            check_int(name, getattr(self, name))
        check_int("workers", self.workers, optional=True)
        check_int("screen_top_k", self.screen_top_k, optional=True)
        if self.screen_top_k is not None and self.searcher != "screen":
            raise invalid("screen_top_k", f"applies to the screen searcher only, not {self.searcher!r}")
        check_bool("screen_prune", self.screen_prune)
        if self.screen_prune and self.searcher != "screen":
            raise invalid("screen_prune", f"applies to the screen searcher only, not {self.searcher!r}")
        check_int("seq", self.seq, optional=True)
        check_int("seed", self.seed, low=0)
        check_int("max_failures", self.max_failures, low=0)
        check_int("capture_blocks", self.capture_blocks, low=3)
        for m in self.models:
            check_capture_blocks(m, self.capture_blocks)
        for name in ("resume", "retry_failed", "contention"):
            check_bool(name, getattr(self, name))
        check_optional_str("address", self.address)
        check_optional_str("schedule_cache", self.schedule_cache)
        check_choice("recompute", self.recompute, tuple(sorted(RECOMPUTE)))
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("sync_model", self.sync_model, SYNC_MODELS)
        check_choice("grad_reduce_dtype", self.grad_reduce_dtype, tuple(_GRAD_DTYPE_BYTES))
        for name in ("microbatches", "tmp_widths"):
            v = getattr(self, name)
            if not (v is None and name == "tmp_widths") and not (
                    isinstance(v, tuple) and v and all(is_int(x) and x >= 1 for x in v)):
                raise invalid(name, f"must be one or more positive integers, got {v!r}")
        if not (isinstance(self.hbm_gb, tuple) and self.hbm_gb and all(is_number(h) for h in self.hbm_gb)):
            raise invalid("hbm_gb", f"must be one or more positive sizes in GB, got {self.hbm_gb!r}")
        check_positive_number("ilp_time_limit_s", self.ilp_time_limit_s)
        check_positive_number("ilp_budget", self.ilp_budget)
        check_positive_number("wait_timeout_s", self.wait_timeout_s)
        if not (is_number(self.area_bucket_mm2) and self.area_bucket_mm2 >= 0):
            raise invalid("area_bucket_mm2", f"must be a number >= 0, got {self.area_bucket_mm2!r}")
        if not (self.space is None or isinstance(self.space, dict) or (isinstance(self.space, str)
                                                                        and self.space)):
            raise invalid("space", f"must be a search-space YAML path, its content as a dict, or None, "
                                   f"got {self.space!r}")
        if self.retry_failed and not self.resume:
            raise ValueError("--retry-failed re-runs the failed architectures of an earlier search: "
                             "pass --resume too")
        validate_search(self.settings(), self.searcher, self.budget, self.workers, self.archs_per_trial)


@dataclass
class SearchResult(ExtraResult):
    """``best.json``'s content (see README "the result directory") with the run's statistics."""

    models: list[str]
    num_devices: int
    global_batch: int
    searcher: str
    evaluated: int                       # architectures evaluated (resumed ones included)
    failed: int
    infeasible: int
    common: dict[str, Any] | None        # the best architecture across models (None: nothing feasible)
    per_model: dict[str, dict[str, Any]]  # the best architecture and placement per model
    reference: dict[str, Any] | None     # TPUv4 with the expert placement
    speedup_vs_reference: dict[str, float]
    out_dir: str
    stats: dict[str, Any]                # resumed, new_trials, cache, wall_s, ...
    extra: dict[str, Any] = field(default_factory=dict)  # keys a newer result store adds


def search(req: SearchRequest, *, progress: ProgressFn | None = None, cancel: threading.Event | None = None,
           terminal_progress: bool = False) -> SearchResult | CodesignResult:
    """Run (or resume) a search; writes ``out_dir`` (evaluations.parquet, best.json, report.md).

    Unlike the other calls, a search attaches to Ray itself, as ``archplace search`` does: through
    ``run_search`` to ``req.address`` (None: an embedded local Ray on 127.0.0.1, started unless Ray
    is already running in this process). Stages: ``start``, ``evaluated`` for every finished
    architecture (index, label, status, across-model throughput), ``done``. ``cancel.set()`` stops the
    search after the trials in flight; what finished is kept and ``stats["cancelled"]`` is true.
    ``terminal_progress``: ``run_search``'s own progress line on stderr (the CLI's, off by default).
    """
    from ..platform.screen import DEFAULT_TOP_K, run_screen
    from ..platform.search import run_search

    if req.target != "accelerator":
        from .codesign import codesign_search

        return codesign_search(req, progress=progress, cancel=cancel, terminal_progress=terminal_progress)
    req.validate()
    steps = Steps("search", progress, cancel)
    out = req.out_dir or f"runs/search-{time.strftime('%Y%m%d-%H%M%S')}"
    steps.stage("start", out_dir=out, budget=req.budget)
    common = dict(address=req.address, resume=req.resume, retry_failed=req.retry_failed, workers=req.workers,
                  seed=req.seed, hysteresis=req.hysteresis, area_bucket_mm2=req.area_bucket_mm2,
                  archs_per_trial=req.archs_per_trial, schedule_cache=req.schedule_cache,
                  wait_timeout_s=req.wait_timeout_s, progress=terminal_progress,
                  on_evaluated=(lambda info: progress("evaluated", info)) if progress else None,
                  cancel=cancel)
    if req.searcher == "screen":   # every architecture screened, the top k solved (platform/screen.py)
        res = run_screen(req.settings(), out, top_k=req.screen_top_k or DEFAULT_TOP_K,
                         prune=req.screen_prune, **common)
    else:
        res = run_search(req.settings(), out, searcher=req.searcher, budget=req.budget,
                         max_failures=req.max_failures, **common)
    result = SearchResult.from_dict(res)
    steps.done(evaluated=result.evaluated, failed=result.failed, out_dir=result.out_dir)
    return result
