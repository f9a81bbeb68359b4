"""The episode API's bodies (what ``KvAgent(server=URL)`` speaks): requests parsed into
records for ``runtime.serve.episodes``, its outcomes built into answers.

    POST   /v1/episodes                 {"instruction", "screen"?: [w, h], "options"?: {...}}
                                         → 201 {"episode_id", "episode_number", "config"}
    POST   /v1/episodes/{id}/step       {"screenshot": base64 PNG/JPEG/...}
                                         → {"episode_id", "step", "action", "parsed",
                                            "policy", "approximate", "code",
                                            "response", "history", "terminal",
                                            "screenshot_size", "screen_size", "info"}
    GET    /v1/episodes                 → every open episode and chat conversation
    GET    /v1/episodes/{id}            → the episode and its recent steps' measurements
    DELETE /v1/episodes/{id}            → 204
    GET    /v1/episodes/{id}/lease      → a heartbeat stream the client holds open
                                           (``lease_stream.py``)

``screen`` is the VM's screen (default: each screenshot's own size); ``options`` are
``AgentConfig`` fields (``EPISODE_OPTIONS``; ``policy`` spelled as ``--policy`` is:
``tail-replay@10%``, ``kamera@m32``), defaulting to the server's flags, each checked
for its JSON type and range here (``window: true`` or ``decode_tokens: 8.5`` is a 400, not a
1 or an 8) and the whole for what the model can run when the episode is created.  A profile
chosen per episode brings its own window unless ``window`` is given too.  An episode's id is
unguessable; ``episode_number`` is its number on the host, the seed its sampling mixes in.

A step returns the decided action as data: its text in kvagent's action language
(``action``, absolute pixels of the screenshot; ``null`` for an unparsable output, which
acts as 'WAIT') and, for convenience, ``code``: the pyautogui code generated from that
record with its points scaled onto ``screen``.  ``KvAgent(server=URL)`` does not run the
server's text: it parses ``action`` into a record and generates the code itself, exactly as
the in-process agent does.  ``history`` is the text the step leaves in the episode's
history (what a replay forces to rebuild the episode on another host: ``runtime/cluster``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import anyio.to_thread
import attrs

from cachepolicy.engine.sampling import MAX_TEMPERATURE
from cachepolicy.policies import POLICIES
from cachepolicy.policies import names as policy_names
from runtime.actions import CoordConvention, Screen
from runtime.config import (
    MAX_DECODE_TOKENS, MAX_WINDOW, POLICY_SEPARATOR, AgentConfig, PinningError, PolicyChoice,
)
from runtime.metrics import StepMetrics
from runtime.profiles import names as profile_names
from runtime.serve.config import Limits
from runtime.serve.episodes import EpisodeCreated, EpisodeStep, EpisodeView
from runtime.serve.http.errors import ApiError, bad_request, too_large
from runtime.serve.http.images import PixelBudget, decode_base64, read_image
from vmenv.actions import TERMINAL_ACTIONS, rescale, to_pyautogui

#: The agent options a client may set per episode (``AgentConfig`` fields).
EPISODE_OPTIONS = ("profile", "policy", "window", "pinned", "overlap", "temperature", "seed",
                   "grammar", "convention", "decode_tokens", "system_prompt")
MAX_INSTRUCTION_CHARS = 20_000
#: a ``policy`` option's characters (a name with its budget or option: ``kamera@m8+recall4``)
MAX_POLICY_CHARS = 64
#: Seeds are 63-bit: the scheduler mixes them into each step's seed modulo 2**63.
MAX_SEED = (1 << 63) - 1


@attrs.frozen
class EpisodeCreate:
    """A valid create request."""

    instruction: str
    screen: Screen | None  # the client's screen, if it gave one
    config: AgentConfig


def parse_create(body: Mapping[str, Any], base: AgentConfig,
                 limits: Limits = Limits()) -> EpisodeCreate:
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
                or not all(_int(v) and 1 <= v <= 16384 for v in screen)):
            raise bad_request("'screen' must be [width, height] in pixels", param="screen")
        screen = (screen[0], screen[1])
    return EpisodeCreate(instruction, screen, episode_config(base, body.get("options"), limits))


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def _option_problem(name: str, value: Any, limits: Limits) -> str | None:
    """What is wrong with option ``name`` = ``value`` (None: its type and range are right;
    ``AgentConfig`` checks the rest, the host what the model can run)."""
    if name == "policy":  # a name, or a name with its budget or option (tail-replay@10%)
        if not isinstance(value, str) or len(value) > MAX_POLICY_CHARS:
            return (f"must be one of {', '.join(policy_names())}, optionally "
                    f"{POLICY_SEPARATOR}<replay budget> or {POLICY_SEPARATOR}<option>")
        try:
            PolicyChoice.parse(value)
        except ValueError as exc:
            return f"{value!r}: {exc}"
        return None
    if name in ("profile", "convention"):
        known = {"profile": profile_names(),
                 "convention": tuple(c.value for c in CoordConvention)}[name]
        return None if isinstance(value, str) and value in known else (
            f"must be one of {', '.join(known)}")
    if name in ("overlap", "grammar"):
        return None if isinstance(value, bool) else "must be true or false"
    if name == "window":
        return None if _int(value) and 1 <= value <= MAX_WINDOW else (
            f"must be an integer 1..{MAX_WINDOW}")
    if name == "pinned":  # below the window: AgentConfig checks it against the window
        return None if _int(value) and 0 <= value < MAX_WINDOW else (
            f"must be an integer 0..{MAX_WINDOW - 1}")
    if name == "seed":
        return None if _int(value) and 0 <= value <= MAX_SEED else (
            "must be an integer 0..2**63-1")
    if name == "temperature":
        return None if _number(value) and 0 <= value <= MAX_TEMPERATURE else (
            f"must be a number 0..{MAX_TEMPERATURE:g}")
    if name == "decode_tokens":
        return None if value is None or (_int(value) and 1 <= value <= MAX_DECODE_TOKENS) \
            else f"must be null or an integer 1..{MAX_DECODE_TOKENS}"
    if name == "system_prompt":
        if value is None:
            return None
        if not isinstance(value, str):
            return "must be null or a string"
        return None if len(value) <= limits.max_system_prompt_chars else (
            f"has {len(value)} characters; the limit is {limits.max_system_prompt_chars}")
    return "is not an option"


def episode_config(base: AgentConfig, options: Any, limits: Limits = Limits()) -> AgentConfig:
    if options is None:
        return base
    if not isinstance(options, Mapping):
        raise bad_request("'options' must be an object", param="options")
    unknown = sorted(str(k)[:40] for k in set(options) - set(EPISODE_OPTIONS))
    if unknown:
        raise bad_request(f"unknown options {unknown}; known: {', '.join(EPISODE_OPTIONS)}",
                          param="options")
    for name, value in options.items():
        problem = _option_problem(name, value, limits)
        if problem is not None:
            status = 413 if name == "system_prompt" and isinstance(value, str) else 400
            raise ApiError(status, f"options.{name} {problem}", "invalid_request_error",
                           "options", None if status == 400 else "request_too_large")
    fields = {a.name: getattr(base, a.name) for a in attrs.fields(AgentConfig)}
    if options.get("profile", base.profile) != base.profile:  # its own window, coordinates
        del fields["window"], fields["convention"]
    fields.update(options)
    if "policy" in options:  # its budget or option, else the server's (where it takes one)
        choice = PolicyChoice.parse(options["policy"])
        fields.update(policy=choice.policy,
                      replay_budget=choice.budget or base.replay_budget,
                      policy_option=(choice.option or base.policy_option
                                     if POLICIES[choice.policy].takes_option else None))
    try:
        return AgentConfig(**fields)
    except (ValueError, TypeError) as exc:
        message = f"options: {exc}"
        if base.pinned and "pinned" not in options and isinstance(exc, PinningError):
            message += (f" (the server pins the first {base.pinned} screenshot(s) by default, "
                        "--pin-first; send options.pinned 0 to choose no pin)")
        raise bad_request(message, param="options") from None


async def read_screenshot(body: Mapping[str, Any], limits: Limits) -> tuple[bytes, Screen]:
    """A step request's screenshot as PNG bytes and its size, bounded by its header before
    it is decoded (off the loop: ``images.read_image``)."""
    shot = body.get("screenshot")
    if not isinstance(shot, str) or not shot:
        raise bad_request("'screenshot' must be a base64 string", param="screenshot")
    data = decode_base64(shot, "'screenshot'", "screenshot", limits)
    return await anyio.to_thread.run_sync(read_image, data, PixelBudget(limits),
                                          "'screenshot'", "screenshot")


def created_body(out: EpisodeCreated, config: AgentConfig) -> dict[str, Any]:
    """The create answer: the id, the episode's number (its sampling seed) and the options
    it runs with."""
    return {"episode_id": out.episode_id, "episode_number": out.number, "config": {
        **{k: (v.value if k == "convention" else v) for k in EPISODE_OPTIONS
           if k != "system_prompt" for v in (getattr(config, k),)},
        # what the policy runs with, and whether its steps may be approximate (each says)
        "replay_budget": config.replay_budget, "policy_option": config.policy_option,
        "approximate": POLICIES[config.policy].manifest.quality == "approximate"}}


def step_body(out: EpisodeStep) -> dict[str, Any]:
    """The step's answer; ``approximate``: the action was decoded from an approximate state
    (an approximate ``policy``'s edit, this step's or one the episode still carries)."""
    act, metrics = out.step.act, out.step.metrics
    return {"episode_id": out.episode_id, "step": act.index, "action": metrics.action,
            "parsed": metrics.parsed, "policy": metrics.policy,
            "approximate": metrics.approximate,
            "code": to_pyautogui(rescale(act.action, out.screenshot_size, out.screen)),
            "response": act.response, "history": out.history,
            "terminal": isinstance(act.action, TERMINAL_ACTIONS),
            "screenshot_size": list(out.screenshot_size), "screen_size": list(out.screen),
            "info": _measurements(metrics)}


def view_body(view: EpisodeView) -> dict[str, Any]:
    return {"episode_id": view.episode_id, "kind": view.kind, "policy": view.policy,
            "profile": view.profile, "window": view.window, "pinned": view.pinned,
            "busy": view.busy,
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
