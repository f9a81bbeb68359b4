"""Profiles by name: ``names()`` lists them, ``get(name, **options)`` makes one.

``PROFILES`` holds the agents' action profiles, ``SERVING`` the chat profiles ``kvagent
serve`` also answers with — both ``cachepolicy.registry.Registry``s, the shape the policies
and the envs share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cachepolicy.registry import Registry, UnknownNameError
from runtime.profiles.base import Profile
from runtime.profiles.chat import ChatProfile
from runtime.profiles.kvagent import KvAgentProfile
from runtime.profiles.qwen3vl import Qwen3VLProfile
from runtime.profiles.uitars import UITarsProfile, UITarsV1Profile


class UnknownProfileError(UnknownNameError):
    """No profile has that name."""


#: The action profiles an agent can use (``--profile``): name -> the profile's class.
PROFILES: Registry[Callable[..., Profile]] = Registry("profile", error=UnknownProfileError,
                                                      sort=True)
for _cls in (KvAgentProfile, Qwen3VLProfile, UITarsProfile, UITarsV1Profile):
    PROFILES.register(_cls)
del _cls
#: Profiles that are not GUI-action formats (no grammar, no parser): ``kvagent serve``'s
#: chat completions use them; ``names()`` (the agents' choices) leaves them out.
SERVING: Registry[Callable[..., Profile]] = Registry("profile", error=UnknownProfileError)
SERVING.register(ChatProfile)
SERVING_PROFILES = SERVING.names()


def names() -> tuple[str, ...]:
    """The action profiles an agent can use (``--profile``), sorted."""
    return PROFILES.names()


def get(name: str, **options: Any) -> Profile:
    """The profile ``name`` built with ``options`` (e.g. ``get("kvagent",
    coords=CoordConvention.RELATIVE_999)``, ``get("uitars", max_pixels=...)``); an unknown
    name raises ``UnknownProfileError`` listing the agents' profiles."""
    make = SERVING.get(name) if name in SERVING else PROFILES.get(name)
    return make(**options)
