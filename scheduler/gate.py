"""The engine gate: who may run engine work next, and how many critical jobs are waiting.

One llama context executes one job at a time.  The gate owns the ``PriorityLock`` that orders
those jobs (critical path before prefetch, first come first served within a class) and the
count of critical jobs waiting for it, which a running prefetch polls from its worker thread
to stop at the next piece boundary.  The scheduler holds one gate; nothing else touches the
lock or the count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from scheduler.priority_lock import PriorityLock
from scheduler.slots import Priority


class EngineGate:
    def __init__(self) -> None:
        self._lock = PriorityLock()
        self._critical_waiting = 0

    @property
    def critical_waiting(self) -> int:
        """Critical jobs waiting for the engine (read by worker threads: a plain int read)."""
        return self._critical_waiting

    def waiting(self, priority: Priority) -> int:
        """Jobs waiting that are at least as urgent as ``priority``."""
        return self._lock.waiting(int(priority))

    @asynccontextmanager
    async def hold(self, priority: Priority) -> AsyncIterator[None]:
        """Hold the engine at ``priority``; a critical waiter is counted until it gets in."""
        critical = priority is Priority.CRITICAL
        if critical:
            self._critical_waiting += 1
        entered = False
        try:
            async with self._lock.hold(int(priority)):
                if critical:
                    self._critical_waiting -= 1
                    entered = True
                yield
        finally:
            if critical and not entered:
                self._critical_waiting -= 1
