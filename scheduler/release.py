"""A broadcast of "memory or an episode was released": every waiter wakes, then re-checks —
and the clock of the holders' progress, which bounds how long a wait may go on.

The event is replaced after every notification, so a waiter takes ``current`` first and
waits on that; a release between taking it and waiting is not lost.

Progress: a release, a job's end, and every piece a job prefills or token it decodes (marked
from the engine's worker threads: one float store, atomic under the GIL).  A wait for memory
ends when no release can come (the admission's own check), or as a safety bound when no
holder made progress for the stall timeout — never merely because the holders are slow.
"""

from __future__ import annotations

import time

import anyio

#: The fallback ladder's wait for releases (rung 2) ends when no release can come; this is
#: only its safety bound: the seconds with no progress at all by any job (no piece
#: prefilled, no token decoded, no release) after which the waiter gives up — an engine that
#: hangs.  Generous: a slow machine (or a big model's long prefill piece) is not a hang.
STALL_TIMEOUT_S = 300.0


class ReleaseSignal:
    def __init__(self) -> None:
        self._event = anyio.Event()
        self._progress_at = time.monotonic()

    @property
    def current(self) -> anyio.Event:
        return self._event

    def notify(self) -> None:
        self._progress_at = time.monotonic()
        self._event.set()
        self._event = anyio.Event()

    def mark_progress(self) -> None:
        """A job made progress (a piece prefilled, a token decoded); any thread."""
        self._progress_at = time.monotonic()

    def last_progress(self) -> float:
        """``time.monotonic()`` of the last progress or release."""
        return self._progress_at
