"""The engine's method lock: one llama context executes one call at a time."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from cachepolicy.errors import EngineError

_F = TypeVar("_F", bound=Callable[..., Any])


def locked(method: _F) -> _F:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


