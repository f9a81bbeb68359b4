"""kvagent.scheduler: step transactions, the memory-budget ledger, admission with the fallback
ladder, and priorities (critical path before prefetch) in front of the cache policies."""

from scheduler.errors import (
    AdmissionError, BudgetExceededError, EpisodeClosedError, NoFreeSequenceError,
    SchedulerError,
)
from scheduler.ledger import LedgerSnapshot, MemoryLedger, Reservation
from scheduler.records import StepRecord
from scheduler.scheduler import Scheduler
from scheduler.slots import Priority
from scheduler.transaction import EpisodeCache, PrefetchRecord, StepOptions

__all__ = [
    "AdmissionError", "BudgetExceededError", "EpisodeCache", "EpisodeClosedError",
    "LedgerSnapshot", "MemoryLedger", "NoFreeSequenceError", "PrefetchRecord", "Priority",
    "Reservation", "Scheduler", "SchedulerError", "StepOptions", "StepRecord",
]
