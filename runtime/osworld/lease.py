"""A remote agent's episode lease: one long request per episode, held on a thread the agent
owns, whose end tells the server the agent is gone (``runtime/serve/leases.py``).

OSWorld's workers end with ``os._exit``: no ``close``, no finalizer, no atexit hook runs.
What does happen is the kernel closing the process's sockets — this request's among them —
so the server ends the worker's last episode soon after (``--lease-grace-seconds``) instead
of holding its slot until ``--idle-seconds``.

``LeaseKeeper`` starts an anyio blocking portal (its event-loop thread) on first use and
holds at most one lease at a time: ``hold(episode_id)`` opens the request and returns once
the server answered it, so the episode's steps are sent with the lease held (the request is
reopened after a dropped connection, with a growing pause, until the server says the
episode is gone);
``release`` cancels it and waits; ``close`` also stops the loop and joins its thread.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import httpx
import structlog

log = structlog.get_logger("kvagent.osworld")

#: Seconds without a heartbeat (the server sends one every 5 s) before the request is
#: reopened; seconds to wait for it to open.
READ_TIMEOUT_S, CONNECT_TIMEOUT_S = 30.0, 10.0
#: Seconds ``release`` waits for the lease task to end.
RELEASE_TIMEOUT_S = 10.0
PORTAL_THREAD_PREFIX = "kvagent-lease"


class LeaseKeeper:
    """Holds one episode lease at a time for an agent (see the module docstring).  Called
    from one thread (the agent's)."""

    def __init__(self, base_url: str, headers: dict[str, str], *, name: str,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url, self._headers, self.name = base_url, dict(headers), name
        self._transport = transport
        self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] | None = None
        self._portal: anyio.from_thread.BlockingPortal | None = None
        self._thread: threading.Thread | None = None
        self._held: tuple[str, anyio.CancelScope, Future[None]] | None = None
        self._closed = False

    @property
    def held(self) -> str | None:
        """The episode whose lease is held (None: none)."""
        return self._held[0] if self._held is not None and not self._held[2].done() else None

    def hold(self, episode_id: str) -> None:
        """Hold ``episode_id``'s lease (releasing the one held before); returns once the
        server answered the lease request (or it could not, within ``CONNECT_TIMEOUT_S``),
        so the episode's first step is sent with its lease held."""
        self.release()
        if self._closed:
            return
        portal = self._started()
        answered = threading.Event()
        future, scope = portal.start_task(self._keep, episode_id, answered,
                                          name=f"lease-{episode_id[:12]}")
        self._held = (episode_id, scope, future)
        if not answered.wait(timeout=CONNECT_TIMEOUT_S):
            log.warning("remote_lease_slow", agent=self.name, episode_id=episode_id,
                        waited_s=CONNECT_TIMEOUT_S)

    def release(self) -> None:
        """Let the held lease go (the server then ends the episode unless it is ended)."""
        held, self._held = self._held, None
        if held is None or self._portal is None:
            return
        _, scope, future = held
        if threading.current_thread() is self._thread:
            scope.cancel()  # (from the loop itself: cannot wait for it)
            return
        try:
            self._portal.call(scope.cancel)
            future.result(timeout=RELEASE_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001  a lease that will not stop: the loop's end
            log.warning("remote_lease_release_failed", agent=self.name, error=repr(exc))

    def close(self) -> None:
        """Release the lease, stop the loop and join its thread.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.release()
        cm, self._portal_cm, self._portal = self._portal_cm, None, None
        if cm is not None and threading.current_thread() is not self._thread:
            cm.__exit__(None, None, None)

    # ------------------------------------------------------------------ the loop's side

    def _started(self) -> anyio.from_thread.BlockingPortal:
        if self._portal is None:
            self._portal_cm = anyio.from_thread.start_blocking_portal(
                name=f"{PORTAL_THREAD_PREFIX}-{self.name}")
            self._portal = self._portal_cm.__enter__()
            self._thread = self._portal.call(threading.current_thread)
        return self._portal

    async def _keep(self, episode_id: str, answered: threading.Event, *,
                    task_status: anyio.abc.TaskStatus[anyio.CancelScope]) -> None:
        """Hold the lease until cancelled (or the episode is gone); ``answered`` is set once
        the server answered the first request (or gave up trying)."""
        with anyio.CancelScope() as scope:
            task_status.started(scope)
            try:
                await self._reopen(episode_id, answered)
            finally:
                answered.set()

    async def _reopen(self, episode_id: str, answered: threading.Event) -> None:
        path = f"/v1/episodes/{episode_id}/lease"
        pause = 0.5
        async with httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, transport=self._transport,
                timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)) as http:
            while True:
                try:
                    async with http.stream("GET", path) as r:
                        answered.set()  # the lease is held (200) or refused
                        if r.status_code in (401, 403, 404):
                            log.info("remote_lease_refused", agent=self.name,
                                     episode_id=episode_id, status=r.status_code)
                            return  # gone (or not this key's): nothing to hold
                        if r.status_code == 200:
                            pause = 0.5
                            async for text in r.aiter_lines():
                                if not _still_open(text):
                                    return  # the episode ended on the server
                except httpx.HTTPError as exc:  # dropped, refused, timed out: reopen
                    log.info("remote_lease_reopen", agent=self.name, episode_id=episode_id,
                             reason=type(exc).__name__)
                await anyio.sleep(pause)
                pause = min(pause * 2, 10.0)


def _still_open(text: str) -> bool:
    """False when a heartbeat line says the episode is no longer open."""
    if not text.strip():
        return True
    try:
        beat: Any = json.loads(text)
    except ValueError:
        return True
    return not (isinstance(beat, dict) and beat.get("open") is False)
