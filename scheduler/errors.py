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


class NoFreeSequenceError(SchedulerError):
    """Every sequence of the engine's context is owned by a live episode."""


class EpisodeClosedError(SchedulerError):
    """The episode was closed; it accepts no more work."""


class IntegrityError(AssertionError):
    """The ledger's accounts and the engine's own report disagree: an internal invariant is
    broken (a bug, not bad input or memory pressure), so it is not a ``SchedulerError`` that
    the episode loop would record as a failed step."""
