"""The cluster's HTTP front door: the same routes as ``kvagent serve``, forwarded to hosts.

Episode requests go where the router says (``router.py``); the hosts' answers (and their
errors, already in OpenAI's shape) pass through unchanged, with an ``X-Kvagent-Host``
header naming the host that served.  Chat completions stick to a host by conversation: the
``X-Kvagent-Conversation`` header, else the request's ``user``, else a hash of its first
system and user messages (the prefix a host has cached); they are streamed through as the
host sends them.  ``/health``, ``/metrics`` and ``GET /v1/episodes`` gather every host's
report.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import structlog
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from runtime.cluster import metrics as cluster_metrics
from runtime.cluster.forward import Forwarded, HostLost
from runtime.cluster.router import Router
from runtime.serve.http.errors import ApiError, bad_request, too_large, unavailable
from runtime.serve.config import Limits
from runtime.serve.http.chat_requests import parse_json

log = structlog.get_logger("kvagent.cluster")

HOST_HEADER = "x-kvagent-host"
CONVERSATION_HEADER = "x-kvagent-conversation"

Handler = Callable[[Request], Awaitable[Response]]


def conversation_key(headers: Any, body: dict[str, Any]) -> str:
    """The chat affinity key (see the module docstring)."""
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


async def read_body(request: Request, limits: Limits) -> bytes:
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limits.max_body_bytes:
        raise too_large(f"the request body has {length} bytes; the limit is "
                        f"{limits.max_body_bytes}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limits.max_body_bytes:
                raise too_large(f"the request body is larger than {limits.max_body_bytes} "
                                "bytes")
    except ClientDisconnect:
        raise bad_request("the client disconnected while sending the body") from None
    return bytes(body)


def _passed(out: Forwarded) -> Response:
    return Response(out.content, status_code=out.status,
                    headers={**out.headers, HOST_HEADER: out.host})


def _error(error: ApiError) -> Response:
    headers = ({"Retry-After": f"{error.retry_after:g}"}
               if error.retry_after is not None else None)
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def _guard(name: str, handler: Handler) -> Handler:
    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as error:
            return _error(error)
        except Exception as exc:  # noqa: BLE001  cancellation (BaseException) passes
            log.error("cluster_front_door_error", route=name, error=repr(exc), exc_info=exc)
            return _error(ApiError(500, "internal error (see the front door's log)",
                                   "server_error"))
    return endpoint


def create_front_door(router: Router, limits: Limits = Limits()) -> Starlette:
    """The front door's app (the router runs elsewhere: see ``runtime/commands/cluster``)."""

    async def health(request: Request) -> Response:
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

    async def models(request: Request) -> Response:
        for host in router.alive():
            try:
                return _passed(await router.http.forward(host, "GET", "/v1/models", b""))
            except HostLost:
                continue
        raise unavailable("no model host is running")

    async def metrics(request: Request) -> Response:
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

    async def episode_create(request: Request) -> Response:
        body = parse_json(await read_body(request, limits), limits)
        status, answer, host = await router.create(body)
        headers = {HOST_HEADER: host} if host else {}
        if status in (429, 503):
            headers["Retry-After"] = "1"
        return JSONResponse(answer, status_code=status, headers=headers)

    async def episode_step(request: Request) -> Response:
        episode_id = request.path_params["episode_id"]
        router.episode(episode_id)  # 404 before reading a large body
        raw = await read_body(request, limits)
        shot = parse_json(raw, limits).get("screenshot")
        if not isinstance(shot, str) or not shot:
            raise bad_request("'screenshot' must be a base64 string", param="screenshot")
        return _passed(await router.step(episode_id, raw, shot))

    async def episode_list(request: Request) -> Response:
        data: list[dict[str, Any]] = []
        for host in router.alive():
            try:
                out = await router.http.forward(host, "GET", "/v1/episodes", b"")
            except HostLost:
                continue
            if out.status == 200:
                data += [{**item, "host": host.name} for item in json.loads(out.content)["data"]]
        return JSONResponse({"object": "list", "data": data})

    async def episode_get(request: Request) -> Response:
        episode_id = request.path_params["episode_id"]
        routed = router.episodes.get(episode_id)
        hosts = ([routed.host] if routed is not None and routed.host is not None
                 and routed.host.alive else router.alive())
        for host in hosts:  # a chat conversation: whichever host has it
            try:
                out = await router.http.forward(host, "GET", f"/v1/episodes/{episode_id}", b"")
            except HostLost:
                continue
            if out.status != 404:
                return _passed(out)
        router.episode(episode_id)  # 404 unless routed (then: its host was lost)
        raise unavailable(f"episode {episode_id}'s host was lost; its next step rebuilds it")

    async def episode_end(request: Request) -> Response:
        out = await router.end(request.path_params["episode_id"])
        return _passed(out) if out is not None else Response(status_code=204)

    async def chat(request: Request) -> Response:
        raw = await read_body(request, limits)
        key = conversation_key(request.headers, parse_json(raw, limits))
        headers = {"content-type": "application/json"}
        for _ in range(2):
            host = router.conversation_host(key) or await router.best_host()
            try:
                upstream = await router.http.stream(host, "/v1/chat/completions", raw, headers)
            except HostLost:
                continue
            router.remember_conversation(key, host)
            passed = {k: v for k, v in upstream.headers.items()
                      if k.lower() in ("content-type", "retry-after", "cache-control")}
            return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code,
                                     headers={**passed, HOST_HEADER: host.name},
                                     background=BackgroundTask(upstream.aclose))
        raise unavailable("the conversation's host was lost twice; retry")

    routes = [
        Route("/health", _guard("health", health), methods=["GET"]),
        Route("/v1/models", _guard("models", models), methods=["GET"]),
        Route("/metrics", _guard("metrics", metrics), methods=["GET"]),
        Route("/v1/chat/completions", _guard("chat", chat), methods=["POST"]),
        Route("/v1/episodes", _guard("episode_create", episode_create), methods=["POST"]),
        Route("/v1/episodes", _guard("episode_list", episode_list), methods=["GET"]),
        Route("/v1/episodes/{episode_id}", _guard("episode_get", episode_get),
              methods=["GET"]),
        Route("/v1/episodes/{episode_id}/step", _guard("episode_step", episode_step),
              methods=["POST"]),
        Route("/v1/episodes/{episode_id}", _guard("episode_end", episode_end),
              methods=["DELETE"]),
    ]

    async def no_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return _error(ApiError(status, f"{request.method} {request.url.path}: "
                                       f"{'no such route' if status == 404 else 'not allowed'}",
                               code="unknown_route"))

    return Starlette(routes=routes, exception_handlers={404: no_route, 405: no_route})


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
