"""A lock whose waiters get it in the order they came (the service's per-study and writer locks)."""

from __future__ import annotations

import threading
from collections import deque


class FifoLock:
    """A lock that hands itself to its waiters in the order they came.

    Why: ``threading.Lock`` wakes an arbitrary waiter, and under the GIL a thread that just released
    it often takes it again first, so with 32 request threads behind one lock a few wait for seconds
    while the rest pass (measured: suggest p50 0.5 s, p99 2.5 s at 64 clients). Here a releasing
    owner passes the lock to the oldest waiter directly."""

    __slots__ = ("_guard", "_waiters", "_held")

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._waiters: deque[threading.Lock] = deque()
        self._held = False

    def acquire(self) -> bool:
        with self._guard:
            if not self._held:
                self._held = True
                return True
            baton = threading.Lock()
            baton.acquire()
            self._waiters.append(baton)
        baton.acquire()  # released by the owner that hands the lock over: held from here on
        return True

    def release(self) -> None:
        with self._guard:
            if self._waiters:
                self._waiters.popleft().release()  # stays held, by the next in line
            else:
                self._held = False

    def locked(self) -> bool:
        return self._held

    def __enter__(self) -> FifoLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
