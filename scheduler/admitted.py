"""The handle admission returns: an admitted transaction holding its reservation and its pin.

Admission reserves a step's forecast and pins its episode's published state in one
synchronous moment (no await between: no eviction can fall between the two), and hands back
an ``Admitted``.  The job runs its transaction inside ``with admitted as txn:``; on exit —
published, failed, preempted or cancelled alike — the handle gives both back: the
reservation returns to the ledger (a no-op once publication consumed it), the pin comes
off, and the jobs waiting for memory are told.

Ownership: the handle is the only code that sets or clears ``Slot.pinned``.  Rolling the
engine's sequence back is the transaction's business and happens before the exit (the
scheduler's ``_run``); the handle only returns bookkeeping, so its exit is synchronous and
runs even under cancellation.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from scheduler.errors import BudgetExceededError
from scheduler.ledger import MemoryLedger
from scheduler.slots import Slot
from scheduler.transaction import Transaction, abort, admit

_log = structlog.get_logger("kvagent.scheduler")


class Admitted:
    """A reserved, pinned transaction until ``release`` (or the ``with`` block's end)."""

    def __init__(self, slot: Slot, txn: Transaction, ledger: MemoryLedger,
                 notify_release: Callable[[], None]) -> None:
        # one job per episode at a time (its job lock), so one handle per slot at a time
        assert not slot.pinned, f"episode {slot.cache.episode_id} is already pinned"
        assert txn.reservation is not None, "an admitted transaction holds a reservation"
        self.slot, self.txn, self._ledger, self._notify = slot, txn, ledger, notify_release
        self.released = False
        slot.pinned = True

    @classmethod
    def reserve(cls, slot: Slot, txn: Transaction, ledger: MemoryLedger,
                notify_release: Callable[[], None]) -> Admitted | None:
        """Reserve the plan's bytes and pin the episode; None (nothing changed) when the
        ledger refuses."""
        try:
            admit(txn, ledger)
        except BudgetExceededError:
            return None
        return cls(slot, txn, ledger, notify_release)

    def __enter__(self) -> Transaction:
        return self.txn

    def __exit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        """Return the reservation, unpin, tell the waiters (idempotent)."""
        if self.released:
            return
        self.released = True
        ep = self.txn.episode
        try:
            abort(self.txn, self._ledger)
        finally:
            self.slot.pinned = False
            self._notify()
        _log.info("release", episode_id=ep.episode_id, seq_id=ep.seq, txn_id=self.txn.txn_id,
                  held=self._ledger.held_by(ep.episode_id), free=self._ledger.snapshot().free)
