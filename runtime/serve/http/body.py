"""A request's body: read within ``Limits.max_body_bytes`` (a declared or actual size over
it is a 413 before anything is parsed) and, for the JSON APIs, parsed into an object.  Used
by ``kvagent serve`` and the cluster's front door alike."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from runtime.serve.config import Limits
from runtime.serve.http.errors import bad_request, too_large


async def read_body(request: Request, limits: Limits) -> bytes:
    limit = limits.max_body_bytes
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
    return bytes(body)


def parse_json(body: bytes, limits: Limits) -> dict[str, Any]:
    """``body`` as a JSON object (400 for anything else)."""
    if len(body) > limits.max_body_bytes:
        raise too_large(f"the request body has {len(body)} bytes; the limit is "
                        f"{limits.max_body_bytes}")
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise bad_request("the request body must be a JSON object")
    return data


async def read_json(request: Request, limits: Limits) -> dict[str, Any]:
    return parse_json(await read_body(request, limits), limits)
