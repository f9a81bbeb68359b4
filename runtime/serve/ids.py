"""The ids a model host hands out — ``ep-7``, ``chat-8``, ``s-9`` — from ONE counter for
every kind: an episode's number is also its sampling seed, so which number an episode gets
depends on every id drawn before it (episodes, conversations and streams alike)."""

from __future__ import annotations

from collections.abc import Callable

#: ``new_id(prefix)`` → (a fresh id such as ``ep-7``, its number).
NewId = Callable[[str], tuple[str, int]]


class IdCounter:
    def __init__(self) -> None:
        self._last = 0

    def new_id(self, prefix: str) -> tuple[str, int]:
        """A fresh id (``ep-7``) and its number (an episode's sampling seed)."""
        self._last += 1
        return f"{prefix}-{self._last}", self._last
