"""kvagent.cachepolicy: the llama.cpp engine (``cachepolicy.engine``, the bottom layer),
checkpoints, images, the cache-policy interface and the policies (``cachepolicy.policies``).

Importing this package imports ``cachepolicy.engine`` (its checkpoints and errors live there),
and with it ``llama_cpp``.
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
