"""How many objects the engine handed out are still referenced, and their bytes.

The engine's side of the scheduler's integrity check: checkpoints (``SequenceState``) and
stored KV (``KvAccess``) are each tracked here when made and forgotten when the garbage
collector drops the last reference (``weakref.finalize``), so the check can compare the
ledger's count with what is really alive.
"""

from __future__ import annotations

import weakref


class LiveCount:
    def __init__(self) -> None:
        self._count = 0
        self._bytes = 0

    def track(self, obj: object, nbytes: int) -> None:
        """Count ``obj`` (``nbytes``) until it is garbage collected."""
        self._count += 1
        self._bytes += nbytes
        weakref.finalize(obj, self._forget, nbytes)

    def _forget(self, nbytes: int) -> None:
        self._count -= 1
        self._bytes -= nbytes

    @property
    def snapshot(self) -> tuple[int, int]:
        """(count, bytes) of the tracked objects still referenced."""
        return self._count, self._bytes
