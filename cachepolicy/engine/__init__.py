"""The llama.cpp engine: the only code in kvagent that imports ``llama_cpp``.

Numerical contract (docs/engine.md, and ``kvagent check-exact``):
* flash attention is OFF and n_ubatch == n_batch, so splitting a prefill into several calls
  gives bitwise the same logits as one call (within the limits below);
* quantized weights are NOT repacked (``use_extra_bufts = False``) unless
  ``EngineConfig.fast_kernels`` asks for speed: the CPU backend's repacked layouts pick a
  kernel by a batch's row count *and by a row's place in it* (Q4_K: one kernel for whole
  blocks of 4 rows, another for the rest), so no batching rule could keep a split prefill
  bitwise.  Without repacking the kernel depends on the row count only: f16 takes another
  kernel for 1 row, the K-quants and IQ4_XS for 1-7 rows, Q8_0 never switches (measured on
  x86 AVX-512; ``kvagent check-exact`` verifies it on the machine at hand);
* a piece longer than ``n_batch`` is cut so that no chunk has fewer than ``MIN_CHUNK_ROWS``
  (8) rows (``chunk_sizes``): a piece of at least 8 rows is bitwise the same however it is
  chunked, and split anywhere into such pieces equals one call.  Shorter pieces are exact only
  against the same piece boundaries (policies compared with each other use the same ones);
  a 1-token prefill call is refused unless explicitly allowed;
* mixture-of-experts models with K-quant experts: an expert's matmul takes the small-batch
  kernel when fewer than 8 rows are routed to it, which depends on the tokens; so their
  prefill calls carry at most 7 rows (``prefill_rows_for``: every expert then always takes
  its small kernel, and a split prefill is bitwise a one-call one again), unless
  ``fast_kernels`` trades that for prefill speed;
* each sequence has its own KV stream (``kv_unified=False``), so a sequence's KV cells sit at
  the same indices whether it was prefilled from scratch or restored from a checkpoint;
* edits that llama.cpp would accept but that silently corrupt a recurrent state (a middle-range
  removal, a tail trim without a recurrent checkpoint) are refused with ``UnsafeEditError``.
  The one approximate edit is separate and says so: ``replay_cut`` (tail replay: keep the
  attention KV, set the recurrent state to an older base or zero) marks the sequence's
  history so that no exact comparison matches it afterwards (``cachepolicy.engine.replay``).

* generations decode in one of two measured shapes (``row_classes``, ``batcher``): lane
  calls of several generations, one token each, padded to the smallest row count of one
  class; or runs of one generation's tokens (2..16, one class on f16 and Q8_0), where
  grammar-forced text and prompt-lookup drafts are verified against exactly what plain
  decoding would choose and rolled back when rejected (``generation``).  By default lanes
  where a lone generation needs no pad row in them (Q8_0, K-quants, one lane), else runs
  for generations under a grammar and one-row calls for the others;

* the vision encoder (mtmd, a graph of its own) runs WITH flash attention
  (``EngineConfig.encoder_flash_attn``): an image is encoded in one call, so no split rule
  applies; the same pixels must give the same embedding bits every time, also re-encoded
  after an embedding-cache eviction (``check-exact``'s ``encoder_*`` checks).

Every public method takes the engine's lock: one llama context is not thread-safe.  The
exception is the vision encoder (``encode_image``, ``image_tokens``): its own lock, so a
screenshot can be encoded while the llama context prefills.  The class is synchronous; the
scheduler runs its calls in worker threads (``anyio.to_thread``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cachepolicy.engine.records import EngineConfig, MemoryReport, SeqInfo, chunk_sizes

if TYPE_CHECKING:
    from cachepolicy.engine.core import Engine
    from cachepolicy.engine.sampler import Sampler

__all__ = ["Engine", "EngineConfig", "MemoryReport", "Sampler", "SeqInfo", "chunk_sizes"]

#: Names whose modules load libllama, imported on first use (PEP 562).  The engine's plain
#: records (checkpoints, images, sampling parameters, errors, ``EngineConfig``) are imported
#: by every layer, including clients that never load a model — ``KvAgent(server=URL)``,
#: ``kvagent --help`` — and importing ``cachepolicy.engine.checkpoint`` runs this file
#: first; so loading libllama waits until ``Engine`` or ``Sampler`` is asked for.
_LOADS_LLAMA = {"Engine": "cachepolicy.engine.core", "Sampler": "cachepolicy.engine.sampler"}


def __getattr__(name: str) -> Any:
    if name in _LOADS_LLAMA:
        return getattr(importlib.import_module(_LOADS_LLAMA[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
