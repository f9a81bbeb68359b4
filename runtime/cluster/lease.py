"""A client's episode lease through the front door (``GET /v1/episodes/{id}/lease``).

The front door relays the client's lease to the episode's host — the host then treats the
episode as a single server would (a dropped lease gives the slot away, then ends the
episode after the grace: ``runtime/serve/leases.py``) — and counts it itself
(``RoutedEpisode.leases``), so it forgets an episode whose client is gone.  The client's
stream stays open across host losses: while the episode has no live host (its next step
rebuilds it) or the host's lease request fails, the relay sends its own heartbeats and asks
the host again; it ends when the episode is no longer routed (ended, forgotten) or the front
door shuts down.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import httpx
import structlog
from starlette.types import Receive, Scope, Send

from runtime.cluster.forward import HostLost
from runtime.cluster.router import RoutedEpisode, Router
from runtime.serve.http.lease_stream import HEARTBEAT_S, line
from runtime.serve.http.server import DRAIN_SCOPE_KEY
from runtime.serve.owners import Owner

log = structlog.get_logger("kvagent.cluster")


@asynccontextmanager
async def counted(ep: RoutedEpisode) -> AsyncIterator[None]:
    ep.leases += 1
    ep.lease_dropped_at = None
    try:
        yield
    finally:
        ep.leases -= 1
        if ep.leases == 0:
            ep.lease_dropped_at = time.monotonic()


class LeaseRelay:
    """The ASGI app relaying one client lease request (the episode was checked: routed, the
    caller's)."""

    def __init__(self, router: Router, ep: RoutedEpisode, owner: Owner,
                 heartbeat_s: float = HEARTBEAT_S) -> None:
        self.router, self.ep, self.owner, self.heartbeat_s = router, ep, owner, heartbeat_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = scope[DRAIN_SCOPE_KEY] = anyio.Event()
        ep = self.ep
        gone = {"client": False}

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        async def watch(tg: anyio.abc.TaskGroup) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone["client"] = True
            tg.cancel_scope.cancel()

        async def drained(tg: anyio.abc.TaskGroup) -> None:
            await drain.wait()
            tg.cancel_scope.cancel()

        async with counted(ep):
            upstream = await self._open(ep)  # held on the host before the client hears so
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache")]})
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg)
                tg.start_soon(drained, tg)
                try:
                    while self.router.episodes.get(ep.episode_id) is ep:
                        if upstream is not None:
                            await self._pipe(upstream, body)
                            upstream = None
                        await body(line({"episode_id": ep.episode_id, "open": True}))
                        await anyio.sleep(self.heartbeat_s)
                        upstream = await self._open(ep)
                finally:
                    if upstream is not None:
                        with anyio.CancelScope(shield=True):
                            await upstream.aclose()
                tg.cancel_scope.cancel()
        if not gone["client"]:
            open_ = self.router.episodes.get(ep.episode_id) is ep
            await body(line({"episode_id": ep.episode_id, "open": open_}), more=False)

    async def _open(self, ep: RoutedEpisode) -> httpx.Response | None:
        """The episode's lease request to its host, answered 200 (None: no live host, or
        it failed or refused: asked again after a heartbeat)."""
        host = ep.host
        if host is None or not host.alive:
            return None
        path = f"/v1/episodes/{ep.episode_id}/lease"
        timeout = httpx.Timeout(self.heartbeat_s * 6, connect=10.0)
        try:
            upstream = await self.router.http.stream(host, "GET", path, b"", self.owner,
                                                     timeout=timeout)
        except (HostLost, Exception) as exc:  # noqa: BLE001  asked again after a heartbeat
            # (HostLost: the host is marked lost; a 504 ApiError: it did not answer in time)
            log.info("cluster_lease_relay_failed", episode_id=ep.episode_id,
                     host=host.name, error=type(exc).__name__)
            return None
        if upstream.status_code != 200:  # (404: the host gave its slot away; the next step
            await upstream.aclose()      # rebuilds the episode)
            return None
        return upstream

    async def _pipe(self, upstream: httpx.Response,
                    body: Callable[[bytes], Awaitable[None]]) -> None:
        """Pass the host's heartbeats on for as long as its lease request lasts."""
        try:
            async for chunk in upstream.aiter_lines():
                if chunk:
                    await body(chunk.encode() + b"\n")
        except httpx.HTTPError:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                await upstream.aclose()
