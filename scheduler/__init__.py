"""kvagent.scheduler: step transactions, the memory-budget ledger, admission with the fallback
ladder, and priorities (critical path before prefetch) in front of the cache policies."""

import importlib
from typing import TYPE_CHECKING, Any

from scheduler.errors import (
    AdmissionError, BudgetExceededError, EpisodeClosedError, NoFreeSequenceError,
    SchedulerError, ShuttingDownError,
)
from scheduler.ledger import LedgerSnapshot, MemoryLedger, Reservation
from scheduler.records import StepRecord
from scheduler.slots import Priority
from scheduler.transaction import EpisodeCache, PrefetchRecord, StepOptions

if TYPE_CHECKING:
    from scheduler.scheduler import Scheduler

__all__ = [
    "AdmissionError", "BudgetExceededError", "EpisodeCache", "EpisodeClosedError",
    "LedgerSnapshot", "MemoryLedger", "NoFreeSequenceError", "PrefetchRecord", "Priority",
    "Reservation", "Scheduler", "SchedulerError", "ShuttingDownError", "StepOptions",
    "StepRecord",
]

#: ``Scheduler`` drives the engine, whose module loads libllama: imported on first use (PEP
#: 562).  Every ``scheduler.*`` import runs this file first, and the plain records above are
#: what a thin client (``KvAgent(server=URL)``, through ``runtime.config``) needs.
_LOADS_LLAMA = {"Scheduler": "scheduler.scheduler"}


def __getattr__(name: str) -> Any:
    if name in _LOADS_LLAMA:
        return getattr(importlib.import_module(_LOADS_LLAMA[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
