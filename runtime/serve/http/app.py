"""The HTTP face of the model host: a Starlette app (ASGI; served by uvicorn).

Routes (``routes.ROUTES``): ``GET /health``, ``GET /v1/models``, ``GET /metrics``
(Prometheus text), ``POST /v1/chat/completions`` (OpenAI-compatible, ``stream`` = SSE), and
the episode API (``POST /v1/episodes``, ``GET /v1/episodes``, ``GET /v1/episodes/{id}``,
``POST /v1/episodes/{id}/step``, ``DELETE /v1/episodes/{id}``, ``GET
/v1/episodes/{id}/lease``); handlers in ``handlers.py``.  With API keys (``auth.py``) every
route but ``/health`` answers 401 without one of them; what a request opens belongs to its
key.  Without keys, a request from a web page of another origin or for another host name
(DNS rebinding) is a 403 (``local_only.py``).

Every failure is an OpenAI-shaped JSON error with the right status (``errors.api_error``):
400 for bad input, 404 unknown model / episode, 409 a step of that episode is already
running, 413 too large, 429 every episode slot is busy (retry later), 503 the memory budget
cannot take the step.  An unexpected exception is logged with its cause and answered 500
without internals.  Every response is counted by route and status (a stream counts its own
when it knows it).

A host that fails while shutting down (an episode that does not close, the final integrity
check, the engine's release) says so: ``app.state.shutdown_error`` holds the cause
(``shutdown_error(app)``), so ``kvagent serve`` exits non-zero naming it — uvicorn alone
logs the failure and exits 0.  A host that refuses its configuration at startup (a policy
the model cannot run) raises ``StartupRefusedError``: ``startup_refusal(app)`` holds the
reason, which ``kvagent serve`` prints as one line, and uvicorn's traceback of it is dropped
(``server.quiet_refusals``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response

from cachepolicy.errors import KvagentCacheError
from runtime.errors import describe_error
from runtime.serve.config import ServeConfig
from runtime.serve.host import ModelHost
from runtime.serve.http.auth import ApiKeys
from runtime.serve.http.body_budget import request_reservation
from runtime.serve.http.errors import StartupRefusedError, api_error, error_response
from runtime.serve.http.handlers import HostHandlers
from runtime.serve.http.local_only import client_guards
from runtime.serve.http.routes import Endpoint, bind, unknown_route_handlers

log = structlog.get_logger("kvagent.serve")


def create_app(config: ServeConfig, *, keys: ApiKeys = ApiKeys(),
               on_ready: Callable[[ModelHost], None] | None = None) -> Starlette:
    """The app; its lifespan runs the model host (loaded at startup, closed at shutdown);
    ``keys``: the API keys it takes (none: no check)."""
    handlers = HostHandlers()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        app.state.shutdown_error = None
        app.state.startup_refusal = None
        started = False
        try:
            async with ModelHost.running(config) as host:
                handlers.attach(host)
                if on_ready is not None:
                    on_ready(host)
                started = True
                yield
        except KvagentCacheError as exc:  # a policy the model or the host cannot run
            if started:
                raise
            app.state.startup_refusal = str(exc)
            raise StartupRefusedError(str(exc)) from exc
        except Exception as exc:
            if started:  # (a failed startup is the server not starting: told otherwise)
                app.state.shutdown_error = describe_error(exc)
                log.error("serve_shutdown_failed", error=app.state.shutdown_error)
            raise  # uvicorn logs the traceback

    def guard(name: str, handler: Endpoint) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            host = handlers.host
            try:
                # the body this handler reads stays in the body budget until it returns
                async with request_reservation(request, host.config.limits):
                    response = await handler(request)
            except Exception as exc:  # noqa: BLE001  every failure becomes an HTTP error;
                error = api_error(exc)  # cancellation (BaseException) passes through
                if error.status >= 500:
                    log.error("serve_error", route=name, error=f"{type(exc).__name__}: {exc}",
                              exc_info=exc if error.status == 500 else None)
                response = error_response(error)
            status = getattr(response, "status_code", None)
            if status is not None:  # (a stream records its own status when it knows it)
                host.metrics.response(name, status)
            return response
        return endpoint

    # a keyless server refuses web pages of other origins and rebound host names
    # (local_only.py); with keys, the key protects
    middleware = client_guards(keys, config.allow_hosts, config.allow_origins)
    app = Starlette(routes=bind(handlers, guard), lifespan=lifespan, middleware=middleware,
                    exception_handlers=unknown_route_handlers())
    app.state.shutdown_error = None
    return app


def startup_refusal(app: Starlette) -> str | None:
    """Why ``app``'s host refused to start (its configuration), or None."""
    return getattr(app.state, "startup_refusal", None)


def shutdown_error(app: Starlette) -> str | None:
    """Why ``app``'s host failed to shut down cleanly (``"Type: message"``), or None."""
    error: str | None = app.state.shutdown_error
    return error
