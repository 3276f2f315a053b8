"""Phaze's architecture generator: largest area first, stop by hysteresis (plain Python + numpy, no Ray).

Algorithm 1 of the paper (spec ``phaze.md`` §1.3) walks the feasible architectures in decreasing area,
evaluates each one (the across-model average throughput), and after every *area* is fully explored
checks whether the search has converged (spec §2.4):

* areas are grouped into buckets ``floor(area / area_bucket_mm2)``; Phaze's code uses
  ``int(area / 10000)`` with the area in µm², i.e. buckets of 0.01 mm² (spec §2.4 [REPO], §11.3);
  ``area_bucket_mm2 = 0`` groups exactly equal areas only;
* each bucket keeps the maximum observed value (``max_thpt_per_area``);
* a bucket is *closed* once every index in it has been observed; closed buckets are taken in area
  order, and only the contiguous prefix of closed buckets counts (with concurrent trials, results
  arrive out of order: a smaller bucket may finish before a larger one);
* each time a bucket closes, if more than ``hysteresis`` buckets are closed, the last ``hysteresis``
  bucket maxima are compared; if they are non-increasing (each earlier one ``>=`` the later one, the
  comparison of the Phaze repository), the search has converged and no further index is handed out.

The best architecture is the best among all observed ones (spec §2.4), including any that concurrent
trials evaluated beyond the convergence point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["PhazeGenerator", "area_buckets"]


def area_buckets(areas_mm2: np.ndarray, area_bucket_mm2: float) -> np.ndarray:
    """Bucket number of each area (0 for the largest-area bucket), for areas sorted decreasingly."""
    a = np.asarray(areas_mm2, dtype=np.float64)
    if area_bucket_mm2 > 0:
        # round away float noise (0.03 / 0.01 = 2.9999999999999996) before flooring
        keys = np.floor(np.round(a / area_bucket_mm2, 9))
    else:
        keys = a
    if not len(keys):
        return np.zeros(0, dtype=np.int64)
    new = np.r_[True, keys[1:] != keys[:-1]]
    return np.cumsum(new).astype(np.int64) - 1


class PhazeGenerator:
    """Hands out architecture indices 0, 1, 2, ... (decreasing area) until the hysteresis rule stops.

    ``areas_mm2`` must be non-increasing (the order of ``enumerate_space``). ``next_index()`` returns
    the next index not yet handed out or observed, or ``None`` once the search has converged or every
    index has been handed out. ``observe(index, value)`` records the across-model average throughput
    of an index (a failed evaluation is observed as 0.0); observing an index that was never handed out
    (a resumed search) is allowed, and such an index is then skipped. See the module docstring for the
    convergence rule (spec ``phaze.md`` §1.3 Algorithm 1 ``check_converge``, §2.4).
    """

    def __init__(self, areas_mm2: np.ndarray | Sequence[float], hysteresis: int = 6,
                 area_bucket_mm2: float = 0.01):
        if isinstance(hysteresis, bool) or not isinstance(hysteresis, (int, np.integer)) or hysteresis < 1:
            raise ValueError(f"hysteresis must be an integer >= 1, got {hysteresis!r}")
        if (isinstance(area_bucket_mm2, bool) or not isinstance(area_bucket_mm2, (int, float, np.number))
                or not math.isfinite(area_bucket_mm2) or area_bucket_mm2 < 0):
            raise ValueError(f"area_bucket_mm2 must be a finite number >= 0, got {area_bucket_mm2!r}")
        areas = np.asarray(areas_mm2, dtype=np.float64)
        if areas.ndim != 1 or not len(areas):
            raise ValueError(f"areas_mm2 must be a non-empty 1-D array, got shape {areas.shape}")
        if not np.all(np.isfinite(areas)):
            raise ValueError("areas_mm2 must be finite")
        if np.any(np.diff(areas) > 0):
            i = int(np.flatnonzero(np.diff(areas) > 0)[0])
            raise ValueError(f"areas_mm2 must be non-increasing (largest area first); "
                             f"areas_mm2[{i}] = {areas[i]} < areas_mm2[{i + 1}] = {areas[i + 1]}")
        self.hysteresis = int(hysteresis)
        self.area_bucket_mm2 = float(area_bucket_mm2)
        self.areas_mm2 = areas
        self.bucket_of = area_buckets(areas, self.area_bucket_mm2)
        nb = int(self.bucket_of[-1]) + 1
        self._remaining = np.bincount(self.bucket_of, minlength=nb).astype(np.int64)
        self._bucket_max = np.full(nb, -np.inf)
        self._values: dict[int, float] = {}
        self._cursor = 0                    # every index below it has been handed out or observed
        self._closed: list[float] = []      # maxima of the contiguous prefix of closed buckets
        self._converged = False
        self._converged_bucket: int | None = None

    def __len__(self) -> int:
        return len(self.areas_mm2)

    @property
    def num_buckets(self) -> int:
        return len(self._remaining)

    def next_index(self) -> int | None:
        """The next index to evaluate, or None when converged or every index has been handed out."""
        if self._converged:
            return None
        n = len(self.areas_mm2)
        while self._cursor < n and self._cursor in self._values:
            self._cursor += 1
        if self._cursor >= n:
            return None
        i = self._cursor
        self._cursor += 1
        return i

    def observe(self, index: int, value: float) -> None:
        """Record the value of ``index`` (0.0 for a failed evaluation) and update convergence.

        Observing an index twice keeps the larger value; it does not count twice toward closure.
        """
        n = len(self.areas_mm2)
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
            raise ValueError(f"index must be an integer in [0, {n}), got {index!r}")
        i = int(index)
        v = float(value)
        if math.isnan(v):
            raise ValueError(f"value for index {i} is NaN; observe failed evaluations as 0.0")
        b = int(self.bucket_of[i])
        if i in self._values:
            self._values[i] = max(self._values[i], v)
        else:
            self._values[i] = v
            self._remaining[b] -= 1
        self._bucket_max[b] = max(self._bucket_max[b], v)
        self._close_buckets()

    def _close_buckets(self) -> None:
        h = self.hysteresis
        while len(self._closed) < self.num_buckets and self._remaining[len(self._closed)] == 0:
            self._closed.append(float(self._bucket_max[len(self._closed)]))
            if not self._converged and len(self._closed) > h:
                last = self._closed[-h:]
                if all(a >= b for a, b in zip(last[:-1], last[1:])):
                    self._converged = True
                    self._converged_bucket = len(self._closed) - 1

    @property
    def converged(self) -> bool:
        return self._converged

    @property
    def converged_bucket(self) -> int | None:
        """The bucket whose closure triggered convergence (None while not converged)."""
        return self._converged_bucket

    @property
    def exhausted(self) -> bool:
        """Every index has been handed out or observed."""
        n = len(self.areas_mm2)
        return self._cursor >= n or all(j in self._values for j in range(self._cursor, n))

    @property
    def done(self) -> bool:
        """No further index will be handed out."""
        return self._converged or self.exhausted

    @property
    def observed(self) -> dict[int, float]:
        """Observed values by index (a copy)."""
        return dict(self._values)

    @property
    def best_index(self) -> int | None:
        """The observed index with the highest value (ties: the larger area, i.e. the lower index)."""
        if not self._values:
            return None
        return min(self._values, key=lambda j: (-self._values[j], j))

    @property
    def best_value(self) -> float | None:
        j = self.best_index
        return None if j is None else self._values[j]

    @property
    def bucket_maxima(self) -> list[float]:
        """Per-bucket maxima of the closed buckets, in decreasing-area order (contiguous prefix)."""
        return list(self._closed)

    def get_state(self) -> dict:
        return {k: (v.copy() if isinstance(v, np.ndarray) else
                    dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                for k, v in self.__dict__.items()}

    def set_state(self, state: dict) -> None:
        self.__dict__.update(state)
