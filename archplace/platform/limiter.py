"""How many trials a search keeps in flight, re-read from the cluster while it runs.

Tune's ``ConcurrencyLimiter`` takes a fixed ``max_concurrent``; a search on an autoscaling cluster
should start more trials when nodes join and fewer when they leave. ``AdaptiveLimiter`` is that
limiter with ``max_concurrent`` recomputed (at most every ``refresh_s``) from the cluster's CPUs:

    in flight = min(user cap (--workers), cluster CPUs, pruning cap) trials, at least 1

The pruning cap keeps Phaze's stopping rule meaningful: the rule can only stop handing out
architectures once results come back, so every architecture in flight when it converges is
evaluated in vain, and with as many in flight as the budget it would prune nothing. Phaze runs
keep at most ``max(1, min(hysteresis, budget // 4))`` architectures in flight (the waste after
convergence stays below one hysteresis window and the search takes at least four rounds); a
trial that batches N architectures counts N. Each architecture's ILP slices still fan out as
tasks over every CPU, so the cap costs little parallelism.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ray.tune.search import ConcurrencyLimiter, Searcher


def pruning_cap(searcher: str, budget: int, hysteresis: int, archs_per_trial: int) -> int | None:
    """Trials in flight that keep the Phaze rule pruning (None: no such limit for this searcher)."""
    if searcher != "phaze":
        return None
    archs = max(1, min(hysteresis, budget // 4))
    return max(1, archs // archs_per_trial)


class AdaptiveLimiter(ConcurrencyLimiter):
    """A ``ConcurrencyLimiter`` whose limit follows ``capacity()`` (re-read every ``refresh_s``)."""

    def __init__(self, searcher: Searcher, capacity: Callable[[], int], refresh_s: float = 2.0):
        self._capacity = capacity
        self._refresh_s = refresh_s
        self._checked = -float("inf")
        self.history: list[tuple[float, int]] = []   # (time, limit) whenever the limit changed
        super().__init__(searcher, max_concurrent=max(1, int(capacity())))
        self.history.append((time.time(), self.max_concurrent))

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < self._refresh_s:
            return
        self._checked = now
        limit = max(1, int(self._capacity()))
        if limit != self.max_concurrent:
            self.max_concurrent = limit
            self.history.append((time.time(), limit))

    def suggest(self, trial_id: str):
        self._refresh()
        return super().suggest(trial_id)

    def get_state(self) -> dict:
        state = super().get_state()
        state.pop("_capacity", None)
        return state

    def __getstate__(self) -> dict:
        """Tune pickles its search algorithm into ``OUT/tune/.../tuner.pkl`` (for ``Tuner.restore``,
        which a search never uses: ``--resume`` reads the result store). Our searchers go in as
        their ``get_state()``, without the search space they re-enumerate on restore: pickled whole,
        the Phaze space made tuner.pkl 1.7 MB per run (issue 29). ``capacity`` (a closure over the
        live cluster) is not kept; a restored limiter keeps its last limit."""
        state = self.__dict__.copy()
        state.pop("_capacity", None)
        searcher = state["searcher"]
        if getattr(searcher, "space", None) is not None and hasattr(searcher, "set_state"):
            state["searcher"] = (type(searcher), searcher.get_state())
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        if isinstance(state.get("searcher"), tuple):
            cls, inner = state["searcher"]
            searcher = cls.__new__(cls)
            searcher.space_path = inner.get("space_path")   # set_state compares with it
            searcher.set_state(inner)
            state["searcher"] = searcher
        self.__dict__.update(state)
        self._capacity = lambda: self.max_concurrent
