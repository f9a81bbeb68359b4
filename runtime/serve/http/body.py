"""A request's body: read within ``Limits.max_body_bytes`` and ``Limits.body_timeout_s`` (a
declared or actual size over the limit is a 413 before anything is parsed; a client that
sends too slowly gets a 408) and, for the JSON APIs, parsed into an object — every way a body
can be bad is a 400: not JSON, ``NaN`` / ``Infinity``, an integer of more digits than Python
converts, nesting deeper than ``Limits.max_json_depth`` (checked again after parsing, so no
later code recurses into it), more values than ``Limits.max_json_items``, a string with a
lone UTF-16 surrogate (``"\\ud800"``: valid JSON, but no UTF-8 text).  A body that says it
is something else than JSON (``Content-Type`` present and not ``application/json`` or
``*/*+json``) is a 415 before it is read: a web page's "simple" cross-site request (a
form's or ``text/plain`` POST, which a browser sends without asking the server first)
cannot reach a JSON route.  Used by ``kvagent serve`` and the cluster's front door alike.

Memory: a body's bytes are reserved in the server-wide ``BodyBudget`` before they are read,
until its request's handler returns (a model host) or until it is parsed or handed over (the
front door), so bodies never hold more than ``Limits.body_budget_bytes`` at once. A body of
declared length is read into one buffer of exactly that size (no growth, no copy) and
emptied as soon as it is decoded to text, so a body costs at most twice its bytes while it
is parsed (the text and the values made from it); one without a declared size grows as its
chunks arrive, reserving each first."""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from runtime.serve.config import Limits
from runtime.serve.http.body_budget import Reservation, reservation_for
from runtime.serve.http.errors import ApiError, bad_request, too_large


def check_json_type(request: Request) -> None:
    """415 unless the request's ``Content-Type`` (when it has one) is JSON."""
    given = request.headers.get("content-type")
    if given is None:
        return  # (no type: curl and raw clients; a browser's cross-site request says one
        # or is refused by its Origin on a keyless server, by its missing key otherwise)
    media = given.partition(";")[0].strip().lower()
    if media == "application/json" or (media.startswith("application/")
                                        and media.endswith("+json")):
        return
    raise ApiError(415, f"the request body must be JSON: send 'Content-Type: "
                        f"application/json' (this one is {given[:100]!r})",
                   "invalid_request_error", None, "unsupported_media_type")


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body's bytes (a copy the caller keeps: its reservation ends here)."""
    check_json_type(request)
    async with reservation_for(request, limits) as held:
        return bytes(await _read(request, limits, held))


async def _read(request: Request, limits: Limits, held: Reservation) -> bytearray:
    """The body in a buffer whose bytes ``held`` reserves (before they are read)."""
    limit = limits.max_body_bytes
    length = request.headers.get("content-length")
    declared = int(length) if length is not None and length.isdigit() else None
    if declared is not None and declared > limit:
        raise too_large(f"the request body has {length} bytes; the limit is {limit}")
    if declared is not None:
        await held.grow(declared)  # (its wait is the budget's, not the body's deadline)
    try:
        with anyio.fail_after(limits.body_timeout_s):
            if declared is not None:
                body = bytearray(declared)
                view, filled = memoryview(body), 0
                async for chunk in request.stream():
                    if filled + len(chunk) > declared:  # (h11 refuses this already)
                        raise bad_request("the request body is longer than its "
                                          "Content-Length")
                    view[filled:filled + len(chunk)] = chunk
                    filled += len(chunk)
                view.release()
                if filled != declared:
                    raise bad_request("the client disconnected while sending the body")
                return body
            body = bytearray()
            async for chunk in request.stream():
                if len(body) + len(chunk) > limit:
                    raise too_large(f"the request body is larger than {limit} bytes")
                await held.grow(len(chunk))
                body.extend(chunk)
            return body
    except ClientDisconnect:
        raise bad_request("the client disconnected while sending the body") from None
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within "
                            f"{limits.body_timeout_s:g} s", "invalid_request_error", None,
                       "request_timeout") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes | bytearray, limits: Limits) -> dict[str, Any]:
    """``body`` as a JSON object (400 for anything else; see the module docstring).  A
    ``bytearray`` is emptied once decoded (``decode_json``): the caller's buffer and the
    text are not held both while the parser makes its values."""
    if len(body) > limits.max_body_bytes:
        raise too_large(f"the request body has {len(body)} bytes; the limit is "
                        f"{limits.max_body_bytes}")
    if body.count(b",") > limits.max_json_items:
        raise too_large(f"the request body has more than {limits.max_json_items} JSON values")
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")
    except (UnicodeDecodeError, LookupError) as exc:
        raise bad_request(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    if isinstance(body, bytearray):
        body.clear()  # (frees its memory: the text holds the body now)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request(f"the request body's JSON is nested deeper than "
                          f"{limits.max_json_depth}") from None
    except ValueError as exc:  # JSONDecodeError, int digits, NaN
        raise bad_request(f"the request body is not valid JSON: {str(exc)[:200]}") from None
    del text
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    check_json(data, limits.max_json_depth)
    return data


def check_json(data: Any, max_depth: int) -> None:
    """400 unless ``data`` nests at most ``max_depth`` deep and holds only UTF-8-encodable
    strings (keys too).  Iterative: no recursion, whatever it holds."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value)
        elif isinstance(value, dict | list):
            if depth > max_depth:
                raise bad_request(f"the request body's JSON is nested deeper than {max_depth}")
            if isinstance(value, dict):
                for key, item in value.items():
                    _check_text(key)
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in value)


def _check_text(text: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request("the request body holds a string with a lone UTF-16 "
                              "surrogate (\\ud800-\\udfff): not text") from None


async def read_json(request: Request, limits: Limits) -> dict[str, Any]:
    """The body as a JSON object; its bytes are reserved in the body budget from before
    they are read (until the request's reservation ends: ``reservation_for``)."""
    check_json_type(request)
    async with reservation_for(request, limits) as held:
        return parse_json(await _read(request, limits, held), limits)
