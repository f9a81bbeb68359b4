"""structlog configuration: console output on a TTY, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(level: str = "warning", *, json: bool | None = None) -> None:
    """Route structlog to stderr at ``level``; JSON when stderr is not a terminal."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level: {level}")
    use_json = (not sys.stderr.isatty()) if json is None else json
    renderer = (structlog.processors.JSONRenderer() if use_json
                else structlog.dev.ConsoleRenderer(colors=False))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
