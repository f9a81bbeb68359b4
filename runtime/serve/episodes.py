"""The episode API: kvagent's own agent, hosted (what ``KvAgent(server=URL)`` speaks).

    POST   /v1/episodes                 {"instruction", "screen"?: [w, h], "options"?: {...}}
                                         → 201 {"episode_id", "config"}
    POST   /v1/episodes/{id}/step       {"screenshot": base64 PNG/JPEG/...}
                                         → {"episode_id", "step", "action", "parsed", "code",
                                            "response", "history", "terminal",
                                            "screenshot_size", "screen_size", "info"}
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
Overlap happens here: after answering, the host prefetches the
next step while the client's VM executes the action.

Episodes idle longer than ``ServeConfig.idle_s`` give their slot to a new episode when every
slot is taken (a client that vanished without ending its episode, e.g. an OSWorld worker
ended with ``os._exit``); a later step of such an episode gets 404 ``episode_not_found``.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Mapping
from typing import Any

import anyio.to_thread
import attrs

from runtime.config import AgentConfig
from runtime.pool import PooledEpisode
from runtime.profiles import names as profile_names
from runtime.serve.http.errors import bad_request, too_large
from runtime.serve.host import ModelHost
from vmenv.actions import TERMINAL_ACTIONS, rescale, to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.png import screenshot_png

#: The agent options a client may set per episode (``AgentConfig`` fields).
EPISODE_OPTIONS = ("profile", "policy", "window", "overlap", "temperature", "seed",
                   "grammar", "convention", "decode_tokens", "system_prompt")
MAX_INSTRUCTION_CHARS = 20_000


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


async def create(host: ModelHost, body: Mapping[str, Any], *,
                 number: int | None = None) -> dict[str, Any]:
    """Open an episode; ``number`` (a cluster's front door numbering episodes across its
    hosts) replaces the host's own count as the id and the sampling seed."""
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
    config = episode_config(host.config.agent, body.get("options"))
    episode_id, n = host.new_id("ep") if number is None else (f"ep-{number}", number)
    # the prompt's screen size until the first screenshot says otherwise (the model decides
    # in the pixels of the screenshot it sees)
    hosted = await host.episodes.open(episode_id, config, instruction, screen or host.config.screen,
                                      seed=n, evictable=host.idle_too_long)
    hosted.screen = screen
    return {"episode_id": episode_id, "config": {
        k: (v.value if k == "convention" else v) for k in EPISODE_OPTIONS
        if k != "system_prompt" for v in (getattr(config, k),)}}


async def step(host: ModelHost, episode_id: str, body: Mapping[str, Any]) -> dict[str, Any]:
    arrived = time.perf_counter()  # the screenshot's bytes are in hand
    hosted = host.episodes.get(episode_id)
    shot = body.get("screenshot")
    if not isinstance(shot, str) or not shot:
        raise bad_request("'screenshot' must be a base64 string", param="screenshot")
    if len(shot) * 3 // 4 > host.config.limits.max_image_bytes:
        raise too_large("the screenshot is too large", param="screenshot")
    try:
        data = base64.b64decode(shot, validate=True)
        png, size = await anyio.to_thread.run_sync(screenshot_png, data)
    except (binascii.Error, ValueError):
        raise bad_request("'screenshot' is not valid base64", param="screenshot") from None
    except ScreenshotError as exc:
        raise bad_request(f"'screenshot': {exc}", param="screenshot",
                          code="invalid_image") from None
    hosted.driver.session.resize(size)  # the model decides in the pixels it sees
    result = await host.episodes.step(episode_id, png, arrived_at=arrived)
    metrics = result.metrics
    host.metrics.step("episode", metrics)
    info = metrics.as_dict()
    info.pop("output_tokens")
    screen = _screen(hosted, size)
    return {"episode_id": episode_id, "step": result.act.index, "action": metrics.action,
            "parsed": metrics.parsed, "code": to_pyautogui(rescale(result.act.action, size,
                                                                    screen)),
            "response": result.act.response,
            "history": hosted.driver.session.history_text,
            "terminal": isinstance(result.act.action, TERMINAL_ACTIONS),
            "screenshot_size": list(size), "screen_size": list(screen), "info": info}


def _screen(hosted: PooledEpisode, size: tuple[int, int]) -> tuple[int, int]:
    return hosted.screen if hosted.screen is not None else size


async def end(host: ModelHost, episode_id: str) -> None:
    host.episodes.get(episode_id)  # 404 for an unknown id
    await host.episodes.close(episode_id)


def describe(host: ModelHost, episode_id: str) -> dict[str, Any]:
    """An open episode (or chat conversation) and its recent steps' measurements."""
    hosted = host.episodes.get(episode_id)
    kind = "chat" if episode_id in host.chat.conversations else "episode"
    steps = []
    for m in hosted.recent:
        d = m.as_dict()
        d.pop("output_tokens")
        steps.append(d)
    return {"episode_id": episode_id, "kind": kind, "policy": hosted.config.policy,
            "profile": hosted.config.profile, "busy": hosted.busy, "steps": steps}


def listing(host: ModelHost) -> dict[str, Any]:
    return {"object": "list", "data": [
        {"episode_id": eid, "kind": "chat" if eid in host.chat.conversations else "episode",
         "steps": len(h.recent), "busy": h.busy} for eid, h in host.episodes.episodes.items()]}
