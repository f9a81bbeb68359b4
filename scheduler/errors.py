"""Typed errors of the scheduler."""

from __future__ import annotations

from cachepolicy.errors import PolicyRefusedError


class SchedulerError(Exception):
    """Base class for scheduler errors."""


class BudgetExceededError(SchedulerError):
    """A reservation or publication would take the ledger past its budget."""

    def __init__(self, message: str, *, wanted: int, free: int) -> None:
        super().__init__(message)
        self.wanted = wanted
        self.free = free


class AdmissionError(SchedulerError):
    """A step could not be admitted even after the whole fallback ladder; the episode's
    published state is untouched and other episodes keep running."""

    def __init__(self, message: str, *, episode_id: str, rungs: tuple[str, ...],
                 need: int, free: int) -> None:
        super().__init__(message)
        self.episode_id = episode_id
        self.rungs = rungs
        self.need = need
        self.free = free


class ContextFullAdmissionError(AdmissionError):
    """No plan of the step fits a sequence's context (``n_ctx_per_seq``), however much memory
    is free: a property of the request (or of the context size), not of the load."""

    def __init__(self, message: str, *, episode_id: str, rungs: tuple[str, ...], need: int,
                 free: int, tokens: int, n_ctx: int) -> None:
        super().__init__(message, episode_id=episode_id, rungs=rungs, need=need, free=free)
        self.tokens, self.n_ctx = tokens, n_ctx


class NoFreeSequenceError(SchedulerError):
    """Every sequence of the engine's context is owned by a live episode."""


class EpisodeClosedError(SchedulerError):
    """The episode was closed; it accepts no more work."""


class IntegrityError(AssertionError):
    """The ledger's accounts and the engine's own report disagree: an internal invariant is
    broken (a bug, not bad input or memory pressure), so it is not a ``SchedulerError`` that
    the episode loop would record as a failed step."""


class NoSpareSequenceError(PolicyRefusedError):
    """The policy cannot run without the scheduler's spare sequence, and this scheduler keeps
    none (``Scheduler(spare_sequence=False)``): refused when the episode opens."""

    def __init__(self, policy_name: str) -> None:
        super().__init__(
            f"policy {policy_name!r} needs a spare sequence for its store's canonical "
            "forwards, and this host keeps none (kvagent run, bench and bench-eval keep one; "
            "kvagent serve and KvAgent do not)")


class ShuttingDownError(SchedulerError):
    """The scheduler is shutting down (``Scheduler.shut_down``): the step was stopped, or
    refused, before publication — rolled back, the episode's published state untouched."""
