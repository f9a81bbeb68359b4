"""A request's body: read within ``Limits.max_body_bytes`` and ``Limits.body_timeout_s`` (a
declared or actual size over the limit is a 413 before anything is parsed; a client that
sends too slowly gets a 408) and, for the JSON APIs, parsed into an object — every way a body
can be bad is a 400: not JSON, ``NaN`` / ``Infinity``, an integer of more digits than Python
converts, nesting deeper than ``Limits.max_json_depth`` (checked again after parsing, so no
later code recurses into it), more values than ``Limits.max_json_items``, a string with a
lone UTF-16 surrogate (``"\\ud800"``: valid JSON, but no UTF-8 text).  Used by ``kvagent
serve`` and the cluster's front door alike."""

from __future__ import annotations

import json
from typing import Any

import anyio
from starlette.requests import ClientDisconnect, Request

from runtime.serve.config import Limits
from runtime.serve.http.errors import ApiError, bad_request, too_large


async def read_body(request: Request, limits: Limits) -> bytes:
    limit = limits.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise too_large(f"the request body has {length} bytes; the limit is {limit}")
    body = bytearray()
    try:
        with anyio.fail_after(limits.body_timeout_s):
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise too_large(f"the request body is larger than {limit} bytes")
    except ClientDisconnect:
        raise bad_request("the client disconnected while sending the body") from None
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within "
                            f"{limits.body_timeout_s:g} s", "invalid_request_error", None,
                       "request_timeout") from None
    return bytes(body)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes, limits: Limits) -> dict[str, Any]:
    """``body`` as a JSON object (400 for anything else; see the module docstring)."""
    if len(body) > limits.max_body_bytes:
        raise too_large(f"the request body has {len(body)} bytes; the limit is "
                        f"{limits.max_body_bytes}")
    if body.count(b",") > limits.max_json_items:
        raise too_large(f"the request body has more than {limits.max_json_items} JSON values")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request(f"the request body's JSON is nested deeper than "
                          f"{limits.max_json_depth}") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, int digits, NaN
        raise bad_request(f"the request body is not valid JSON: {str(exc)[:200]}") from None
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
    return parse_json(await read_body(request, limits), limits)
