"""Profiles by name: ``names()`` lists them, ``get(name, **options)`` makes one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.profiles.base import Profile
from runtime.profiles.kvagent import KvAgentProfile
from runtime.profiles.qwen3vl import Qwen3VLProfile
from runtime.profiles.uitars import UITarsProfile, UITarsV1Profile


class UnknownProfileError(ValueError):
    """No profile has that name."""


_PROFILES: dict[str, Callable[..., Profile]] = {
    cls.name: cls for cls in (KvAgentProfile, Qwen3VLProfile, UITarsProfile, UITarsV1Profile)
}


def names() -> tuple[str, ...]:
    """The registered profile names, sorted."""
    return tuple(sorted(_PROFILES))


def get(name: str, **options: Any) -> Profile:
    """The profile ``name`` built with ``options`` (e.g. ``get("kvagent",
    coords=CoordConvention.RELATIVE_999)``, ``get("uitars", max_pixels=...)``)."""
    try:
        make = _PROFILES[name]
    except KeyError:
        raise UnknownProfileError(
            f"unknown profile {name!r}; known: {', '.join(names())}") from None
    return make(**options)
