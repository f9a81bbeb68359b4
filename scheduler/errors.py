"""Typed errors of the scheduler."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base class for scheduler errors."""


class BudgetExceededError(SchedulerError):
    """A reservation or publication would take the ledger past its budget."""

    def __init__(self, message: str, *, wanted: int, free: int) -> None:
        super().__init__(message)
        self.wanted = wanted
        self.free = free
