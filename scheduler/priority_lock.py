"""An async lock that hands itself to the most urgent waiter: lower priority value first,
then first come first served (so no waiter of a class starves behind later arrivals)."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio


class PriorityLock:
    def __init__(self) -> None:
        self._held = False
        self._waiters: list[tuple[int, int, anyio.Event]] = []
        self._order = itertools.count()

    @property
    def locked(self) -> bool:
        return self._held

    def waiting(self, at_most: int) -> int:
        """How many waiters have priority value <= ``at_most`` (i.e. are at least as urgent)."""
        return sum(1 for p, _, _ in self._waiters if p <= at_most)

    @asynccontextmanager
    async def hold(self, priority: int) -> AsyncIterator[None]:
        if self._held or self._waiters:
            entry = (priority, next(self._order), anyio.Event())
            heapq.heappush(self._waiters, entry)
            try:
                await entry[2].wait()
            except BaseException:
                if entry[2].is_set():  # granted while being cancelled: pass it on
                    self._release()
                else:
                    self._waiters.remove(entry)
                    heapq.heapify(self._waiters)
                raise
        else:
            self._held = True
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        if self._waiters:
            _, _, event = heapq.heappop(self._waiters)
            event.set()  # ownership passes directly: _held stays True
        else:
            self._held = False
