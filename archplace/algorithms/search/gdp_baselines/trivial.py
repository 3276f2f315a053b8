"""The trivial GDP placement baselines: ``random_placement`` (uniform device per co-location group / op)
and ``single_device`` (everything on device 0, the ``d = 1`` reference)."""

from __future__ import annotations

import numpy as np

from ....simulators.gpu_placement import PlacementProblem
from .units import _check, _spread_units, _units


def random_placement(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """A uniform device per co-location group (and per op outside groups)."""
    _check(problem)
    unit, members = _units(problem)
    rng = np.random.default_rng(seed)
    return _spread_units(unit, rng.integers(0, problem.num_devices, len(members)))


def single_device(problem: PlacementProblem, *, seed: int = 0) -> np.ndarray:
    """Everything on device 0: the one-GPU reference."""
    _check(problem)
    return np.zeros(problem.num_nodes, np.int64)
