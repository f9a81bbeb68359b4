"""No reach from a web page into a server without API keys.

A keyless ``kvagent serve`` listens on loopback, but any web page the user opens can send
requests there: a "simple" cross-site POST (``text/plain``, a form) is sent without asking
the server, and with DNS rebinding (the page's own name re-pointed at 127.0.0.1) the page
can read the answers too — create, step, read and end episodes.  This middleware refuses
(403, JSON) on a server without keys:

- a request whose ``Origin`` header is present and is not the server's own origin: ``http``
  (or ``https``) with a loopback name (``localhost``, ``127.0.0.1`` …, ``[::1]``) or the
  address the request came in on, and the server's port; or one of ``allow_origins``.
  Browsers send ``Origin`` on every cross-origin request and on every POST / DELETE;
  programs (curl, httpx, the OpenAI client, KvAgent) send none, so they are unaffected;
- a request whose ``Host`` header names another host than a loopback name, the address the
  request came in on, or one of ``allow_hosts`` (any port): a rebound name is refused.

With API keys neither is checked: a page cannot send the key (a browser asks before sending
an ``Authorization`` header cross-site, and this server never says yes), so the key protects
every route but ``/health``.  ``body.py``'s 415 for non-JSON bodies closes the simple-request
path on every server.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

import structlog
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.serve.http.auth import ApiKeys, RequireKey, scope_headers
from runtime.serve.http.errors import ApiError, error_response

log = structlog.get_logger("kvagent.serve")

#: Host names that always mean this machine.
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def _is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(authority: str) -> str:
    """``host`` of ``host[:port]`` / ``[v6]:port``, lower case, brackets dropped."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:authority.find("]")] if "]" in authority else authority
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def normal_origin(origin: str) -> str | None:
    """``scheme://host:port`` of an origin (the default port spelled out), or None when it
    is not one (``null``, garbage)."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    port = port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


class LocalOnly:
    """ASGI middleware for a keyless server: 403 for a foreign ``Origin`` or ``Host`` (see
    the module docstring); ``allow_hosts`` / ``allow_origins`` add names it also takes."""

    def __init__(self, app: ASGIApp, allow_hosts: Iterable[str] = (),
                 allow_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.allow_hosts = frozenset(_host_of(h) for h in allow_hosts)
        self.allow_origins = frozenset(o for o in map(normal_origin, allow_origins) if o)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope_headers(scope)
        server = scope.get("server") or ("", 0)
        own_host, own_port = str(server[0]).lower(), server[1]
        problem = None
        host = headers.get("host")
        if host is not None and not self._host_allowed(_host_of(host), own_host):
            problem = (f"this server takes requests for its own address only (a loopback "
                       f"name or {own_host}), not for Host {host[:100]!r}: see --allow-host")
        origin = headers.get("origin")
        if problem is None and origin is not None and not self._origin_allowed(
                origin, own_host, own_port):
            problem = (f"this server has no API key and takes no requests from web pages "
                       f"of another origin ({origin[:100]!r}): see --allow-origin")
        if problem is None:
            await self.app(scope, receive, send)
            return
        log.warning("serve_request_forbidden", path=scope.get("path"),
                    host=(host or "")[:100], origin=(origin or "")[:100])
        response = error_response(ApiError(403, problem, "invalid_request_error", None,
                                           "forbidden_origin"))
        await response(scope, receive, send)

    def _host_allowed(self, host: str, own_host: str) -> bool:
        return _is_loopback(host) or host == own_host or host in self.allow_hosts

    def _origin_allowed(self, origin: str, own_host: str, own_port: int) -> bool:
        normal = normal_origin(origin)
        if normal is None:
            return False  # ("null": a sandboxed frame or a file: page)
        if normal in self.allow_origins:
            return True
        parts = urlsplit(normal)
        return (parts.port == own_port and parts.hostname is not None
                and (_is_loopback(parts.hostname) or parts.hostname == own_host))


def client_guards(keys: ApiKeys, allow_hosts: Iterable[str] = (),
                  allow_origins: Iterable[str] = ()) -> list[Middleware]:
    """What every app a client reaches (a model host, a cluster's front door) checks first:
    the key, and on a server without keys the Origin and Host (``LocalOnly``)."""
    if keys.required:
        return [Middleware(RequireKey, keys=keys)]
    return [Middleware(LocalOnly, allow_hosts=tuple(allow_hosts),
                       allow_origins=tuple(allow_origins)),
            Middleware(RequireKey, keys=keys)]
