"""A broadcast of "memory or an episode was released": every waiter wakes, then re-checks.

The event is replaced after every notification, so a waiter takes ``current`` first and
waits on that; a release between taking it and waiting is not lost.
"""

from __future__ import annotations

import anyio


class ReleaseSignal:
    def __init__(self) -> None:
        self._event = anyio.Event()

    @property
    def current(self) -> anyio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = anyio.Event()
