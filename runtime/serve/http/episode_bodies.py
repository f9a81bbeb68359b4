"""The episode API's bodies (what ``KvAgent(server=URL)`` speaks): requests parsed into
records for ``runtime.serve.episodes``, its outcomes built into answers.

    POST   /v1/episodes                 {"instruction", "screen"?: [w, h], "options"?: {...}}
                                         → 201 {"episode_id", "config"}
    POST   /v1/episodes/{id}/step       {"screenshot": base64 PNG/JPEG/...}
                                         → {"episode_id", "step", "action", "parsed", "code",
                                            "response", "history", "terminal",
                                            "screenshot_size", "screen_size", "info"}
    GET    /v1/episodes                 → every open episode and chat conversation
    GET    /v1/episodes/{id}            → the episode and its recent steps' measurements
    DELETE /v1/episodes/{id}            → 204

``screen`` is the VM's screen (default: each screenshot's own size); ``options`` are
``AgentConfig`` fields (``EPISODE_OPTIONS``), defaulting to the server's flags.  A profile
chosen per episode brings its own window unless ``window`` is given too.

A step returns the decided action as data: its text in kvagent's action language
(``action``, absolute pixels of the screenshot; ``null`` for an unparsable output, which
acts as 'WAIT') and, for convenience, ``code``: the pyautogui code generated from that
record with its points scaled onto ``screen``.  ``KvAgent(server=URL)`` does not run the
server's text: it parses ``action`` into a record and generates the code itself, exactly as
the in-process agent does.  ``history`` is the text the step leaves in the episode's
history (what a replay forces to rebuild the episode on another host: ``runtime/cluster``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping
from typing import Any

import anyio.to_thread
import attrs

from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.metrics import StepMetrics
from runtime.profiles import names as profile_names
from runtime.serve.config import Limits
from runtime.serve.episodes import EpisodeStep, EpisodeView
from runtime.serve.http.errors import bad_request, too_large
from vmenv.actions import TERMINAL_ACTIONS, rescale, to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.png import screenshot_png

#: The agent options a client may set per episode (``AgentConfig`` fields).
EPISODE_OPTIONS = ("profile", "policy", "window", "overlap", "temperature", "seed",
                   "grammar", "convention", "decode_tokens", "system_prompt")
MAX_INSTRUCTION_CHARS = 20_000


@attrs.frozen
class EpisodeCreate:
    """A valid create request."""

    instruction: str
    screen: Screen | None  # the client's screen, if it gave one
    config: AgentConfig


def parse_create(body: Mapping[str, Any], base: AgentConfig) -> EpisodeCreate:
    """A create request's body; ``base``: the server's agent configuration."""
    instruction = body.get("instruction")
    if not isinstance(instruction, str) or not instruction.strip():
        raise bad_request("'instruction' must be a non-empty string", param="instruction")
    if len(instruction) > MAX_INSTRUCTION_CHARS:
        raise too_large(f"the instruction has {len(instruction)} characters; the limit is "
                        f"{MAX_INSTRUCTION_CHARS}", param="instruction")
    screen = body.get("screen")
    if screen is not None:
        if (not isinstance(screen, list) or len(screen) != 2
                or not all(isinstance(v, int) and 1 <= v <= 16384 for v in screen)):
            raise bad_request("'screen' must be [width, height] in pixels", param="screen")
        screen = (screen[0], screen[1])
    return EpisodeCreate(instruction, screen, episode_config(base, body.get("options")))


def episode_config(base: AgentConfig, options: Any) -> AgentConfig:
    if options is None:
        return base
    if not isinstance(options, Mapping):
        raise bad_request("'options' must be an object", param="options")
    unknown = sorted(set(options) - set(EPISODE_OPTIONS))
    if unknown:
        raise bad_request(f"unknown options {unknown}; known: {', '.join(EPISODE_OPTIONS)}",
                          param="options")
    profile = options.get("profile", base.profile)
    if profile not in profile_names():  # (serving-only profiles such as chat are not agents)
        raise bad_request(f"options: unknown agent profile {profile!r}; known: "
                          f"{', '.join(profile_names())}", param="options")
    fields = {a.name: getattr(base, a.name) for a in attrs.fields(AgentConfig)}
    if profile != base.profile:  # another profile: its own window and coordinates
        del fields["window"], fields["convention"]
    try:
        return AgentConfig(**{**fields, **options})
    except (ValueError, TypeError) as exc:
        raise bad_request(f"options: {exc}", param="options") from None


async def read_screenshot(body: Mapping[str, Any], limits: Limits) -> tuple[bytes, Screen]:
    """A step request's screenshot as PNG bytes and its size (decoded off the loop)."""
    shot = body.get("screenshot")
    if not isinstance(shot, str) or not shot:
        raise bad_request("'screenshot' must be a base64 string", param="screenshot")
    if len(shot) * 3 // 4 > limits.max_image_bytes:
        raise too_large("the screenshot is too large", param="screenshot")
    try:
        data = base64.b64decode(shot, validate=True)
        return await anyio.to_thread.run_sync(screenshot_png, data)
    except (binascii.Error, ValueError):
        raise bad_request("'screenshot' is not valid base64", param="screenshot") from None
    except ScreenshotError as exc:
        raise bad_request(f"'screenshot': {exc}", param="screenshot",
                          code="invalid_image") from None


def created_body(episode_id: str, config: AgentConfig) -> dict[str, Any]:
    """The create answer: the id and the options the episode runs with."""
    return {"episode_id": episode_id, "config": {
        k: (v.value if k == "convention" else v) for k in EPISODE_OPTIONS
        if k != "system_prompt" for v in (getattr(config, k),)}}


def step_body(out: EpisodeStep) -> dict[str, Any]:
    act, metrics = out.step.act, out.step.metrics
    return {"episode_id": out.episode_id, "step": act.index, "action": metrics.action,
            "parsed": metrics.parsed,
            "code": to_pyautogui(rescale(act.action, out.screenshot_size, out.screen)),
            "response": act.response, "history": out.history,
            "terminal": isinstance(act.action, TERMINAL_ACTIONS),
            "screenshot_size": list(out.screenshot_size), "screen_size": list(out.screen),
            "info": _measurements(metrics)}


def view_body(view: EpisodeView) -> dict[str, Any]:
    return {"episode_id": view.episode_id, "kind": view.kind, "policy": view.policy,
            "profile": view.profile, "busy": view.busy,
            "steps": [_measurements(m) for m in view.recent]}


def listing_body(views: Iterable[EpisodeView]) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"episode_id": v.episode_id, "kind": v.kind, "steps": len(v.recent), "busy": v.busy}
        for v in views]}


def _measurements(m: StepMetrics) -> dict[str, Any]:
    """A step's measurements (metrics.jsonl's fields) without its output tokens."""
    info = m.as_dict()
    info.pop("output_tokens")
    return info
