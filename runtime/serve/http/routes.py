"""The HTTP routes of ``kvagent serve`` — ONE table, bound by both apps that speak them: a
model host (``runtime/serve/http/app.py``) and a cluster's front door
(``runtime/cluster/frontdoor.py``), so the two cannot drift apart.

A route is (method, path, name).  The name is the handler's: an app binds the table to an
object with one async method per name (``bind``), each wrapped by the app's own guard (its
error handling, its accounting), and is the ``route`` label of the response metrics and the
logs.  An unknown path (404) or method (405) gets an OpenAI-shaped error
(``unknown_route_handlers``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import attrs
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ExceptionHandler

from runtime.serve.http.errors import ApiError, error_response

Endpoint = Callable[[Request], Awaitable[Response]]


@attrs.frozen
class RouteSpec:
    method: str
    path: str
    name: str  # the handler method's name; the metrics' and logs' route label


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("GET", "/health", "health"),
    RouteSpec("GET", "/v1/models", "models"),
    RouteSpec("GET", "/metrics", "metrics"),
    RouteSpec("POST", "/v1/chat/completions", "chat"),
    RouteSpec("POST", "/v1/episodes", "episode_create"),
    RouteSpec("GET", "/v1/episodes", "episode_list"),
    RouteSpec("GET", "/v1/episodes/{episode_id}", "episode_get"),
    RouteSpec("POST", "/v1/episodes/{episode_id}/step", "episode_step"),
    RouteSpec("DELETE", "/v1/episodes/{episode_id}", "episode_end"),
    RouteSpec("GET", "/v1/episodes/{episode_id}/lease", "episode_lease"),
)


def bind(handlers: object, guard: Callable[[str, Endpoint], Endpoint]) -> list[Route]:
    """Starlette routes for ``ROUTES``: each one's endpoint is ``handlers.<name>`` wrapped as
    ``guard(name, endpoint)``.  Raises ``TypeError`` when ``handlers`` lacks one."""
    missing = [r.name for r in ROUTES if not callable(getattr(handlers, r.name, None))]
    if missing:
        raise TypeError(f"{type(handlers).__name__} has no handler for {missing}")
    return [Route(r.path, guard(r.name, getattr(handlers, r.name)), methods=[r.method])
            for r in ROUTES]


def unknown_route_handlers(*, not_allowed: str = "method not allowed",
                           ) -> dict[int, ExceptionHandler]:
    """Starlette's 404 / 405 as OpenAI-shaped errors; ``not_allowed`` words the 405 (each
    app keeps the wording it had)."""
    async def unknown(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return error_response(ApiError(
            status, f"{request.method} {request.url.path}: "
                    f"{'no such route' if status == 404 else not_allowed}",
            code="unknown_route"))

    return {404: unknown, 405: unknown}
