"""How kvagent states an error it records: the real cause, never a wrapper.

Task groups wrap what their tasks raise in ``ExceptionGroup``s ("unhandled errors in a
TaskGroup (1 sub-exception)"), which says nothing about why a step failed.  Every error
kvagent records — a failed step's reason, an episode's error, a traj.jsonl ``Error`` line, a
log event — goes through ``describe_error``, which unwraps groups to their leaves.
"""

from __future__ import annotations


def leaf_errors(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``: itself, or every leaf of a (nested) exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaf_errors(sub)]
    return [exc]


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` of the real cause(s) of ``exc``.

    Exception groups are unwrapped (several leaves are joined with ``"; "``); an error
    without a message of its own is described by its ``__cause__`` when it has one."""
    parts = []
    for leaf in leaf_errors(exc):
        text = str(leaf)
        if not text and leaf.__cause__ is not None:
            text = describe_error(leaf.__cause__)
        parts.append(f"{type(leaf).__name__}: {text}" if text else type(leaf).__name__)
    return "; ".join(dict.fromkeys(parts))  # the same cause twice is said once
