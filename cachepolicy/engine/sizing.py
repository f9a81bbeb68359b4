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

Host and device memory are counted apart.  With layers offloaded to a GPU
(``EngineConfig.n_gpu_layers``, ``devices``) llama.cpp puts the last ``offloaded`` of the
``n_layer + 1`` layers on the device — their weights and their KV cells — and computes the
workspace there; ``context_cost(..., offloaded=N)`` moves those cells and the workspace into
``device_*`` and ``device_weight_bytes`` sums the offloaded weights.  With nothing offloaded
(every CPU build) the device figures are 0 and the estimate is what it always was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from cachepolicy.engine.gguf_meta import metadata, tensor_bytes
from cachepolicy.engine.records import EngineConfig

_F16 = 2
_F32 = 4


@attrs.frozen
class ContextCost:
    """Bytes llama.cpp will allocate for a context (an estimate; see the module docstring)."""

    kv_bytes_per_cell: int
    kv_bytes: int  # every layer's cells, wherever they sit
    workspace_bytes: int
    #: of those, what sits in device memory (offloaded layers' cells; the workspace when any
    #: layer is offloaded)
    device_kv_bytes: int = 0
    device_workspace_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.workspace_bytes

    @property
    def device_bytes(self) -> int:
        return self.device_kv_bytes + self.device_workspace_bytes

    @property
    def host_bytes(self) -> int:
        return self.total_bytes - self.device_bytes


def _per_layer(value: Any, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value][:n_layer]
    return [int(value)] * n_layer


def first_offloaded(n_layer: int, offloaded: int) -> int:
    """The first block llama.cpp places on the device when ``offloaded`` of the
    ``n_layer + 1`` layers go there (the output layer is the first to go, then the blocks
    from the last one down: ``llama_model::load_tensors``' ``i_gpu_start``)."""
    return max(n_layer + 1 - offloaded, 0)


def context_cost(model_path: str | Path, config: EngineConfig, *,
                 offloaded: int = 0) -> ContextCost | None:
    """The estimate for ``config`` on this model with ``offloaded`` layers on a device
    (``devices.Offload.layers``; 0: all on the host); None when the metadata does not say
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
    cell = {i: kv_heads[i] * (k_len + v_len) * _F16 for i in attention}
    per_cell = sum(cell.values())
    n_head = max((heads[i] for i in attention), default=0)
    workspace = config.n_ctx_per_seq * config.n_batch * n_head * _F32 if attention else 0
    start = first_offloaded(n_layer, offloaded)
    device_cell = sum(b for i, b in cell.items() if i >= start)
    return ContextCost(per_cell, per_cell * config.n_ctx, workspace,
                       device_kv_bytes=device_cell * config.n_ctx,
                       device_workspace_bytes=workspace if offloaded > 0 else 0)


def device_weight_bytes(model_path: str | Path, offloaded: int) -> int:
    """Bytes of the weights llama.cpp copies to the device with ``offloaded`` layers there:
    the blocks from ``first_offloaded`` on and the output layer (``output``,
    ``output_norm``; the input embedding stays on the host).  0 when nothing is offloaded
    (the file is not read)."""
    if offloaded <= 0:
        return 0
    f = metadata(model_path)
    arch = str(f["general.architecture"])
    start = first_offloaded(int(f[f"{arch}.block_count"]), offloaded)
    total = 0
    for name, nbytes in tensor_bytes(model_path).items():
        if name.startswith("blk."):
            if int(name.split(".")[1]) >= start:
                total += nbytes
        elif name.startswith("output"):
            total += nbytes
    return total


def train_context(model_path: str | Path) -> int | None:
    """The context the model was trained for (``<arch>.context_length``, llama.cpp's
    ``n_ctx_train``); None when the metadata does not say. ValueError naming the file when it
    cannot be read as GGUF (so a caller does not blame the metadata for a bad file)."""
    f = metadata(model_path)
    arch = f.get("general.architecture")
    value = f.get(f"{arch}.context_length") if arch is not None else None
    return None if value is None else int(value)
