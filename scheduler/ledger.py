"""The memory-budget ledger: every byte is reserved by a transaction, held by a published
cache state (per owner), or free.  A reservation or publication that would take
``reserved + held`` past the budget is refused, so the recorded peak never exceeds it.

The ledger only knows what it was told.  Whether that matches what the engine really holds
is ``Scheduler.check_integrity``'s question (two independent counts compared).

Thread-safe (a lock around plain bookkeeping); it never touches the engine.
"""

from __future__ import annotations

import threading

import attrs

from scheduler.errors import BudgetExceededError


@attrs.frozen
class Reservation:
    txn_id: str
    nbytes: int


@attrs.frozen
class LedgerSnapshot:
    budget: int
    reserved: int
    held: int
    peak: int

    @property
    def free(self) -> int:
        return self.budget - self.reserved - self.held


class MemoryLedger:
    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("the memory budget must be positive")
        self.budget = budget_bytes
        self._lock = threading.Lock()
        self._reservations: dict[str, int] = {}
        self._held: dict[str, int] = {}
        self._peak = 0

    # ------------------------------------------------------------ queries

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            return LedgerSnapshot(self.budget, sum(self._reservations.values()),
                                  sum(self._held.values()), self._peak)

    @property
    def free(self) -> int:
        return self.snapshot().free

    def held_by(self, owner: str) -> int:
        with self._lock:
            return self._held.get(owner, 0)

    def holdings(self) -> dict[str, int]:
        """A copy of what every owner holds."""
        with self._lock:
            return dict(self._held)

    def reservations(self) -> dict[str, int]:
        """A copy of the open reservations (transaction id → bytes)."""
        with self._lock:
            return dict(self._reservations)

    # ------------------------------------------------------------ mutations

    def _bump_peak(self) -> None:
        self._peak = max(self._peak, sum(self._reservations.values()) + sum(self._held.values()))

    def reserve(self, txn_id: str, nbytes: int) -> Reservation:
        """Reserve ``nbytes`` for a transaction or raise ``BudgetExceededError``."""
        if nbytes < 0:
            raise ValueError("cannot reserve a negative amount")
        with self._lock:
            if txn_id in self._reservations:
                raise ValueError(f"transaction {txn_id} already holds a reservation")
            free = self.budget - sum(self._reservations.values()) - sum(self._held.values())
            if nbytes > free:
                raise BudgetExceededError(
                    f"transaction {txn_id} needs {nbytes} bytes, {free} free of {self.budget}",
                    wanted=nbytes, free=free)
            self._reservations[txn_id] = nbytes
            self._bump_peak()
            return Reservation(txn_id, nbytes)

    def release(self, reservation: Reservation) -> None:
        """Return a reservation's bytes (idempotent: a released reservation is ignored)."""
        with self._lock:
            self._reservations.pop(reservation.txn_id, None)

    def publish(self, owner: str, held_bytes: int, reservation: Reservation | None) -> None:
        """Atomically set what ``owner``'s published state holds and release the reservation.

        The new holding may use the reservation's bytes and any free bytes; beyond that the
        publication is refused (nothing changes).
        """
        with self._lock:
            reserved = self._reservations.get(reservation.txn_id, 0) if reservation else 0
            free = self.budget - sum(self._reservations.values()) - sum(self._held.values())
            growth = held_bytes - self._held.get(owner, 0)
            if growth > reserved + free:
                raise BudgetExceededError(
                    f"{owner} would hold {held_bytes} bytes: {growth - reserved - free} over",
                    wanted=growth, free=reserved + free)
            if reservation is not None:
                self._reservations.pop(reservation.txn_id, None)
            if held_bytes:
                self._held[owner] = held_bytes
            else:
                self._held.pop(owner, None)
            self._bump_peak()

    def drop(self, owner: str) -> None:
        """Forget everything ``owner`` holds (its episode ended)."""
        with self._lock:
            self._held.pop(owner, None)

    def __repr__(self) -> str:
        s = self.snapshot()
        return (f"<MemoryLedger budget={s.budget} held={s.held} reserved={s.reserved} "
                f"free={s.free} peak={s.peak}>")
