"""The front door's HTTP side: one request to a host, answered whole or streamed.

Every request carries the cluster's internal key (hosts take no other) and the client's key
id (``X-Kvagent-Owner``, which a host trusts only with that key): a host checks ownership
for the front door's clients exactly as for its own.  A transport failure (connection
refused or reset, the host's process gone) marks the host lost through the router's
callback and raises ``HostLost``; so does the router cancelling the request because Ray saw
the host die (``HostHandle.inflight``).  A timeout is a 504 for the client, not a loss: a
slow step is not a dead host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import attrs
import httpx

from runtime.cluster.spawn import HostHandle
from runtime.serve.http.auth import OWNER_HEADER
from runtime.serve.http.errors import ApiError
from runtime.serve.owners import Owner


class HostLost(Exception):
    """The host died (or stopped answering) while serving a request."""


@attrs.define
class Forwarded:
    """A host's HTTP answer as the front door passes it on."""

    status: int
    content: bytes
    headers: dict[str, str]
    host: str


class Forwarder:
    """An HTTP client to the hosts; ``lost(host, reason)`` is called when one fails;
    ``internal_key``: the cluster's key, sent with every request."""

    def __init__(self, lost: Callable[[HostHandle, str], None], *,
                 internal_key: str | None = None, read_timeout_s: float = 600.0) -> None:
        self._lost = lost
        self._auth = {"authorization": f"Bearer {internal_key}"} if internal_key else {}
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(read_timeout_s, connect=10.0),
                                       limits=httpx.Limits(max_connections=256))

    async def aclose(self) -> None:
        await self._http.aclose()

    def headers(self, owner: Owner | None, extra: dict[str, str] | None = None,
                ) -> dict[str, str]:
        """A request's headers to a host: JSON, the internal key, the client's key id."""
        out = {**_JSON, **(extra or {}), **self._auth}
        if owner is not None:
            out[OWNER_HEADER] = owner
        return out

    async def forward(self, host: HostHandle, method: str, path: str, content: bytes,
                      owner: Owner | None = None) -> Forwarded:
        """One request to ``host`` on ``owner``'s behalf, answered whole.  ``HostLost`` if
        the host dies or cannot be reached (it is then marked lost)."""
        scope = anyio.CancelScope()
        host.inflight.add(scope)
        try:
            with self._reaching(host), scope:
                r = await self._http.request(method, host.info.url + path, content=content,
                                             headers=self.headers(owner))
                return Forwarded(r.status_code, r.content, _passed_headers(r), host.name)
            raise HostLost(host.name)  # only the host's loss cancels this scope
        finally:
            host.inflight.discard(scope)

    async def stream(self, host: HostHandle, method: str, path: str, content: bytes,
                     owner: Owner | None, *, headers: dict[str, str] | None = None,
                     timeout: httpx.Timeout | None = None) -> httpx.Response:
        """Open a streamed request to ``host`` (the caller closes the response).  Raises
        ``HostLost`` if the host cannot be reached."""
        extra = {} if timeout is None else {"timeout": timeout}
        request = self._http.build_request(method, host.info.url + path, content=content,
                                           headers=self.headers(owner, headers), **extra)
        with self._reaching(host):
            return await self._http.send(request, stream=True)

    @contextmanager
    def _reaching(self, host: HostHandle) -> Iterator[None]:
        """httpx's failures as the front door's: a timeout is a 504 (a slow step is not a
        dead host), a transport failure marks the host lost and raises ``HostLost``."""
        try:
            yield
        except httpx.TimeoutException:
            raise ApiError(504, f"host {host.name} did not answer in time", "server_error",
                           None, "host_timeout", retry_after=5.0) from None
        except httpx.TransportError as exc:
            self._lost(host, f"{type(exc).__name__}: {exc}")
            raise HostLost(host.name) from exc


_JSON = {"content-type": "application/json"}


def _passed_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.lower() in ("content-type", "retry-after")}
