"""Notes for OSWorld's logs, each written once to each log.

KvAgent writes what it changed in a step (a clamped point, a WAIT for an unreadable
screenshot) to the example's ``runtime.log`` logger that ``reset`` received and to the
``desktopenv`` loggers.  OSWorld's runners attach their files (``normal-*.log``, stdout
filtered to ``desktopenv``) to the *root* logger, and the example's logger
(``desktopenv.example.<id>``) propagates there too: logging the note on both loggers put it
twice in each of the root's files.  ``log_once`` logs on each logger in turn but hands the
record to a handler only if no earlier logger's record reached it — so every log that
should have the note gets it exactly once, whatever the runner's propagation.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

__all__ = ["handlers_reached", "log_once"]

AnyLogger = logging.Logger | logging.LoggerAdapter[Any]


def handlers_reached(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record logged on ``logger`` reaches (logging's own propagation walk)."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found.extend(current.handlers)
        if not current.propagate:
            break
        current = current.parent
    return found


def log_once(level: int, message: str, loggers: Iterable[AnyLogger | None]) -> None:
    """Log ``message`` at ``level`` on each of ``loggers`` (None: skipped), every handler
    getting it at most once (logging's level and filter checks kept).  An object that only
    looks like a logger (has ``log``) is called as it is."""
    seen: set[logging.Handler] = set()
    other = False
    for given in loggers:
        if given is None:
            continue
        msg, logger = message, given
        while isinstance(logger, logging.LoggerAdapter):  # an adapter adds its context
            msg, _ = logger.process(msg, {})
            logger = logger.logger
        if not isinstance(logger, logging.Logger):  # a logger-like object: its own way
            given.log(level, message)
            other = True
            continue
        if logger.disabled or not logger.isEnabledFor(level):
            continue
        record = logger.makeRecord(logger.name, level, __file__, 0, msg, (), None)
        if not logger.filter(record):
            continue
        for handler in handlers_reached(logger):
            if handler not in seen:
                seen.add(handler)
                if level >= handler.level:
                    handler.handle(record)
    last = logging.lastResort  # logging's own fallback when no handler exists anywhere
    if not seen and not other and last is not None and level >= last.level:
        last.handle(logging.makeLogRecord({"msg": message, "levelno": level,
                                           "levelname": logging.getLevelName(level)}))
