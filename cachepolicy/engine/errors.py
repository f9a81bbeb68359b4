"""Typed errors of the engine, grouped by cause.

* ``EngineError`` — the engine could not do what was asked (load, decode, restore).
* ``UnsafeEditError`` — the edit would silently corrupt state (a middle-range removal or an
  unsupported truncate on a recurrent / hybrid model).  llama.cpp itself would accept some of
  these and keep the removed tokens in the recurrent state, so we refuse them before the call.
* ``ImageError`` — a screenshot could not be decoded or encoded.
* ``Preempted`` — not an error: work stopped at a boundary because its caller asked.

``KvagentCacheError`` is the base of every error of ``cachepolicy``: the policy layer's own
(``cachepolicy.errors``) derive from it too, so it lives here, in the bottom layer.  This
module imports nothing: the engine is closed below the rest of ``cachepolicy``.
"""

from __future__ import annotations


class KvagentCacheError(Exception):
    """Base class for errors raised by ``cachepolicy``."""


class EngineError(KvagentCacheError):
    """llama.cpp refused or failed an operation."""


class ModelLoadError(EngineError):
    """A GGUF model or mmproj file could not be loaded."""


class FastKernelsUnavailableError(ModelLoadError):
    """``fast_kernels`` was asked for on a host where llama.cpp's repacked kernels crash."""


class DecodeError(EngineError):
    """``llama_decode`` failed.  ``code`` is llama.cpp's return value (1: no KV slot)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    @property
    def out_of_memory(self) -> bool:
        """True when llama.cpp could not find room in the KV cache (retryable after freeing)."""
        return self.code == 1


class GrammarBudgetError(EngineError):
    """Matching a client's grammar passed its budget (time, or its worker's memory)."""


class GrammarWorkerError(EngineError):
    """A grammar worker could not serve (it did not start, or the engine closed): the
    server's fault, not the grammar's."""


class ContextFullError(EngineError):
    """The sequence would exceed its share of the context window."""


class RestoreError(EngineError):
    """A checkpoint could not be restored (wrong model, wrong kind, or llama.cpp refused)."""


class UnsafeEditError(KvagentCacheError):
    """The requested edit would silently corrupt a sequence's state; nothing was changed."""


class SingleTokenPrefillError(KvagentCacheError):
    """A 1-token prefill takes another kernel than a multi-token one (not bitwise comparable)."""


class ImageError(KvagentCacheError):
    """An image could not be decoded (corrupt / truncated PNG) or encoded by the projector."""


class NoVisionError(EngineError):
    """The engine was loaded without an mmproj, so it cannot encode images."""





class Preempted(Exception):
    """Work stopped at a piece or token boundary and must not be published (its caller was
    cancelled).  Not a ``KvagentCacheError``: it is control flow, never bad input."""


class QuantizeError(RuntimeError):
    """llama_model_quantize reported a failure."""
