"""API keys: who may call a server, and whose episodes a request is about.

``kvagent serve --api-key K`` (repeatable), ``$KVAGENT_API_KEY`` (comma-separated) and
``--api-key-file F`` (one key a line) give the keys; every route but ``GET /health`` then
needs ``Authorization: Bearer <key>``, as llama-server and vLLM ask — without it, or with a
wrong one, the answer is 401 in OpenAI's shape.  A key is known by its id (``key-1``,
``key-2``, … in the order given) in the domain and in logs, never by its text; the key's id
is the owner of what the request opens (``runtime/serve/owners.py``).  Keys are compared in
constant time (``hmac.compare_digest``, against every key).

A cluster adds an internal key, generated per cluster: its host actors take only that key,
from the front door, which names the client's key id in ``X-Kvagent-Owner`` (trusted only
with the internal key).  Without any key a server has one tenant (``ANONYMOUS``) and checks
nothing — ``kvagent serve`` then listens on loopback only.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs
from starlette.types import ASGIApp, Receive, Scope, Send

from runtime.serve.owners import ANONYMOUS, Owner

#: Where the authenticated owner rides in the ASGI scope (read with ``owner_of``).
OWNER_SCOPE_KEY = "kvagent.owner"
#: The header a cluster's front door names the client's key id in (internal key only).
OWNER_HEADER = "x-kvagent-owner"
#: The routes anyone may call.
OPEN_PATHS = frozenset({"/health"})
#: Keys shorter than this are refused: a key is a password.
MIN_KEY_CHARS = 8


class ApiKeyError(ValueError):
    """A key given to the server is not usable (empty, short, blank characters)."""


def _check_key(key: str, source: str) -> str:
    """``key`` if usable.  Printable ASCII only (``!`` to ``~``): a client sends it in an
    HTTP header, which carries bytes that clients encode differently (httpx refuses
    non-ASCII text, others send UTF-8 or Latin-1), so a key with any other character could
    never be matched.  The message names the problem and where the key came from, never
    the key."""
    if len(key) < MIN_KEY_CHARS:
        raise ApiKeyError(f"{source}: an API key must be at least {MIN_KEY_CHARS} characters")
    if not all("!" <= c <= "~" for c in key):
        raise ApiKeyError(f"{source}: an API key must be printable ASCII characters (! to "
                          "~) without spaces: this one has a space, a control character "
                          "or a non-ASCII character")
    return key


@attrs.frozen
class ApiKeys:
    """The keys a server takes (their text never in a repr or a log)."""

    keys: tuple[str, ...] = attrs.field(default=(), repr=False)
    #: a cluster's front-door key (its hosts take only it): trusts ``X-Kvagent-Owner``
    internal: str | None = attrs.field(default=None, repr=False)

    @property
    def required(self) -> bool:
        return bool(self.keys) or self.internal is not None

    def __repr__(self) -> str:
        return f"ApiKeys({len(self.keys)} keys, internal={self.internal is not None})"

    @classmethod
    def gather(cls, given: Iterable[str] = (), env: str | None = None,
               files: Iterable[Path] = ()) -> ApiKeys:
        """The keys from the command line, the environment variable's value
        (comma-separated) and key files (one a line; blank lines and ``#`` comments
        skipped), in that order — the order gives their ids."""
        keys: list[str] = [_check_key(k, "--api-key") for k in given]
        if env:
            keys += [_check_key(k.strip(), "KVAGENT_API_KEY") for k in env.split(",")
                     if k.strip()]
        for path in files:
            try:
                lines = Path(path).read_text().splitlines()
            except OSError as exc:
                raise ApiKeyError(f"--api-key-file {path}: {exc.strerror}") from None
            keys += [_check_key(x.strip(), f"--api-key-file {path}") for x in lines
                     if x.strip() and not x.lstrip().startswith("#")]
        return cls(tuple(dict.fromkeys(keys)))

    def owner(self, authorization: str | None, named: str | None) -> Owner | None:
        """The owner a request acts for (None: refused).  ``authorization``: the
        ``Authorization`` header; ``named``: ``X-Kvagent-Owner`` (internal key only)."""
        if not self.required:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        given = token.strip().encode()
        found: Owner | None = None
        for i, key in enumerate(self.keys):  # every key compared: no early exit
            if hmac.compare_digest(given, key.encode()) and found is None:
                found = f"key-{i + 1}"
        if self.internal is not None and hmac.compare_digest(given, self.internal.encode()):
            found = named or ANONYMOUS
        return found


def owner_of(scope: Mapping[str, object]) -> Owner:
    """The owner the auth middleware found for this request."""
    owner = scope.get(OWNER_SCOPE_KEY)
    return owner if isinstance(owner, str) else ANONYMOUS


def scope_headers(scope: Scope) -> dict[str, str]:
    """An ASGI scope's headers as lower-case names to values (latin-1, as HTTP sends them)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


class RequireKey:
    """ASGI middleware: 401 unless the request carries a key the server takes (every path
    but ``OPEN_PATHS``); the owner it found goes into the scope for the handlers."""

    def __init__(self, app: ASGIApp, keys: ApiKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope_headers(scope)
        owner = self.keys.owner(headers.get("authorization"), headers.get(OWNER_HEADER))
        if owner is None and scope.get("path") not in OPEN_PATHS:
            await _unauthorized(send, "authorization" in headers)
            return
        scope[OWNER_SCOPE_KEY] = owner or ANONYMOUS
        await self.app(scope, receive, send)


async def _unauthorized(send: Send, had_header: bool) -> None:
    message = ("invalid API key" if had_header else
               "this server needs an API key: send 'Authorization: Bearer <key>'")
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": "invalid_api_key"}}).encode()
    await send({"type": "http.response.start", "status": 401, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", b'Bearer realm="kvagent"')]})
    await send({"type": "http.response.body", "body": body})
