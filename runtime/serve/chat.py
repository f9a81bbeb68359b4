"""Placeholder until chat completions land (see runtime/serve/__init__.py)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from runtime.serve.errors import ApiError
from runtime.serve.host import ModelHost


async def chat_completions(host: ModelHost, body: dict[str, Any]) -> Response:
    raise ApiError(501, "chat completions are not implemented yet", "server_error")
