"""kvagent.cachepolicy: the llama.cpp engine (``engine/``) and, above it, the context log, the
cache policies, the executor, the exactness oracle and the model forge.

Importing this package does not load llama.cpp; import ``cachepolicy.engine`` for that.
"""

from cachepolicy.engine.checkpoint import Checkpoint, CheckpointKind, ModelKind, Run, RunKind
from cachepolicy.errors import (
    ContextFullError, DecodeError, EngineError, ImageError, KvagentCacheError, ModelLoadError,
    NoVisionError, RestoreError, SingleTokenPrefillError, UnsafeEditError,
)
from cachepolicy.engine.sampling import SamplingParams

__all__ = [
    "Checkpoint", "CheckpointKind", "ContextFullError", "DecodeError", "EngineError",
    "ImageError", "KvagentCacheError", "ModelKind", "ModelLoadError", "NoVisionError",
    "RestoreError", "Run", "RunKind", "SamplingParams", "SingleTokenPrefillError",
    "UnsafeEditError",
]
