"""Typed errors of the cache-policy layer, grouped by cause.

* ``PolicyError`` — a cache policy cannot be configured or cannot plan this step
  (``PolicyRefusedError``: not on this model kind).
* ``StalePublishError`` — compare-and-publish lost: the episode moved on.

The engine's errors live with the engine (``cachepolicy.engine.errors``: the bottom layer
imports nothing above it) and are re-exported here, so ``from cachepolicy.errors import X``
names every error of ``cachepolicy``, whichever layer raises it.
"""

from __future__ import annotations

from cachepolicy.engine.errors import (
    ContextFullError, DecodeError, EngineError, FastKernelsUnavailableError, GrammarBudgetError,
    GrammarWorkerError, ImageError, KvagentCacheError, ModelLoadError, NoVisionError, Preempted,
    QuantizeError, RestoreError, SingleTokenPrefillError, UnsafeEditError,
)


class PolicyError(KvagentCacheError):
    """A cache policy cannot be configured or cannot plan this step."""


class PolicyRefusedError(PolicyError):
    """The policy does not support this model kind (e.g. relocate on a hybrid model)."""


class StalePublishError(KvagentCacheError):
    """Compare-and-publish failed: the episode's published generation moved on."""


__all__ = [
    "ContextFullError", "DecodeError", "EngineError", "FastKernelsUnavailableError",
    "GrammarBudgetError", "GrammarWorkerError", "ImageError", "KvagentCacheError", "ModelLoadError", "NoVisionError", "PolicyError",
    "PolicyRefusedError", "Preempted", "QuantizeError", "RestoreError",
    "SingleTokenPrefillError", "StalePublishError", "UnsafeEditError",
]
