"""Profiles by name: ``names()`` lists them, ``get(name, **options)`` makes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.profiles.base import Profile
from runtime.profiles.chat import ChatProfile
from runtime.profiles.kvagent import KvAgentProfile
from runtime.profiles.qwen3vl import Qwen3VLProfile
from runtime.profiles.uitars import UITarsProfile, UITarsV1Profile


class UnknownProfileError(ValueError):
    """No profile has that name."""


_PROFILES: dict[str, Callable[..., Profile]] = {
    cls.name: cls for cls in (KvAgentProfile, Qwen3VLProfile, UITarsProfile, UITarsV1Profile)
}
#: Profiles that are not GUI-action formats (no grammar, no parser): ``kvagent serve``'s
#: chat completions use them; ``names()`` (the agents' choices) leaves them out.
_SERVING: dict[str, Callable[..., Profile]] = {ChatProfile.name: ChatProfile}
SERVING_PROFILES = tuple(_SERVING)


def names() -> tuple[str, ...]:
    """The action profiles an agent can use (``--profile``), sorted."""
    return tuple(sorted(_PROFILES))


def get(name: str, **options: Any) -> Profile:
    """The profile ``name`` built with ``options`` (e.g. ``get("kvagent",
    coords=CoordConvention.RELATIVE_999)``, ``get("uitars", max_pixels=...)``)."""
    try:
        make = _PROFILES[name] if name in _PROFILES else _SERVING[name]
    except KeyError:
        raise UnknownProfileError(
            f"unknown profile {name!r}; known: {', '.join(names())}") from None
    return make(**options)
