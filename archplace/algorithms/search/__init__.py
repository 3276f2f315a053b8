"""Architecture search: Phaze's generator (plain Python) and Ray Tune searchers (imported lazily, so
that ``archplace.algorithms.search.phaze`` works without Ray)."""

from __future__ import annotations

from typing import Any

from .phaze import PhazeGenerator, area_buckets

_TUNE = ("SEARCHERS", "ArchOptunaSearch", "GridSearcher", "PhazeSearcher", "RandomSearcher", "make_searcher",
         "nearest_index", "optuna_space", "reference_fields")

__all__ = ["PhazeGenerator", "area_buckets", *_TUNE]


def __getattr__(name: str) -> Any:
    if name in _TUNE:
        from . import tune_searchers

        return getattr(tune_searchers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
