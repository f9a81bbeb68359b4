"""kvagent.scheduler: the memory-budget ledger (admission and priorities come next)."""

from scheduler.errors import BudgetExceededError, SchedulerError
from scheduler.ledger import LedgerSnapshot, MemoryLedger, Reservation

__all__ = ["BudgetExceededError", "LedgerSnapshot", "MemoryLedger", "Reservation",
           "SchedulerError"]
