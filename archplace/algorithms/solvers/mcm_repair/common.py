"""Shared bookkeeping of the MCM repair, at the bottom of the package (it imports none of its modules).

:data:`MAX_CHIPS` (chip sets are Python-int bitmasks), the two modes, :class:`RepairResult` (what every
repair returns) and the chip-bitmask helpers the stages share: ``_bits`` (the chips of a set) and
``_span`` (the set of an interval of chips).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_CHIPS = 64  # chip sets are Python-int bitmasks; the paper's package has 36
_MODES = ("fix", "sample")


@dataclass
class RepairResult:
    """Outcome of one repair.

    ``partition`` is the chip of every node (``None`` unless ``status == "valid"``); ``changed`` counts the
    nodes whose chip differs from the input ``y`` (0 when no ``y`` was given); ``failures`` and
    ``branches`` are the classic solver's counters summed over all stages; ``wall_s`` covers the searches
    only (the model of a graph is built once per :class:`MCMRepairer`); ``stage`` is the stage that
    produced the result ("eq4", "cpsat", "chain", "chain-cap<k>" or "complete", see the module doc).
    """

    partition: np.ndarray | None
    status: str  # "valid" | "infeasible" | "unknown"
    changed: int
    failures: int
    branches: int
    wall_s: float
    stage: str = "eq4"


def _bits(m: int):
    while m:
        low = m & -m
        yield low.bit_length() - 1
        m ^= low


def _span(lo: int, hi: int) -> int:
    return ((1 << (hi + 1)) - 1) >> lo << lo
