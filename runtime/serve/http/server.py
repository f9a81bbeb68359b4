"""uvicorn for kvagent's apps (``kvagent serve``, a cluster's hosts and front door), with the
connection limits a shared server needs (``Limits``):

- a request's head must arrive within ``header_timeout_s`` of the connection opening (or of
  the previous response): uvicorn has no such deadline, so a client that sends a few header
  bytes and stops ("slowloris") would hold its socket for ever.  ``GuardedH11Protocol``
  closes it;
- at most ``max_connections`` connections are open: more are closed as they are accepted
  (their file descriptors freed at once), so half-open requests cannot exhaust them;
- an idle keep-alive connection is closed after ``keep_alive_s`` (uvicorn's
  ``timeout_keep_alive``); a head is at most h11's 16 KB; the body's own deadline is read by
  ``body.py`` (408).

Streams (chat completions, leases) have their head and hold their connection as long as
they run; at shutdown a lease's stream is told to end (``DRAIN_SCOPE_KEY``) rather than
waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import h11
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from runtime.serve.config import Limits
from runtime.serve.http.errors import StartupRefusedError

log = structlog.get_logger("kvagent.serve")

#: At most one log line per this many seconds about refused connections.
LOG_EVERY_S = 10.0
#: A long-lived response (a lease) puts an ``anyio.Event`` here in its scope: set when the
#: server shuts down, it ends the response.
DRAIN_SCOPE_KEY = "kvagent.drain"


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head and a cap on open
    connections (``limits``: set on the subclass ``guarded_protocol`` makes)."""

    limits: Limits = Limits()
    _last_log = 0.0
    _refused = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.limits.max_connections:
            self._note("serve_connection_refused",
                       reason=f"more than {self.limits.max_connections} connections open")
            transport.abort()  # its file descriptor is free now; connection_lost follows
            return
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a head still coming (or none yet)
            self._arm()
        else:
            self._disarm()

    def shutdown(self) -> None:
        """The server is shutting down: a held stream that would never end (a lease) is
        told to end its response now (``DRAIN_SCOPE_KEY``), so the graceful shutdown does
        not wait for it."""
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            drain = cycle.scope.get(DRAIN_SCOPE_KEY)  # type: ignore[attr-defined]
            if drain is not None:
                drain.set()
        super().shutdown()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if getattr(self, "_head_deadline", None) is None:
            self._head_deadline = self.loop.call_later(self.limits.header_timeout_s,
                                                       self._head_timeout)

    def _disarm(self) -> None:
        timer = getattr(self, "_head_deadline", None)
        if timer is not None:
            timer.cancel()
            self._head_deadline = None

    def _head_timeout(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            if self.cycle is not None and not self.cycle.response_complete:
                return  # (a response is being written: the head it answers arrived)
            self._note("serve_connection_timeout", reason=(
                f"no complete request head within {self.limits.header_timeout_s:g} s"))
            self.transport.abort()

    @classmethod
    def _note(cls, event: str, **fields: Any) -> None:
        cls._refused += 1
        now = time.monotonic()
        if now - GuardedH11Protocol._last_log >= LOG_EVERY_S:
            GuardedH11Protocol._last_log = now
            log.warning(event, connections_closed=cls._refused, **fields)


def guarded_protocol(limits: Limits) -> type[GuardedH11Protocol]:
    """A protocol class with ``limits`` (uvicorn makes one instance per connection)."""
    return type("KvagentH11Protocol", (GuardedH11Protocol,), {"limits": limits})


def uvicorn_server(app: Any, limits: Limits, *, grace_s: float, lifespan: str) -> uvicorn.Server:
    """A ``uvicorn.Server`` for ``app`` with ``limits`` on its connections; kvagent owns the
    signals (the caller handles SIGINT / SIGTERM: uvicorn would re-raise them after its
    shutdown, turning a clean SIGTERM into a traceback)."""
    server = uvicorn.Server(uvicorn.Config(
        app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=grace_s,
        http=guarded_protocol(limits), timeout_keep_alive=int(max(1, limits.keep_alive_s)),
        h11_max_incomplete_event_size=16 * 1024))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
    _quiet_refusals()
    return server


class _DropRefusalTraceback(logging.Filter):
    """uvicorn logs a failed lifespan startup as the traceback's text (Starlette's
    ``lifespan.startup.failed`` message); a refused configuration (``StartupRefusedError``)
    is told as one line by ``kvagent serve`` instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, StartupRefusedError)
                    or StartupRefusedError.__name__ in record.getMessage())


def _quiet_refusals() -> None:
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _DropRefusalTraceback) for f in logger.filters):
        logger.addFilter(_DropRefusalTraceback())
