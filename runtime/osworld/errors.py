"""The OSWorld agent's errors (``KvAgent``, both backends)."""

from __future__ import annotations


class KvAgentError(Exception):
    """Base class of the OSWorld agent's errors."""


class AgentClosedError(KvAgentError):
    """The agent was closed; it takes no more calls."""


class AgentStepError(KvAgentError):
    """The engine, the scheduler or the server could not decide this step (the episode's
    cache state is rolled back; the next ``predict`` may try again, ``reset`` starts over)."""
