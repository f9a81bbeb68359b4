"""Reading and writing a sequence's KV rows: the engine's side of re-rotated and patched
screenshot reuse (attention-only models: ``read`` / ``write``) and of window-replay's kept
screenshots on hybrids (``read_attention`` / ``write_attention``: the attention part of a
hybrid's state as rows, its recurrent part carried through untouched).

A part the ``Engine`` owns (like ``SequenceState``); every method runs under the engine's
lock.  ``read`` serialises the sequence (``llama_state_seq_get_data``) and parses its rows
(``kv_blob``); ``write`` replaces the sequence with rows composed elsewhere (re-rotated by
``kv_rope``, patched by ``kv_patch``) through ``llama_state_seq_set_data`` — llama.cpp's
supported way in, which clears the sequence and places the cells in the order given — and
records the history the caller says it now holds.

Costs (measured in ``docs/benchmarks.md``): a read copies the whole sequence out (its state
size, ~12 KB per cell on the forged llama M), a write copies it in; both are memcpy-bound.

On a hybrid, ``write_attention`` writes the rows with the sequence's *current* recurrent
state (a PARTIAL_ONLY snapshot of it, taken just before): the attention rows and the
recurrent state then disagree about what the sequence absorbed — the caller's approximation,
which it marks in the history it records (window-replay: its placed runs' digests).

It also counts the stored KV it made (``keep``: weakref-tracked, like checkpoints), the
engine's side of the integrity check for the screenshot store.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import llama_cpp
import numpy as np

from cachepolicy.engine.checkpoint import ModelKind, Run
from cachepolicy.engine.errors import EngineError, RestoreError, UnsafeEditError
from cachepolicy.engine.gguf_meta import GgufUnreadable, metadata
from cachepolicy.engine.kv_blob import BlobFormat, KvRows, compose, parse_hybrid
from cachepolicy.engine.kv_patch import KvPatch, StoredKv
from cachepolicy.engine.kv_rope import MULTI_SECTION, RopeSpec
from cachepolicy.engine.live_count import LiveCount
from cachepolicy.engine.native import Native, locked, model_meta
from cachepolicy.engine.sequences import Sequences


_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
_HEADER = 8  # a sequence blob's u32 magic + i32 seq_id, before the memory's parts


def read_rope(model: object, model_path: str | Path | None = None) -> RopeSpec:
    """The model's RoPE as its GGUF and llama.cpp describe it (multi-section RoPE's sections
    are an array llama.cpp's metadata API does not return: read from the file)."""
    arch = model_meta(model, "general.architecture") or ""
    n_head = max(1, int(llama_cpp.llama_model_n_head(model)))
    n_embd = int(llama_cpp.llama_model_n_embd(model))
    key_length = model_meta(model, f"{arch}.attention.key_length")
    head_dim = int(key_length) if key_length else n_embd // n_head
    n_rot = model_meta(model, f"{arch}.rope.dimension_count")
    base = model_meta(model, f"{arch}.rope.freq_base")
    rope_type = int(llama_cpp.llama_model_rope_type(model))
    sections: tuple[int, ...] = ()
    if rope_type in MULTI_SECTION and model_path is not None:
        try:
            found = metadata(model_path).get(f"{arch}.rope.dimension_sections") or ()
        except GgufUnreadable:  # loaded by llama.cpp, unreadable here: rows are not re-rotated
            found = ()
        sections = tuple(int(x) for x in found)
    return RopeSpec(rope_type=rope_type, sections=sections,
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


def window_problem(kind: ModelKind, rope: RopeSpec) -> str | None:
    """Why window-replay cannot keep a ``kind`` model's retained screenshots' attention KV
    (None: it can): it needs a hybrid (attention-only models have relocate and kamera), keys
    ``kv_rope`` re-rotates, and multi-section RoPE — only there does llama.cpp let a
    sequence's recurrent state continue past positions it did not absorb (``replay``)."""
    if kind is not ModelKind.HYBRID:
        return (f"window-replay keeps a hybrid's attention KV beside its recurrent state; a "
                f"{kind.value} model has relocate and kamera instead")
    if not rope.multi_section:
        return ("the recurrent state must skip the kept screenshots' positions, which "
                "llama.cpp allows only under multi-section RoPE (qwen35)")
    return rope.rerotation_problem


class KvAccess:
    def __init__(self, native: Native, seqs: Sequences, *, kind: ModelKind,
                 n_ctx_per_seq: int, model_path: str | Path | None = None) -> None:
        self._native, self._seqs, self.kind = native, seqs, kind
        self.n_ctx_per_seq = n_ctx_per_seq
        self.rope = read_rope(native.model, model_path)
        #: cells carry (x, y, tok) extensions (llama.cpp: ``n_pos_per_embd() > 1``)
        self.cell_ext = self.rope.rope_type in MULTI_SECTION
        self._format: BlobFormat | None = None
        self._live = LiveCount()  # StoredKv objects still referenced

    def problem(self, uses_mrope: bool) -> str | None:
        """Why this model's KV rows cannot be moved and patched (None: they can)."""
        return edit_problem(self.kind, self.rope, uses_mrope)

    def window_problem(self) -> str | None:
        """``window_problem`` for this model."""
        return window_problem(self.kind, self.rope)

    @property
    def live_stored(self) -> tuple[int, int]:
        """(count, bytes) of stored KV made by ``keep`` that is still referenced."""
        return self._live.snapshot

    # ------------------------------------------------------------------ rows

    @locked
    def read(self, seq: int) -> KvRows:
        """Every cell of ``seq``, in its cell order (copies); attention-only models."""
        self._check(seq)
        return self._read(seq)

    @locked
    def read_attention(self, seq: int) -> KvRows:
        """The attention cells of ``seq`` (every cell on an attention-only model; a hybrid's
        attention layers' cells, its recurrent part left out)."""
        self._check_kind(seq, attention_part=True)
        return self._read(seq)

    def _read(self, seq: int) -> KvRows:
        if self._seqs.shift_pending:
            raise UnsafeEditError("positions were shifted since the last decode: llama.cpp "
                                  "re-rotates the keys only then, so the cached keys are stale")
        fmt, rows, rest = parse_hybrid(self._blob(seq, 0), cell_ext=self.cell_ext)
        if rest and not self.kind.has_recurrent_state:
            raise EngineError(f"{len(rest)} unexpected bytes after an attention model's KV")
        if rows.n_cells:
            self._format = fmt
        return rows

    def _blob(self, seq: int, flags: int) -> memoryview:
        ctx = self._native.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
        # not zero-filled first (create_string_buffer's memset: ~6 ms of a 23 MB window at
        # every splice); llama.cpp writes the first n bytes, only those are read
        buf = np.empty(max(1, size), dtype=np.uint8)
        n = llama_cpp.llama_state_seq_get_data_ext(
            ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq, flags)
        if n == 0 and size > 0:
            raise EngineError(f"llama.cpp returned no state for sequence {seq}")
        return memoryview(buf)[:n]  # no copy of the blob (the parse copies rows)

    @locked
    def write(self, seq: int, rows: KvRows, history: Sequence[Run]) -> None:
        """Replace ``seq`` with ``rows`` (written in position order); ``history`` is what the
        engine then records it holds (its cells must be the rows' count, its next position
        past every row's).  Attention-only models."""
        self._check(seq)
        self._write(seq, rows, history, b"")

    @locked
    def write_attention(self, seq: int, rows: KvRows, history: Sequence[Run]) -> None:
        """``write`` for the attention part: on a hybrid the sequence keeps its current
        recurrent state (snapshotted first and written back after the rows) — which has not
        absorbed rows written here: the caller's approximation to mark (see the module
        docstring)."""
        self._check_kind(seq, attention_part=True)
        recurrent = b""
        if self.kind.has_recurrent_state:
            recurrent = self._blob(seq, _PARTIAL)[_HEADER:]
        self._write(seq, rows, history, recurrent)

    def _write(self, seq: int, rows: KvRows, history: Sequence[Run],
               recurrent: bytes | memoryview) -> None:
        if self._format is None:
            raise EngineError("no sequence has been read yet: the blob format is unknown")
        if not history or rows.n_cells == 0:
            raise ValueError("nothing to write")
        if np.any(np.diff(rows.pos) < 0):  # (a stable sort of sorted rows is a copy of them)
            rows = rows.sorted()
        # rows are in position order from here on: the bounds are the first and last row's
        end = history[-1].end_pos
        if rows.pos[0] < 0 or rows.pos[-1] >= end or end > self.n_ctx_per_seq:
            raise ValueError("rows need positions in order inside the recorded history")
        if not self.cell_ext and np.any(np.diff(rows.pos) == 0):
            raise ValueError("rows need distinct positions")
        if sum(r.n_tokens for r in history) != rows.n_cells:
            raise ValueError(f"history records {sum(r.n_tokens for r in history)} cells, "
                             f"rows hold {rows.n_cells}")
        data = compose(self._format, rows, seq, recurrent=recurrent)
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)  # the composed buffer itself
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
        self._check_kind(seq, attention_part=False)

    def _check_kind(self, seq: int, *, attention_part: bool) -> None:
        self._seqs.runs(seq)
        if self.kind is ModelKind.ATTENTION or (attention_part and self.kind is ModelKind.HYBRID):
            return
        raise UnsafeEditError(f"KV rows of a {self.kind.value} model's sequence are not "
                              "all its state (the recurrent part is not rows)")
