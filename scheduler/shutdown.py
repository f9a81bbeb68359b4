"""The scheduler's shutdown: once begun, no critical job starts, every job waiting for memory
or for the engine gives up, and every job in flight stops at its next piece or token
boundary and rolls back (``ShuttingDownError``; a prefetch is simply discarded).

What a server does when its grace period ends: the in-flight requests end with an answer
(an error saying the server is shutting down) instead of being cut off mid-stream.  Closing
episodes still works after it began: a shutdown stops work, it frees nothing by itself.

Ownership: the ``Scheduler`` holds one ``Shutdown``; each running job registers its stop flag
(``watching``), which ``begin`` sets.  ``begin`` and the registry run on the event loop; the
flags are read by the jobs' worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from scheduler.errors import ShuttingDownError


class Shutdown:
    def __init__(self) -> None:
        self.reason: str | None = None  # None: not begun
        self._stops: set[threading.Event] = set()

    @property
    def begun(self) -> bool:
        return self.reason is not None

    def begin(self, reason: str) -> int:
        """Stop every registered job; returns how many were running.  Idempotent (the first
        reason stays)."""
        if self.reason is None:
            self.reason = reason
        for stop in self._stops:
            stop.set()
        return len(self._stops)

    def check(self, episode_id: str) -> None:
        """Raise ``ShuttingDownError`` once the shutdown began."""
        if self.reason is not None:
            raise ShuttingDownError(f"episode {episode_id}: {self.reason}; the step was "
                                    f"stopped before publication (rolled back)")

    @contextmanager
    def watching(self, stop: threading.Event) -> Iterator[None]:
        """``stop`` is set when the shutdown begins (at once if it already has)."""
        self._stops.add(stop)
        if self.reason is not None:
            stop.set()
        try:
            yield
        finally:
            self._stops.discard(stop)
