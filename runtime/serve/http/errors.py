"""Errors of the HTTP APIs, in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` with the matching HTTP status.  Bad input is a 4xx with a clear message — never
a 500; 429 / 503 say admission failed (retry later)."""

from __future__ import annotations

from typing import Any

import attrs


@attrs.define(eq=False)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after: float | None = None  # seconds, for 429 / 503

    def __attrs_post_init__(self) -> None:
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", param, code)


def too_large(message: str, *, param: str | None = None) -> ApiError:
    return ApiError(413, message, "invalid_request_error", param, "request_too_large")


def not_found(message: str, *, param: str | None = None,
              code: str = "not_found") -> ApiError:
    return ApiError(404, message, "invalid_request_error", param, code)


def busy(message: str, *, retry_after: float = 1.0) -> ApiError:
    """Admission failed: every episode slot (or the memory budget) is taken right now."""
    return ApiError(429, message, "rate_limit_error", None, "too_many_episodes",
                    retry_after=retry_after)


def unavailable(message: str, *, retry_after: float = 5.0) -> ApiError:
    return ApiError(503, message, "server_error", None, "unavailable", retry_after=retry_after)
