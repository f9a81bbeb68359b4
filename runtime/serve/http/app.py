"""The HTTP face of the model host: a Starlette app (ASGI; served by uvicorn).

Routes: ``GET /health``, ``GET /v1/models``, ``GET /metrics`` (Prometheus text),
``POST /v1/chat/completions`` (OpenAI-compatible, ``stream`` = SSE), and the episode API
(``POST /v1/episodes``, ``POST /v1/episodes/{id}/step``, ``DELETE /v1/episodes/{id}``).

Every failure is an OpenAI-shaped JSON error with the right status: 400 for bad input,
404 unknown model / episode, 409 a step of that episode is already running, 413 too large,
429 every episode slot is busy (retry later), 503 the memory budget cannot take the step.
An unexpected exception is logged with its cause and answered 500 without internals.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from cachepolicy.errors import ContextFullError, ImageError, KvagentCacheError
from runtime.pool import EpisodeBusyError, PoolFullError, UnknownEpisodeError
from runtime.serve import episodes
from runtime.serve.http.errors import ApiError, bad_request, busy, not_found, too_large, unavailable
from runtime.serve.config import ServeConfig
from runtime.serve.host import ModelHost
from runtime.serve.http.chat_requests import parse_json
from scheduler.errors import AdmissionError, ContextFullAdmissionError

log = structlog.get_logger("kvagent.serve")

Handler = Callable[[ModelHost, Request], Awaitable[Response]]


def api_error(exc: BaseException) -> ApiError:
    """The HTTP error a failure maps to (an ``ApiError`` as is)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownEpisodeError):
        return not_found(str(exc), param="episode_id", code="episode_not_found")
    if isinstance(exc, EpisodeBusyError):
        return ApiError(409, str(exc), "invalid_request_error", None, "episode_busy")
    if isinstance(exc, PoolFullError):
        return busy(f"{exc}; retry later or end an episode")
    if isinstance(exc, ContextFullAdmissionError):  # the request, not the load
        return bad_request(f"the prompt does not fit the context: {exc}",
                           code="context_length_exceeded")
    if isinstance(exc, AdmissionError):
        return unavailable(f"the memory budget cannot take this step now: {exc}")
    if isinstance(exc, ContextFullError):
        return bad_request(f"the prompt does not fit the context: {exc}",
                           code="context_length_exceeded")
    if isinstance(exc, ImageError):
        return bad_request(str(exc), code="invalid_image")
    if isinstance(exc, KvagentCacheError):
        return bad_request(str(exc))
    return ApiError(500, "internal error (see the server log)", "server_error")


async def read_json(request: Request, host: ModelHost) -> dict[str, Any]:
    limit = host.config.limits.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(f"the request body has {length} bytes; the limit is {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise too_large(f"the request body is larger than {limit} bytes")
    except ClientDisconnect:
        raise bad_request("the client disconnected while sending the body") from None
    return parse_json(bytes(body), host.config.limits)


def _route(host_ref: list[ModelHost], name: str, handler: Handler) -> Callable[[Request],
                                                                               Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        host = host_ref[0]
        try:
            response = await handler(host, request)
        except Exception as exc:  # noqa: BLE001  every failure becomes an HTTP error;
            error = api_error(exc)  # cancellation (BaseException) passes through
            if error.status >= 500:
                log.error("serve_error", route=name, error=f"{type(exc).__name__}: {exc}",
                          exc_info=exc if error.status == 500 else None)
            headers = ({"Retry-After": f"{error.retry_after:g}"}
                       if error.retry_after is not None else None)
            response = JSONResponse(error.body(), status_code=error.status, headers=headers)
        status = getattr(response, "status_code", None)
        if status is not None:  # (a stream records its own status when it knows it)
            host.metrics.response(name, status)
        return response
    return endpoint


async def _health(host: ModelHost, request: Request) -> Response:
    return JSONResponse(host.status())


async def _models(host: ModelHost, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [
        {"id": host.model_name, "object": "model", "created": 0, "owned_by": "kvagent"}]})


async def _metrics(host: ModelHost, request: Request) -> Response:
    return PlainTextResponse(host.metrics.exposition(host.gauges()),
                             media_type="text/plain; version=0.0.4")


async def _episode_create(host: ModelHost, request: Request) -> Response:
    return JSONResponse(await episodes.create(host, await read_json(request, host)),
                        status_code=201)


async def _episode_step(host: ModelHost, request: Request) -> Response:
    body = await read_json(request, host)
    return JSONResponse(await episodes.step(host, request.path_params["episode_id"], body))


async def _episode_list(host: ModelHost, request: Request) -> Response:
    return JSONResponse(episodes.listing(host))


async def _episode_get(host: ModelHost, request: Request) -> Response:
    return JSONResponse(episodes.describe(host, request.path_params["episode_id"]))


async def _episode_end(host: ModelHost, request: Request) -> Response:
    await episodes.end(host, request.path_params["episode_id"])
    return Response(status_code=204)


async def _chat(host: ModelHost, request: Request) -> Response:
    from runtime.serve.chat import chat_completions

    return await chat_completions(host, await read_json(request, host), request.headers)


def create_app(config: ServeConfig, *,
               on_ready: Callable[[ModelHost], None] | None = None) -> Starlette:
    """The app; its lifespan runs the model host (loaded at startup, closed at shutdown)."""
    host_ref: list[ModelHost] = []

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with ModelHost.running(config) as host:
            host_ref.append(host)
            if on_ready is not None:
                on_ready(host)
            yield

    routes = [
        Route("/health", _route(host_ref, "health", _health), methods=["GET"]),
        Route("/v1/models", _route(host_ref, "models", _models), methods=["GET"]),
        Route("/metrics", _route(host_ref, "metrics", _metrics), methods=["GET"]),
        Route("/v1/chat/completions", _route(host_ref, "chat", _chat), methods=["POST"]),
        Route("/v1/episodes", _route(host_ref, "episode_create", _episode_create),
              methods=["POST"]),
        Route("/v1/episodes", _route(host_ref, "episode_list", _episode_list), methods=["GET"]),
        Route("/v1/episodes/{episode_id}", _route(host_ref, "episode_get", _episode_get),
              methods=["GET"]),
        Route("/v1/episodes/{episode_id}/step", _route(host_ref, "episode_step", _episode_step),
              methods=["POST"]),
        Route("/v1/episodes/{episode_id}", _route(host_ref, "episode_end", _episode_end),
              methods=["DELETE"]),
    ]
    async def no_route(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        error = ApiError(status, f"{request.method} {request.url.path}: "
                                 f"{'no such route' if status == 404 else 'method not allowed'}",
                         code="unknown_route")
        return JSONResponse(error.body(), status_code=status)

    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: no_route, 405: no_route})
