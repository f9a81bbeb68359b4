"""A synchronous OSWorld agent that speaks the episode API (``kvagent serve``, with or
without ``--ray``): what OSWorld's workers run against a shared model.

Stand-in until ``KvAgent(server=URL)`` exists: it keeps the OSWorld contract (``reset``,
``predict(instruction, obs) -> (response, [code])``, ``action_space``, ``close``) and does
what the in-process agent does with a decision: the served ``action`` (kvagent's action
language, pixels of the screenshot) is parsed into a record, moved onto the screen's pixels
and turned into pyautogui code here (model text is never executed or forwarded).

429 / 503 answers (every slot busy, a lost host with no room yet) are retried after their
``Retry-After``, within ``retry_s``; other errors raise ``ServedAgentError``.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Mapping
from typing import Any

import httpx
import structlog

from runtime.actions import parse_action
from vmenv.actions import WAIT, rescale, to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.png import screenshot_png

log = structlog.get_logger("kvagent.client")


class ServedAgentError(RuntimeError):
    """The server refused a request for a reason a retry does not fix."""


class ServedAgent:
    """See the module docstring.  ``options``: the episode options (``policy``, ``window``,
    ``temperature``, ``seed``, ...); ``screen_size``: the VM's screen (DesktopEnv's)."""

    action_space = "pyautogui"

    def __init__(self, url: str, *, screen_size: tuple[int, int] = (1920, 1080),
                 options: Mapping[str, Any] | None = None, timeout_s: float = 600.0,
                 retry_s: float = 600.0) -> None:
        self.url, self.screen_size = url.rstrip("/"), tuple(screen_size)
        self.options = dict(options or {})
        self.retry_s = retry_s
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s,
                                                                           connect=10.0))
        self._episode: str | None = None
        self.last_info: dict[str, Any] = {}

    def reset(self, _logger: Any = None, vm_ip: str | None = None, **kwargs: Any) -> None:
        """A new task: end the previous episode (its next ``predict`` opens a new one)."""
        self._end()

    def predict(self, instruction: str, obs: Mapping[str, Any],
                **kwargs: Any) -> tuple[str, list[str]]:
        shot = obs.get("screenshot") if isinstance(obs, Mapping) else None
        if shot is None:
            return "", [WAIT]  # the VM did not answer: look again
        try:
            _, size = screenshot_png(bytes(shot))
        except (ScreenshotError, TypeError):
            return "", [WAIT]
        if self._episode is None:
            body = {"instruction": instruction, "screen": list(size), "options": self.options}
            self._episode = self._call("POST", "/v1/episodes", body)["episode_id"]
        out = self._call("POST", f"/v1/episodes/{self._episode}/step",
                         {"screenshot": base64.b64encode(bytes(shot)).decode()})
        action = parse_action(out["action"] or "", screen=size)
        code = to_pyautogui(rescale(action, size, self.screen_size))
        self.last_info = {**out["info"], "code": code, "episode_id": self._episode}
        return out["response"], [code]

    def close(self) -> None:
        try:
            self._end()
        finally:
            self._http.close()

    def __enter__(self) -> ServedAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _end(self) -> None:
        if self._episode is not None:
            episode, self._episode = self._episode, None
            try:
                self._http.delete(f"/v1/episodes/{episode}")
            except httpx.HTTPError as exc:  # the server frees it anyway when it stops
                log.warning("client_end_failed", episode_id=episode, error=repr(exc))

    def _call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + self.retry_s
        while True:
            r = self._http.request(method, path, json=body)
            if r.status_code < 300:
                return r.json()
            if r.status_code in (429, 503) and time.monotonic() < deadline:
                wait = float(r.headers.get("retry-after", "1") or 1)
                log.info("client_retry", path=path, status=r.status_code, wait_s=wait)
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
                continue
            raise ServedAgentError(f"{method} {path}: {r.status_code} {r.text[:500]}")
