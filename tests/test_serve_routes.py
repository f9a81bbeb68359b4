"""The one route table (``runtime/serve/http/routes.py``), bound by ``kvagent serve``'s app
and by the cluster's front door — checked on the apps themselves, without a model or Ray
(the apps' lifespans do not run: nothing is loaded)."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from starlette.applications import Starlette

from runtime.cluster.frontdoor import FrontDoorHandlers, create_front_door
from runtime.cluster.router import Router
from runtime.serve.config import ServeConfig
from runtime.serve.http.app import create_app
from runtime.serve.http.handlers import HostHandlers
from runtime.serve.http.routes import ROUTES, bind

TABLE = {(r.method, r.path) for r in ROUTES}


def _bound(app: Starlette) -> set[tuple[str, str]]:
    return {(m, r.path) for r in app.routes  # type: ignore[attr-defined]
            for m in r.methods if m != "HEAD"}


async def _no_host(name: str) -> Any:
    raise AssertionError("no host is started here")


def _router() -> Router:
    return Router([], start_host=_no_host, kill_host=lambda h: None)


def test_the_table_has_ten_routes_with_distinct_names() -> None:
    assert len(ROUTES) == 10 and len({r.name for r in ROUTES}) == 10 and len(TABLE) == 10


def test_both_apps_bind_exactly_the_table() -> None:
    async def main() -> None:
        router = _router()
        try:
            assert _bound(create_app(ServeConfig())) == TABLE
            assert _bound(create_front_door(router)) == TABLE
        finally:
            await router.http.aclose()

    anyio.run(main)


@pytest.mark.parametrize("handlers", [HostHandlers, FrontDoorHandlers])
def test_each_app_has_a_handler_per_route(handlers: type) -> None:
    assert all(callable(getattr(handlers, r.name, None)) for r in ROUTES)


def test_binding_a_handler_object_that_lacks_a_route_fails() -> None:
    class Partial:
        async def health(self, request: Any) -> Any: ...

    with pytest.raises(TypeError, match="episode_end"):
        bind(Partial(), lambda name, endpoint: endpoint)


def test_unknown_routes_get_openai_errors_from_both_apps() -> None:
    async def main() -> None:
        router = _router()
        apps = [(create_app(ServeConfig()), "method not allowed"),
                (create_front_door(router), "not allowed")]
        try:
            for app, not_allowed in apps:
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                    r = await c.get("/v1/nothing")
                    assert r.status_code == 404, r.text
                    assert r.json() == {"error": {
                        "message": "GET /v1/nothing: no such route",
                        "type": "invalid_request_error", "param": None,
                        "code": "unknown_route"}}
                    r = await c.delete("/health")
                    assert r.status_code == 405, r.text
                    assert r.json()["error"]["message"] == f"DELETE /health: {not_allowed}"
                    assert "retry-after" not in r.headers
        finally:
            await router.http.aclose()

    anyio.run(main)


def test_both_apps_refuse_web_pages_without_keys() -> None:
    """A keyless model host and a keyless front door refuse a foreign Origin and a rebound
    Host alike (``local_only.client_guards``, one list of guards for both)."""
    async def main() -> None:
        router = _router()
        try:
            for app in (create_app(ServeConfig()), create_front_door(router)):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://127.0.0.1:8000") as c:
                    r = await c.get("/v1/nothing", headers={"Origin": "http://evil.example"})
                    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden_origin"
                    r = await c.get("/v1/nothing", headers={"Host": "rebound.example:8000"})
                    assert r.status_code == 403, r.text
                    r = await c.get("/v1/nothing")
                    assert r.status_code == 404, r.text
        finally:
            await router.http.aclose()

    anyio.run(main)
