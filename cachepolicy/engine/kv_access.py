"""Reading and writing a sequence's KV rows (attention-only models): the engine's side of
re-rotated and patched screenshot reuse.

A part the ``Engine`` owns (like ``SequenceState``); every method runs under the engine's
lock.  ``read`` serialises the sequence (``llama_state_seq_get_data``) and parses its rows
(``kv_blob``); ``write`` replaces the sequence with rows composed elsewhere (re-rotated by
``kv_rope``, patched by ``kv_patch``) through ``llama_state_seq_set_data`` — llama.cpp's
supported way in, which clears the sequence and places the cells in the order given — and
records the history the caller says it now holds.

Costs (measured in ``docs/benchmarks.md``): a read copies the whole sequence out (its state
size, ~12 KB per cell on the forged llama M), a write copies it in; both are memcpy-bound.

It also counts the stored KV it made (``keep``: weakref-tracked, like checkpoints), the
engine's side of the integrity check for the screenshot store.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np

from cachepolicy.engine.checkpoint import ModelKind, Run
from cachepolicy.engine.errors import EngineError, RestoreError, UnsafeEditError
from cachepolicy.engine.kv_blob import BlobFormat, KvRows, compose, parse
from cachepolicy.engine.kv_patch import KvPatch, StoredKv
from cachepolicy.engine.kv_rope import RopeSpec
from cachepolicy.engine.live_count import LiveCount
from cachepolicy.engine.native import Native, locked, model_meta
from cachepolicy.engine.sequences import Sequences


def read_rope(model: object) -> RopeSpec:
    """The model's RoPE as its GGUF and llama.cpp describe it."""
    arch = model_meta(model, "general.architecture") or ""
    n_head = max(1, int(llama_cpp.llama_model_n_head(model)))
    n_embd = int(llama_cpp.llama_model_n_embd(model))
    key_length = model_meta(model, f"{arch}.attention.key_length")
    head_dim = int(key_length) if key_length else n_embd // n_head
    n_rot = model_meta(model, f"{arch}.rope.dimension_count")
    base = model_meta(model, f"{arch}.rope.freq_base")
    return RopeSpec(rope_type=int(llama_cpp.llama_model_rope_type(model)),
                    n_rot=int(n_rot) if n_rot else head_dim, head_dim=head_dim,
                    freq_base=float(base) if base else 10_000.0,
                    freq_scale=float(llama_cpp.llama_model_rope_freq_scale_train(model)),
                    scaling=model_meta(model, f"{arch}.rope.scaling.type") or "none")


def edit_problem(kind: ModelKind, rope: RopeSpec, uses_mrope: bool) -> str | None:
    """Why a model of ``kind`` rotating keys by ``rope`` (with a projector placing images by
    M-RoPE: ``uses_mrope``) cannot have its KV rows moved and patched (None: it can) — the
    engine's answer once loaded, ``kvagent check-model``'s from the file."""
    if kind is not ModelKind.ATTENTION:
        return f"a {kind.value} model's recurrent state cannot be re-rotated or patched"
    if uses_mrope:
        return "the vision projector's M-RoPE positions (cell extensions) are not handled"
    return rope.problem


class KvAccess:
    def __init__(self, native: Native, seqs: Sequences, *, kind: ModelKind,
                 n_ctx_per_seq: int) -> None:
        self._native, self._seqs, self.kind = native, seqs, kind
        self.n_ctx_per_seq = n_ctx_per_seq
        self.rope = read_rope(native.model)
        self._format: BlobFormat | None = None
        self._live = LiveCount()  # StoredKv objects still referenced

    def problem(self, uses_mrope: bool) -> str | None:
        """Why this model's KV rows cannot be moved and patched (None: they can)."""
        return edit_problem(self.kind, self.rope, uses_mrope)

    @property
    def live_stored(self) -> tuple[int, int]:
        """(count, bytes) of stored KV made by ``keep`` that is still referenced."""
        return self._live.snapshot

    # ------------------------------------------------------------------ rows

    @locked
    def read(self, seq: int) -> KvRows:
        """Every cell of ``seq``, in its cell order (copies)."""
        self._check(seq)
        if self._seqs.shift_pending:
            raise UnsafeEditError("positions were shifted since the last decode: llama.cpp "
                                  "re-rotates the keys only then, so the cached keys are stale")
        ctx = self._native.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, 0)
        buf = ctypes.create_string_buffer(max(1, size))
        n = llama_cpp.llama_state_seq_get_data_ext(
            ctx, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), size, seq, 0)
        if n == 0 and size > 0:
            raise EngineError(f"llama.cpp returned no state for sequence {seq}")
        fmt, rows = parse(buf.raw[:n])
        if rows.n_cells:
            self._format = fmt
        return rows

    @locked
    def write(self, seq: int, rows: KvRows, history: Sequence[Run]) -> None:
        """Replace ``seq`` with ``rows`` (written in position order); ``history`` is what the
        engine then records it holds (its cells must be the rows' count, its next position
        past every row's)."""
        self._check(seq)
        if self._format is None:
            raise EngineError("no sequence has been read yet: the blob format is unknown")
        if not history or rows.n_cells == 0:
            raise ValueError("nothing to write")
        rows = rows.sorted()
        end = history[-1].end_pos
        if (np.any(np.diff(rows.pos) <= 0) or rows.pos[0] < 0 or rows.pos[-1] >= end
                or end > self.n_ctx_per_seq):
            raise ValueError("rows need distinct positions inside the recorded history")
        if sum(r.n_tokens for r in history) != rows.n_cells:
            raise ValueError(f"history records {sum(r.n_tokens for r in history)} cells, "
                             f"rows hold {rows.n_cells}")
        data = compose(self._format, rows, seq)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
        self._seqs.replace(seq, [])
        if llama_cpp.llama_state_seq_set_data_ext(self._native.ctx, buf, len(data), seq, 0) == 0:
            llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
            raise RestoreError(f"llama.cpp refused the composed state for sequence {seq}; "
                               "the sequence was cleared")
        self._seqs.replace(seq, list(history))

    def keep(self, rows: KvRows, patch: KvPatch | None = None) -> StoredKv:
        """Stored KV for the screenshot store, counted while referenced."""
        stored = StoredKv(rows, patch)
        self._live.track(stored, stored.nbytes)
        return stored

    def _check(self, seq: int) -> None:
        self._seqs.runs(seq)
        if self.kind is not ModelKind.ATTENTION:
            raise UnsafeEditError(f"KV rows of a {self.kind.value} model's sequence are not "
                                  "all its state (the recurrent part is not rows)")
