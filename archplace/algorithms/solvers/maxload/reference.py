"""The reference optima of the published inputs (the workload README), by "<folder>/<file name>".

Tests and ``bench/gdp/dp_partitioning.py`` compare against these; ``solve-dp`` reports the difference.
"""

from __future__ import annotations

from pathlib import Path

#: Optimal max-loads of the reference DP (workload README), keyed by "<folder>/<file name>".
REFERENCE_MAX_LOADS: dict[str, float] = {
    "LayerGraphs/bert24_inference.json": 17.78990625,
    "LayerGraphs/bert24_training.json": 41.7458125,
    "LayerGraphs/gnmt_inference.json": 32.910658203124996,
    "LayerGraphs/gnmt_training.json": 107.0044140625,
    "LayerGraphs/resnet50_inference.json": 33.774666015625,
    "LayerGraphs/resnet50_training.json": 78.63181250000001,
}


def _reference_key(path: Path) -> str | None:
    key = f"{path.parent.name}/{path.name}"
    return key if key in REFERENCE_MAX_LOADS else None


def reference_value(path: str | Path) -> float | None:
    """The README's optimal max-load for ``path`` (matched on "<folder>/<file name>"), or None."""
    key = _reference_key(Path(path))
    return REFERENCE_MAX_LOADS[key] if key else None
