"""What a context costs before llama.cpp allocates it, from the model's GGUF metadata.

llama.cpp allocates the whole KV cache (``n_ctx`` cells of every attention layer) and its
compute buffers when the context is created; a context sized from a typo is an OOM kill, not
an error.  ``context_bytes`` estimates that allocation without loading the model, so the CLI
can refuse a configuration that cannot fit in memory before anything is loaded.

The estimate: attention layers × KV heads × (key + value length) × 2 bytes (f16 cells) per
cell, times ``n_ctx``; plus the attention-score workspace of one batch (flash attention is
off: ``n_ctx_per_seq`` × ``n_batch`` × heads × 4 bytes); plus the recurrent states, which are
small and left out.  Recurrent layers (qwen35's Gated-DeltaNet blocks, a per-layer KV head
count of 0) hold no cells.  The test suite checks the per-cell figure against the engine's
own measurement.  ``train_context`` reads the context the model was trained for, so a
command can size its context to it before loading.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cachepolicy.engine.gguf_meta import metadata
from cachepolicy.engine.records import EngineConfig

_F16 = 2
_F32 = 4


@attrs.frozen
class ContextCost:
    """Bytes llama.cpp will allocate for a context (an estimate; see the module docstring)."""

    kv_bytes_per_cell: int
    kv_bytes: int
    workspace_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.workspace_bytes


def _per_layer(value: Any, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value][:n_layer]
    return [int(value)] * n_layer


def context_cost(model_path: str | Path, config: EngineConfig) -> ContextCost | None:
    """The estimate for ``config`` on this model; None when the metadata does not say
    (an unreadable file or an architecture without the usual keys: llama.cpp decides)."""
    try:
        f = metadata(model_path)
        arch = str(f["general.architecture"])
        n_layer = int(f[f"{arch}.block_count"])
        n_embd = int(f[f"{arch}.embedding_length"])
        heads = _per_layer(f[f"{arch}.attention.head_count"], n_layer)
        kv_heads = _per_layer(f.get(f"{arch}.attention.head_count_kv", heads), n_layer)
    except Exception:  # noqa: BLE001  no estimate: the allocation is llama.cpp's to refuse
        return None
    head_dim = n_embd // max(1, max(heads))
    k_len = int(f.get(f"{arch}.attention.key_length", head_dim))
    v_len = int(f.get(f"{arch}.attention.value_length", head_dim))
    interval = f.get(f"{arch}.full_attention_interval")
    attention = [i for i in range(n_layer) if kv_heads[i] > 0
                 and (interval is None or (i + 1) % int(interval) == 0)]
    per_cell = sum(kv_heads[i] * (k_len + v_len) * _F16 for i in attention)
    n_head = max((heads[i] for i in attention), default=0)
    workspace = config.n_ctx_per_seq * config.n_batch * n_head * _F32 if attention else 0
    return ContextCost(per_cell, per_cell * config.n_ctx, workspace)


def train_context(model_path: str | Path) -> int | None:
    """The context the model was trained for (``<arch>.context_length``, llama.cpp's
    ``n_ctx_train``); None when the metadata does not say. ValueError naming the file when it
    cannot be read as GGUF (so a caller does not blame the metadata for a bad file)."""
    f = metadata(model_path)
    arch = f.get("general.architecture")
    value = f.get(f"{arch}.context_length") if arch is not None else None
    return None if value is None else int(value)
