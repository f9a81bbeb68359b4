"""A synchronous client of ``kvagent serve``'s episode API (what ``KvAgent(server=URL)`` uses).

OSWorld's runners are synchronous, so this is an ``httpx.Client``: one connection pool per
agent, every request with a timeout.  Retries are limited to what cannot run a step twice:

* 429 (every episode slot taken) and 503 (the memory budget cannot take the step now): the
  server refused before changing anything (a refused step is rolled back), so the same
  request is sent again after ``Retry-After``, until ``retry_s`` has passed;
* a connection that could not be opened (the server is starting or restarting): retried
  the same way, with a growing pause.

A step whose answer was lost (read timeout, connection dropped mid-request) is NOT retried:
the server may have decided it, and sending the screenshot again would decide a second
step.  Everything else is an ``EpisodeApiError`` carrying the server's OpenAI-shaped message.

With an API key every request carries ``Authorization: Bearer <key>`` (the key is never
logged).  ``lease_request`` describes the request that holds an episode's lease (held by
``runtime.osworld.lease`` on its own thread).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from typing import Any

import httpx
import structlog

log = structlog.get_logger("kvagent.client")

#: Statuses the server uses for "refused before doing anything, retry later".
RETRYABLE = (429, 503)
#: Seconds to wait for a connection; a step's answer may take much longer (``timeout``).
CONNECT_TIMEOUT_S = 10.0


class EpisodeApiError(Exception):
    """The server answered with an error (or could not be reached in time)."""

    def __init__(self, message: str, *, status: int | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    @property
    def episode_gone(self) -> bool:
        """The episode is not open on the server (ended, given to another client after being
        idle, or the server restarted)."""
        return self.status == 404 and self.code == "episode_not_found"


class EpisodeClient:
    """Speaks the episode API of one server.  Not thread-safe (one agent, one thread)."""

    def __init__(self, base_url: str, *, timeout: float = 600.0, retry_s: float = 600.0,
                 api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"server must be an http(s) URL, got {base_url!r}")
        if not (timeout > 0 and retry_s >= 0):
            raise ValueError("timeout must be positive and retry_s not negative")
        if api_key is not None and (not api_key or any(c.isspace() for c in api_key)):
            raise ValueError("api_key must be a non-empty string without spaces")
        self.base_url, self.retry_s = base_url.rstrip("/"), retry_s
        #: the headers every request carries (the key's, if any)
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.base_url, transport=transport, headers=self.headers,
            timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S))

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ the API

    def create(self, instruction: str, *, screen: tuple[int, int] | None,
               options: Mapping[str, Any]) -> str:
        body: dict[str, Any] = {"instruction": instruction, "options": dict(options)}
        if screen is not None:
            body["screen"] = list(screen)
        answer = self._request("POST", "/v1/episodes", json=body)
        episode_id = answer.get("episode_id")
        if not isinstance(episode_id, str):
            raise EpisodeApiError(f"the server's answer has no episode id: {answer!r}")
        return episode_id

    def step(self, episode_id: str, png: bytes) -> dict[str, Any]:
        return self._request("POST", f"/v1/episodes/{episode_id}/step",
                             json={"screenshot": base64.b64encode(png).decode("ascii")})

    def describe(self, episode_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/episodes/{episode_id}")

    def end(self, episode_id: str, *, timeout: float | None = None) -> None:
        """End the episode (its cache is freed); an episode already gone is fine."""
        try:
            self._request("DELETE", f"/v1/episodes/{episode_id}", retry=False,
                          timeout=timeout)
        except EpisodeApiError as exc:
            if not exc.episode_gone:
                raise

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def lease_path(self, episode_id: str) -> str:
        """The request that holds ``episode_id``'s lease (a heartbeat stream)."""
        return f"/v1/episodes/{episode_id}/lease"

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, *, json: Any = None, retry: bool = True,
                 timeout: float | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + (self.retry_s if retry else 0.0)
        pause, attempt, status = 0.5, 0, None
        extra = {} if timeout is None else {"timeout": timeout}
        while True:
            attempt += 1
            try:
                r = self._http.request(method, path, json=json, **extra)
            except httpx.ConnectError as exc:  # nothing was sent: safe to try again
                why, wait, status = f"cannot connect to {self.base_url}: {exc}", pause, None
                pause = min(pause * 2, 10.0)
            except httpx.TimeoutException as exc:
                raise EpisodeApiError(f"{method} {path}: no answer from {self.base_url} in "
                                      f"time ({type(exc).__name__}); the step may have been "
                                      "decided on the server") from exc
            except httpx.HTTPError as exc:
                raise EpisodeApiError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            else:
                if r.status_code < 400:
                    return r.json() if r.content else {}
                message, code = _error_of(r)
                if r.status_code not in RETRYABLE:
                    raise EpisodeApiError(f"{method} {path}: {r.status_code} {message}",
                                          status=r.status_code, code=code)
                why, wait = f"{r.status_code} {message}", _retry_after(r, pause)
                status = r.status_code
            left = deadline - time.monotonic()
            if not retry or left <= 0:
                raise EpisodeApiError(f"{method} {path}: gave up after {attempt} attempt(s): "
                                      f"{why}", status=status)
            log.info("episode_api_retry", method=method, path=path, attempt=attempt,
                     reason=why, wait_s=round(min(wait, left), 2))
            time.sleep(min(wait, left))


def _error_of(r: httpx.Response) -> tuple[str, str | None]:
    """The message and code of an OpenAI-shaped error body (or the raw text)."""
    try:
        error = r.json()["error"]
        return str(error.get("message")), error.get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        return r.text[:500], None


def _retry_after(r: httpx.Response, default: float) -> float:
    value = r.headers.get("retry-after", "")
    try:
        return min(max(float(value), 0.05), 60.0)
    except ValueError:
        return default
