"""Errors of the HTTP APIs, in OpenAI's shape: ``{"error": {"message", "type", "param",
"code"}}`` with the matching HTTP status — and the ONE place where a failure becomes one.

``api_error`` maps what the layers below raise (the pool's, the scheduler's and the engine's
typed errors; the serve domain raises no HTTP errors) to an ``ApiError``; ``error_response``
makes the response, with ``Retry-After`` for the retryable ones.  Bad input is a 4xx with a
clear message — never a 500; 429 / 503 say admission failed (retry later).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
from starlette.responses import JSONResponse

from cachepolicy.errors import (ContextFullError, GrammarBudgetError, GrammarWorkerError,
                                ImageError, KvagentCacheError)
from runtime.pool import EpisodeBusyError, PoolFullError, UnknownEpisodeError
from scheduler.errors import AdmissionError, ContextFullAdmissionError, ShuttingDownError


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


class StartupRefusedError(Exception):
    """The host refused its configuration at startup (the message is the reason)."""


def api_error(exc: BaseException) -> ApiError:
    """The HTTP error a failure maps to (an ``ApiError`` as is; anything unknown: 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, UnknownEpisodeError):
        return not_found(str(exc), param="episode_id", code="episode_not_found")
    if isinstance(exc, EpisodeBusyError):
        return ApiError(409, str(exc), "invalid_request_error", None, "episode_busy")
    if isinstance(exc, PoolFullError):
        return busy(f"{exc}; retry later or end an episode")
    if isinstance(exc, ContextFullAdmissionError):  # the request, not the load
        return bad_request(f"the prompt does not fit the context: {exc}",
                           code="context_length_exceeded")
    if isinstance(exc, ShuttingDownError):  # the grace period ended: the step rolled back
        return ApiError(503, str(exc), "server_error", None,
                        "server_shutting_down", retry_after=5.0)
    if isinstance(exc, AdmissionError):
        return unavailable(f"the memory budget cannot take this step now: {exc}")
    if isinstance(exc, ContextFullError):
        return bad_request(f"the prompt does not fit the context: {exc}",
                           code="context_length_exceeded")
    if isinstance(exc, GrammarWorkerError):  # the server could not match it: not the client's
        return unavailable(f"the grammar could not be matched now: {exc}")
    if isinstance(exc, GrammarBudgetError):  # the client's grammar, not the server's load
        return bad_request(str(exc), param="grammar", code="grammar_budget_exceeded")
    if isinstance(exc, ImageError):
        return bad_request(str(exc), code="invalid_image")
    if isinstance(exc, KvagentCacheError):
        return bad_request(str(exc))
    return ApiError(500, "internal error (see the server log)", "server_error")


def error_response(error: ApiError) -> JSONResponse:
    """``error`` as a response, with ``Retry-After`` on every 429 / 503 (its own seconds, or
    one): a client told to come back is told when."""
    retry = error.retry_after
    if retry is None and error.status in (429, 503):
        retry = 1.0
    headers = {"Retry-After": f"{max(1, math.ceil(retry)):d}"} if retry is not None else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)
