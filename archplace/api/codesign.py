"""``archplace search --target mcm|gpu-cluster``: the co-design searches (``platform/codesign.py``) behind
the one ``SearchRequest``: its checks for these targets and their result type."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..platform.mcm_trial import PLACERS as MCM_PLACERS
from ._common import (
    ExtraResult,
    ProgressFn,
    Steps,
    check_bool,
    check_choice,
    check_int,
    check_optional_str,
    check_positive_number,
    invalid,
)

TARGETS = ("accelerator", "mcm", "gpu-cluster")
CODESIGN_SEARCHERS = ("random", "grid", "optuna", "pareto")
DEFAULT_SEARCHER = "pareto"   # what the CLI's default "--searcher phaze" means for a co-design target
# the Phaze-only fields: a co-design request must leave them at their defaults (a given one would be ignored)
_PHAZE_ONLY = ("accelerators", "global_batch", "archs_per_trial", "schedule", "schedule_cache",
               "microbatches",
               "hbm_gb", "recompute", "tmp_widths", "hysteresis", "area_bucket_mm2", "retry_failed")


def searcher_of(req) -> str:
    return DEFAULT_SEARCHER if req.searcher == "phaze" else req.searcher


def validate_codesign(req) -> None:
    """One-line errors naming the field; the Phaze-only fields must keep their defaults."""
    import dataclasses

    check_choice("target", req.target, TARGETS)
    models = req.models
    if not (isinstance(models, tuple) and models and all(isinstance(m, str) and m for m in models)):
        raise invalid("models", f"must be one or more model names, got {req.models!r}")
    check_choice("searcher", searcher_of(req), CODESIGN_SEARCHERS)
    check_int("budget", req.budget)
    check_int("workers", req.workers, optional=True)
    check_int("seed", req.seed, low=0)
    check_int("max_failures", req.max_failures, low=0)
    check_int("seq", req.seq, optional=True)
    check_bool("resume", req.resume)
    check_optional_str("out_dir", req.out_dir)
    check_optional_str("address", req.address)
    check_optional_str("policy", req.policy)
    defaults = {f.name: f.default for f in dataclasses.fields(req)}
    for name in _PHAZE_ONLY:
        if getattr(req, name) != defaults[name]:
            raise invalid(name, f"applies to --target accelerator, not {req.target}")
    if req.target == "mcm":
        check_choice("placer", req.placer, MCM_PLACERS)
        check_int("subsolves", req.subsolves)
        check_int("finetune_subsolves", req.finetune_subsolves, low=0)
        check_positive_number("det_time", req.det_time)
        if req.finetune_subsolves and req.placer != "ppo-pretrained":
            raise invalid("finetune_subsolves", f"applies to placer ppo-pretrained, not {req.placer}")
    elif req.placer != defaults["placer"] or req.policy:
        raise invalid("placer", "and policy apply to --target mcm")
    elif req.seq is not None:
        raise invalid("seq", "applies to --target mcm and accelerator; a gpu-cluster trial trains at each "
                             "model's own sequence length (platform/gpu_cluster_trial.py)")
    if not (req.space is None or isinstance(req.space, dict) or (isinstance(req.space, str) and req.space)):
        raise invalid("space", f"must be a space YAML path, its content as a dict, or None, "
                               f"got {req.space!r}")


@dataclass
class CodesignResult(ExtraResult):
    """``best.json`` of a co-design search with the run's statistics (README "co-design")."""

    target: str
    models: list[str]
    searcher: str
    placer: str | None
    objective: str
    cost: str                            # what cost_usd means
    throughput_unit: str
    evaluated: int                       # hardware points evaluated (resumed ones included)
    failed: int
    infeasible: int
    common: dict[str, Any] | None        # the best design (objective) with every model's partition / plan
    per_model: dict[str, dict[str, Any]]
    pareto: list[dict[str, Any]]         # non-dominated designs of (average throughput, cost)
    out_dir: str
    stats: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


def codesign_search(req, *, progress: ProgressFn | None = None, cancel: threading.Event | None = None,
                    terminal_progress: bool = False) -> CodesignResult:
    """Run (or resume) a co-design search; stages ``start``, ``evaluated`` per hardware point, ``done``."""
    from ..platform.codesign import run_codesign

    req.validate()
    steps = Steps("search", progress, cancel)
    out = req.out_dir or f"runs/search-{time.strftime('%Y%m%d-%H%M%S')}"
    steps.stage("start", out_dir=out, budget=req.budget)
    opts: dict[str, Any] = {}
    if req.target == "mcm":
        opts = {"placer": req.placer, "subsolves": req.subsolves, "det_time": req.det_time,
                "finetune_subsolves": req.finetune_subsolves, "seed": req.seed}
    res = run_codesign(req.target, tuple(req.models), out, searcher=searcher_of(req), budget=req.budget,
                       address=req.address, resume=req.resume, workers=req.workers, seed=req.seed,
                       space=req.space, opts=opts, seq=req.seq, policy=req.policy,
                       max_failures=req.max_failures, progress=terminal_progress,
                       on_evaluated=(lambda info: progress("evaluated", info)) if progress else None,
                       cancel=cancel)
    result = CodesignResult.from_dict(res)
    steps.done(evaluated=result.evaluated, failed=result.failed, out_dir=result.out_dir)
    return result
