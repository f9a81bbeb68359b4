"""uvicorn for kvagent's apps (``kvagent serve``, a cluster's hosts and front door), with the
connection limits a shared server needs (``Limits``):

- a request's head must arrive within ``header_timeout_s`` of the connection opening (or of
  the previous response): uvicorn has no such deadline, so a client that sends a few header
  bytes and stops ("slowloris") would hold its socket for ever.  ``GuardedH11Protocol``
  closes it;
- at most ``max_connections`` connections are open, and one peer has at most
  ``max_waiting_per_peer`` of them waiting for a request head: a newcomer over either cap
  closes the connection that has waited longest for its head (``connection_cap.py``), so
  sockets held open without a request cannot lock other clients out; only when every
  connection is serving a request is the newcomer closed as it is accepted (its file
  descriptor freed at once);
- a request's head is at most ``max_head_bytes`` however it arrives (431, and the
  connection closed, before the app sees it): h11's own limit applies only to a head that
  is still incomplete, so a complete 100 KB head in one write would pass it;
- an idle keep-alive connection is closed after ``keep_alive_s`` (uvicorn's
  ``timeout_keep_alive``); the body's own deadline and budget are read by ``body.py``
  (408, 503).

Streams (chat completions, leases) have their head and hold their connection as long as
they run; at shutdown a lease's stream is told to end (``DRAIN_SCOPE_KEY``) rather than
waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from typing import Any

import h11
import structlog
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from runtime.serve.config import Limits
from runtime.serve.http.connection_cap import Waiting, closing_for, peer_of
from runtime.serve.http.errors import ApiError, StartupRefusedError

log = structlog.get_logger("kvagent.serve")

#: At most one log line per this many seconds about refused connections.
LOG_EVERY_S = 10.0
#: A long-lived response (a lease) puts an ``anyio.Event`` here in its scope: set when the
#: server shuts down, it ends the response.
DRAIN_SCOPE_KEY = "kvagent.drain"


class HeadCappedConnection(h11.Connection):
    """h11's server connection with a cap on a request head's bytes that holds for a
    complete head too (h11's ``max_incomplete_event_size`` only bounds an incomplete one):
    before each event that would be a request head, the bytes up to the head's blank line
    are counted; more than ``max_head_bytes`` raise h11's ``RemoteProtocolError`` (status
    hint 431) before h11 parses it — whichever way the bytes arrived (one write, many,
    pipelined behind another request)."""

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.head_too_large = False

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE and not self.head_too_large:
            data, _ = self.trailing_data  # (unparsed bytes; at most a read's worth here)
            # a buffer no longer than the cap cannot hold a head over it
            if len(data) > self.max_head_bytes:
                end = _HEAD_END.search(data, 0, self.max_head_bytes + 4)
                if end is None or end.end() > self.max_head_bytes:
                    self.head_too_large = True
        if self.head_too_large:
            raise h11.RemoteProtocolError(
                f"the request head is larger than {self.max_head_bytes} bytes",
                error_status_hint=431)
        return super().next_event()


#: The end of a request head as h11 finds it (its ``blank_line_regex``).
_HEAD_END = re.compile(b"\n\r?\n")


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request's head, a cap on its bytes
    and caps on open and waiting connections (``limits``: set on the subclass
    ``guarded_protocol`` makes)."""

    limits: Limits = Limits()
    _last_log = 0.0
    _refused = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = HeadCappedConnection(self.limits.max_head_bytes)
        self._head_deadline: asyncio.TimerHandle | None = None
        #: when this connection began to wait for its current request head (monotonic)
        self._waiting_since = time.monotonic()
        self._peer = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = time.monotonic()
        self._peer = peer_of(self.client)
        if not self._admit():
            transport.abort()  # its file descriptor is free now; connection_lost follows
            return
        self._arm()

    def _admit(self) -> bool:
        """Make room for this new connection (``connection_cap.closing_for``): close the
        connections it evicts; False: close this one instead."""
        limits = self.limits
        # (a connection already closing is not counted: its descriptor is freed within
        # this turn of the event loop)
        others = [c for c in self.connections if c is not self
                  and not (c.transport is not None and c.transport.is_closing())]
        if (len(others) < limits.max_connections
                and len(others) < limits.max_waiting_per_peer):
            return True  # (no cap can be exceeded: skip the scan)
        waiting = [Waiting(c, c._peer, c._waiting_since) for c in others
                   if isinstance(c, GuardedH11Protocol) and c.waits_for_head()]
        closing = closing_for(self._peer, len(others) + 1, waiting,
                              max_connections=limits.max_connections,
                              max_waiting_per_peer=limits.max_waiting_per_peer)
        for victim in closing.evict:
            assert isinstance(victim, GuardedH11Protocol)
            victim.transport.abort()
        if closing.evict:
            self._note("serve_connection_evicted", evicted=len(closing.evict), reason=(
                "the longest wait for a request head, to make room for a new connection"))
        if closing.refuse_new:
            self._note("serve_connection_refused", reason=(
                f"{limits.max_connections} connections open, each serving a request"))
        return not closing.refuse_new

    def waits_for_head(self) -> bool:
        """Has this connection not sent (all of) its current request's head — just opened,
        half-sent, or idle between requests?  (Never true while a request is served.)"""
        if self.transport is None or self.transport.is_closing():
            return False
        if self.cycle is not None and not self.cycle.response_complete:
            return False  # (a response is being written: the head it answers arrived)
        return self.conn.their_state is h11.IDLE

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a head still coming (or none yet)
            self._arm()
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        self._waiting_since = time.monotonic()  # (keep-alive: now it waits for the next)
        super().on_response_complete()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse; a head over ``max_head_bytes``
        is a 431 instead, in the API's JSON shape (the connection closes either way)."""
        conn = self.conn
        if not (isinstance(conn, HeadCappedConnection) and conn.head_too_large):
            super().send_400_response(msg)
            return
        self._note("serve_head_too_large",
                   reason=f"a request head over {self.limits.max_head_bytes} bytes")
        body = json.dumps(ApiError(
            431, f"the request head (request line and headers) is larger than "
                 f"{self.limits.max_head_bytes} bytes", code="request_header_too_large",
        ).body()).encode()
        for event in (h11.Response(status_code=431, reason=b"Request Header Fields Too Large",
                                   headers=[(b"content-type", b"application/json"),
                                            (b"connection", b"close")]),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(conn.send(event) or b"")
        self.transport.close()

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
        if self.waits_for_head():
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
        h11_max_incomplete_event_size=limits.max_head_bytes))
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
