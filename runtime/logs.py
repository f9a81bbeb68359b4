"""structlog configuration: console output on a TTY, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys

import structlog


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of the write.

    Binding the stream object at configuration time breaks when it is later replaced and
    closed (a test's captured stderr, a daemon that redirects it): every log call after that
    would raise "I/O operation on closed file" from inside the caller."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


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
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
