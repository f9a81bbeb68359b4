"""``GET /v1/episodes/{id}/lease``: a client holds its episode's lease by keeping this request
open (``runtime/serve/leases.py``).

The answer is a stream of JSON lines, one heartbeat every ``HEARTBEAT_S`` seconds
(``{"episode_id": ..., "open": true}``), for as long as the client keeps the connection and
the episode is open; the last line says why it ends (``"open": false`` — the episode ended
— or ``"draining": true`` — the server is shutting down).  When the connection closes (the
client ended, even with ``os._exit``: the kernel closes its sockets), the lease drops.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import anyio.abc
import structlog
from starlette.types import Receive, Scope, Send

from runtime.serve.host import ModelHost
from runtime.serve.http.server import DRAIN_SCOPE_KEY

log = structlog.get_logger("kvagent.serve")

#: Seconds between heartbeats (a client's read timeout must be well above it).
HEARTBEAT_S = 5.0


def line(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode() + b"\n"


class LeaseStream:
    """The ASGI app answering one lease request (the episode was checked: open, the
    caller's)."""

    route = "episode_lease"

    def __init__(self, host: ModelHost, episode_id: str, heartbeat_s: float = HEARTBEAT_S,
                 ) -> None:
        self.host, self.episode_id, self.heartbeat_s = host, episode_id, heartbeat_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host, episode_id = self.host, self.episode_id
        drain = scope[DRAIN_SCOPE_KEY] = anyio.Event()
        ended: dict[str, Any] = {"episode_id": episode_id, "open": True}

        async def watch(tg: anyio.abc.TaskGroup) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            ended["client_gone"] = True
            tg.cancel_scope.cancel()

        async def drained(tg: anyio.abc.TaskGroup) -> None:
            await drain.wait()
            ended["draining"] = True
            tg.cancel_scope.cancel()

        async with host.leases.hold(episode_id):  # held before the client hears so
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/x-ndjson"), (b"cache-control", b"no-cache")]})
            host.metrics.response(self.route, 200)
            async with anyio.create_task_group() as tg:
                tg.start_soon(watch, tg)
                tg.start_soon(drained, tg)
                while host.episodes.busy(episode_id) is not None:
                    await send({"type": "http.response.body", "more_body": True,
                                "body": line({"episode_id": episode_id, "open": True})})
                    await anyio.sleep(self.heartbeat_s)
                ended["open"] = False
                tg.cancel_scope.cancel()
        if not ended.get("client_gone"):
            ended.pop("client_gone", None)
            await send({"type": "http.response.body", "body": line(ended),
                        "more_body": False})
