"""The loaded llama.cpp handles of one engine, the lock that serialises every call on them,
and the thread its computations run on.

One llama context is not thread-safe: every public method of the engine and of its parts
(``Decoder``, ``SequenceState``, ``Vision``) holds ``lock`` (re-entrant: an engine method may
call its parts) and refuses to run once ``closed``.  Computing calls (``llama_decode``) go
through ``compute`` (see ``compute_thread``: one OpenMP pool whatever thread asks).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import llama_cpp

from cachepolicy.engine.compute_thread import ComputeThread
from cachepolicy.engine.errors import EngineError

_F = TypeVar("_F", bound=Callable[..., Any])


@attrs.define(eq=False)
class Native:
    model: Any
    ctx: Any
    mem: Any
    vocab: Any
    compute: ComputeThread
    lock: threading.RLock = attrs.Factory(threading.RLock)
    closed: bool = False


def locked(method: _F) -> _F:
    """Run the method under its owner's ``_native.lock``; EngineError once closed."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        native: Native = self._native
        with native.lock:
            if native.closed:
                raise EngineError("engine is closed")
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


def model_meta(model: object, key: str) -> str | None:
    """The loaded model's GGUF metadata value for ``key`` as text (None if absent)."""
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace") if n >= 0 else None
