"""The cluster's HTTP front door: the same routes as ``kvagent serve``, forwarded to hosts.

The front door takes the clients' API keys (``runtime/serve/http/auth.py``: 401 without one)
and acts for the client's key id: episodes belong to it (``router.py``), and every request
to a host carries the cluster's internal key and the client's key id (``forward.py``), so
the hosts check ownership of conversations and listings as a single server does.

Episode requests go where the router says; the hosts' answers (and their errors, already
in OpenAI's shape) pass through unchanged, with an ``X-Kvagent-Host`` header naming the host
that served.  Chat completions stick to a host by conversation: the
``X-Kvagent-Conversation`` header, else the request's ``user``, else a hash of its first
system and user messages (the prefix a host has cached) — each within the client's key;
they are streamed through as the host sends them.  A client's episode lease is relayed
(``lease.py``).  ``/health``, ``/metrics`` and ``GET /v1/episodes`` gather every host's
report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from runtime.cluster import metrics as cluster_metrics
from runtime.cluster.forward import Forwarded, HostLost
from runtime.cluster.lease import LeaseRelay
from runtime.cluster.router import Router
from runtime.serve.config import Limits
from runtime.serve.http.auth import ApiKeys, owner_of
from runtime.serve.http.local_only import client_guards
from runtime.serve.http.body import parse_json, read_body
from runtime.serve.http.chat_requests import CONVERSATION_HEADER
from runtime.serve.http.errors import ApiError, bad_request, error_response, unavailable
from runtime.serve.http.routes import Endpoint, bind, unknown_route_handlers
from runtime.serve.owners import ANONYMOUS, Owner

log = structlog.get_logger("kvagent.cluster")

HOST_HEADER = "x-kvagent-host"


def conversation_key(headers: Mapping[str, str], body: dict[str, Any],
                     owner: Owner = ANONYMOUS) -> str:
    """The chat affinity key of ``owner``'s request (see the module docstring)."""
    key = _affinity(headers, body)
    return f"{owner}/{key}"


def _affinity(headers: Mapping[str, str], body: dict[str, Any]) -> str:
    explicit = headers.get(CONVERSATION_HEADER)
    if explicit:
        return "h:" + explicit
    if isinstance(body.get("user"), str) and body["user"]:
        return "u:" + body["user"]
    messages = body.get("messages") if isinstance(body.get("messages"), list) else []
    head = [m for m in messages if isinstance(m, dict) and m.get("role") in
            ("system", "developer")][:1]
    head += [m for m in messages if isinstance(m, dict) and m.get("role") == "user"][:1]
    digest = hashlib.sha256(json.dumps([body.get("model"), head], sort_keys=True,
                                       default=str).encode()).hexdigest()
    return "p:" + digest[:32]


def _chat_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """What a chat request passes on to its host besides the key: its conversation."""
    name = headers.get(CONVERSATION_HEADER)
    return {CONVERSATION_HEADER: name} if name else {}


def _passed(out: Forwarded) -> Response:
    return Response(out.content, status_code=out.status,
                    headers={**out.headers, HOST_HEADER: out.host})


def _guard(name: str, handler: Endpoint) -> Endpoint:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            return error_response(error)
        except Exception as exc:  # noqa: BLE001  cancellation (BaseException) passes
            log.error("cluster_front_door_error", route=name, error=repr(exc), exc_info=exc)
            return error_response(ApiError(500, "internal error (see the front door's log)",
                                           "server_error"))
    return endpoint


def create_front_door(router: Router, limits: Limits = Limits(),
                      keys: ApiKeys = ApiKeys(), *, allow_hosts: tuple[str, ...] = (),
                      allow_origins: tuple[str, ...] = ()) -> Starlette:
    """The front door's app (the router runs elsewhere: see ``runtime/commands/cluster``);
    ``keys``: the clients' API keys (without any, web pages are refused as by a model host:
    ``allow_hosts`` / ``allow_origins`` add names)."""
    return Starlette(routes=bind(FrontDoorHandlers(router, limits), _guard),
                     middleware=client_guards(keys, allow_hosts, allow_origins),
                     exception_handlers=unknown_route_handlers(not_allowed="not allowed"))


class FrontDoorHandlers:
    """One method per route of ``runtime.serve.http.routes.ROUTES`` (by name): the same
    routes as a model host, forwarded (see the module docstring)."""

    def __init__(self, router: Router, limits: Limits) -> None:
        self.router, self.limits = router, limits

    async def health(self, request: Request) -> Response:
        router = self.router
        hosts: dict[str, Any] = {}
        total = {"open": 0, "max": 0}
        ledger = {"budget_bytes": 0, "held_bytes": 0, "reserved_bytes": 0, "peak_bytes": 0}
        statuses = await _statuses(router)
        for name, host in router.hosts.items():
            status = statuses.get(name)
            hosts[name] = {"alive": status is not None, "url": host.info.url,
                           "pid": host.info.pid, "node_id": host.info.node_id}
            if status is not None:
                hosts[name].update(episodes=status["episodes"], ledger=status["ledger"])
                for k in total:
                    total[k] += status["episodes"][k]
                for k in ledger:
                    ledger[k] += status["ledger"][k]
        alive = bool(statuses)
        return JSONResponse({"status": "ok" if alive else "unavailable", "hosts": hosts,
                             "episodes": {**total, "routed": len(router.episodes)},
                             "ledger": ledger, "failovers": router.failovers},
                            status_code=200 if alive else 503)

    async def models(self, request: Request) -> Response:
        for host in self.router.alive():
            try:
                return _passed(await self.router.http.forward(host, "GET", "/v1/models", b"",
                                                              owner_of(request.scope)))
            except HostLost:
                continue
        raise unavailable("no model host is running")

    async def metrics(self, request: Request) -> Response:
        router = self.router
        parts: list[Any] = []

        async def ask(actor: Any) -> None:
            try:
                with anyio.fail_after(10):
                    parts.append(await actor.metrics.remote())
            except Exception:  # noqa: BLE001  a lost host is reported as lost
                pass

        async with anyio.create_task_group() as tg:
            for host in router.alive():
                tg.start_soon(ask, host.actor)
        statuses = await _statuses(router)
        hosts: dict[str, Any] = {name: statuses.get(name) for name in router.hosts}
        text = cluster_metrics.exposition(parts, cluster_metrics.cluster_gauges(
            hosts, routed=len(router.episodes), failovers=router.failovers,
            lost=router.lost))
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def episode_create(self, request: Request) -> Response:
        body = parse_json(await read_body(request, self.limits), self.limits)
        status, answer, host = await self.router.create(body, owner_of(request.scope))
        headers = {HOST_HEADER: host} if host else {}
        if status in (429, 503):
            headers["Retry-After"] = "1"
        return JSONResponse(answer, status_code=status, headers=headers)

    async def episode_step(self, request: Request) -> Response:
        episode_id, owner = request.path_params["episode_id"], owner_of(request.scope)
        self.router.episode(episode_id, owner)  # 404 before reading a large body
        raw = await read_body(request, self.limits)
        shot = parse_json(raw, self.limits).get("screenshot")
        if not isinstance(shot, str) or not shot:
            raise bad_request("'screenshot' must be a base64 string", param="screenshot")
        return _passed(await self.router.step(episode_id, owner, raw, shot))

    async def episode_lease(self, request: Request) -> Response:
        owner = owner_of(request.scope)
        ep = self.router.episode(request.path_params["episode_id"], owner)
        return LeaseRelay(self.router, ep, owner)  # type: ignore[return-value]

    async def episode_list(self, request: Request) -> Response:
        data: list[dict[str, Any]] = []
        for host in self.router.alive():
            try:
                out = await self.router.http.forward(host, "GET", "/v1/episodes", b"",
                                                     owner_of(request.scope))
            except HostLost:
                continue
            if out.status == 200:
                data += [{**item, "host": host.name} for item in json.loads(out.content)["data"]]
        return JSONResponse({"object": "list", "data": data})

    async def episode_get(self, request: Request) -> Response:
        router, owner = self.router, owner_of(request.scope)
        episode_id = request.path_params["episode_id"]
        routed = router.episodes.get(episode_id)
        if routed is not None and routed.owner != owner:
            routed = None  # (another key's: the hosts answer 404 for it, as for any)
        hosts = ([routed.host] if routed is not None and routed.host is not None
                 and routed.host.alive else router.alive())
        for host in hosts:  # a chat conversation: whichever host has it
            try:
                out = await router.http.forward(host, "GET", f"/v1/episodes/{episode_id}",
                                                b"", owner)
            except HostLost:
                continue
            if out.status != 404:
                return _passed(out)
        router.episode(episode_id, owner)  # 404 unless routed (then: its host was lost)
        raise unavailable(f"episode {episode_id}'s host was lost; its next step rebuilds it")

    async def episode_end(self, request: Request) -> Response:
        owner = owner_of(request.scope)
        episode_id = request.path_params["episode_id"]
        if episode_id not in self.router.episodes:  # a chat conversation: its host ends it
            for host in self.router.alive():
                try:
                    out = await self.router.http.forward(
                        host, "DELETE", f"/v1/episodes/{episode_id}", b"", owner)
                except HostLost:
                    continue
                if out.status != 404:
                    return _passed(out)
        out = await self.router.end(episode_id, owner)
        return _passed(out) if out is not None else Response(status_code=204)

    async def chat(self, request: Request) -> Response:
        router, owner = self.router, owner_of(request.scope)
        raw = await read_body(request, self.limits)
        body = parse_json(raw, self.limits)
        key = conversation_key(request.headers, body, owner)
        for _ in range(2):
            host = router.conversation_host(key) or await router.best_host()
            try:
                upstream = await router.http.stream(host, "POST", "/v1/chat/completions",
                                                    raw, owner, headers=_chat_headers(
                                                        request.headers))
            except HostLost:
                continue
            router.remember_conversation(key, host)
            passed = {k: v for k, v in upstream.headers.items()
                      if k.lower() in ("content-type", "retry-after", "cache-control")}
            return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                     headers={**passed, HOST_HEADER: host.name},
                                     background=BackgroundTask(upstream.aclose))
        raise unavailable("the conversation's host was lost twice; retry")


async def _statuses(router: Router) -> dict[str, Any]:
    out: dict[str, Any] = {}

    async def ask(name: str, actor: Any) -> None:
        try:
            with anyio.fail_after(10):
                out[name] = await actor.status.remote()
        except Exception:  # noqa: BLE001  reported as not alive
            pass

    async with anyio.create_task_group() as tg:
        for host in router.alive():
            tg.start_soon(ask, host.name, host.actor)
    return out
