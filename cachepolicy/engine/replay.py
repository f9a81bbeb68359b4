"""The one approximate edit of a sequence: keep its attention KV, set its recurrent state to
a base — the engine's side of tail replay (hybrid / recurrent models).

``replay_cut(seq, pos, base)`` keeps the attention KV of positions ``[0, pos)`` and sets the
recurrent state to ``base``: a PARTIAL_ONLY checkpoint taken on this sequence's history at a
position ``b <= pos``, or None — the zero state.  The caller then prefills ("replays") the
last tokens before the point where its prompt diverges, and goes on.  Through llama.cpp's API
a replayed token runs through every layer, so the replay recomputes the recurrent state AND
the replayed tokens' attention KV, both from the approximate state below them: what stays
exact is the attention KV of ``[0, pos)``, nothing after it.

Exact only when ``b == pos`` (then it is ``truncate``).  Otherwise APPROXIMATE: the recurrent
state never absorbed ``[b, pos)``.  Such a cut appends a ``REBASE`` run (no rows) whose digest
chains over the base; every run fed after it chains on it, so no exact comparison —
``reuse.best_start``, ``truncate``'s history check, an exact policy's checkpoint digests —
ever matches an approximate history: an exact path cannot reach an approximate state.  The
mark stays until the sequence is cleared or restored to an exact checkpoint.

How, in llama.cpp (0.3.36's vendored hybrid memory; notes/llama-cpp.md):

* ``llama_state_seq_set_data_ext(..., PARTIAL_ONLY)`` reads only the recurrent part of a
  hybrid memory.  A PARTIAL_ONLY snapshot of an EMPTY sequence holds no recurrent cell
  (68 bytes on the tiny qwen35): restoring it removes the sequence's recurrent cell, and the
  next ``llama_decode`` gives it a fresh one, zeroed as a new sequence's is — the zero base.
  The snapshot is taken once, at load, from sequence 0 while every sequence is empty;
* ``llama_memory_seq_rm(seq, pos, -1)`` then removes the attention cells from ``pos`` on and
  leaves the recurrent state alone (its last position is below ``pos``);
* the hybrid memory reports a sequence's last position as the smaller of its two parts'.
  Under multi-section RoPE (qwen35, Qwen-VL) a batch may start past it ("X < Y"), so a
  checkpoint base older than ``pos`` works; with one position per row llama.cpp requires
  ``Y = X + 1``, so there only the zero base (no recurrent position at all) is accepted.

A part the ``Engine`` owns; every method runs under the engine's lock.
"""

from __future__ import annotations

import ctypes

import attrs
import llama_cpp

from cachepolicy.engine.checkpoint import (
    GENESIS, Checkpoint, CheckpointKind, ModelKind, Run, RunKind, chain_digest,
    without_trailing_rebase,
)
from cachepolicy.engine.errors import EngineError, RestoreError, UnsafeEditError
from cachepolicy.engine.native import Native, locked
from cachepolicy.engine.records import history_prefix_at
from cachepolicy.engine.sequences import Sequences

_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
_JUMPING_ROPE = frozenset({llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE})


@attrs.frozen
class ReplayCut:
    """What ``replay_cut`` did: the attention KV of ``[0, pos)`` kept, the recurrent state
    from ``base_pos`` (0: the zero state)."""

    pos: int
    base_pos: int

    @property
    def skipped(self) -> int:
        """Positions the recurrent state never absorbed."""
        return self.pos - self.base_pos

    @property
    def approximate(self) -> bool:
        return self.skipped > 0


class RecurrentRebase:
    def __init__(self, native: Native, seqs: Sequences, *, model_id: str,
                 kind: ModelKind) -> None:
        self._native, self._seqs = native, seqs
        self.model_id, self.kind = model_id, kind
        self.positions_may_jump = (int(llama_cpp.llama_model_rope_type(native.model))
                                   in _JUMPING_ROPE)
        # taken while every sequence is empty (the engine's parts are made before anything
        # is fed): a recurrent-only snapshot with no cell
        self._zero = self._empty_snapshot(0) if kind.has_recurrent_state else b""

    def _empty_snapshot(self, seq: int) -> bytes:
        assert not self._seqs.runs(seq), "the zero state is taken from an empty sequence"
        ctx = self._native.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, _PARTIAL)
        buf = ctypes.create_string_buffer(max(1, size))
        n = llama_cpp.llama_state_seq_get_data_ext(
            ctx, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), size, seq, _PARTIAL)
        if n == 0:
            raise EngineError("llama.cpp returned no recurrent state for an empty sequence")
        return buf.raw[:n]

    @locked
    def replay_cut(self, seq: int, pos: int, *, base: Checkpoint | None = None) -> ReplayCut:
        """Keep the attention KV of ``[0, pos)``, set the recurrent state to ``base`` (a
        PARTIAL_ONLY checkpoint of this history at a position <= ``pos``; None: zero).
        APPROXIMATE unless the base was taken at ``pos``: see the module docstring.  Refused
        (``UnsafeEditError``, the sequence untouched) on attention-only models, inside an
        image, with a base of another history or model, or with a base older than ``pos``
        on a model whose positions may not jump."""
        hist = self._seqs.runs(seq)
        end = self._seqs.next_pos(seq)
        if not self.kind.has_recurrent_state:
            raise UnsafeEditError("an attention-only model has no recurrent state to rebase; "
                                  "truncate it instead")
        if not 0 <= pos <= end:
            raise ValueError(f"replay cut position {pos} outside 0..{end}")
        keep = list(without_trailing_rebase(history_prefix_at(hist, pos)))
        base_pos, data, base_digest = 0, self._zero, GENESIS
        if base is not None:
            if base.kind is not CheckpointKind.PARTIAL_ONLY:
                raise UnsafeEditError("a replay base is a PARTIAL_ONLY (recurrent) checkpoint")
            if base.model_id != self.model_id:
                raise RestoreError("checkpoint was taken on another model")
            if base.pos > pos or (without_trailing_rebase(base.history)
                                  != without_trailing_rebase(history_prefix_at(hist, base.pos))):
                raise UnsafeEditError("a replay base must be a checkpoint of this sequence's "
                                      f"history at or before position {pos}")
            base_pos, data, base_digest = base.pos, base.data, base.digest
        if 0 < base_pos < pos and not self.positions_may_jump:
            raise UnsafeEditError(
                f"this model needs consecutive positions: a recurrent state of position "
                f"{base_pos} cannot continue at {pos}; use the zero base")
        self._set_recurrent(seq, data)
        mem = self._native.mem
        if pos < end and not llama_cpp.llama_memory_seq_rm(mem, seq, pos, -1):
            llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
            self._seqs.replace(seq, [])
            raise EngineError(f"attention trim of sequence {seq} at {pos} failed; "
                              "sequence cleared")
        cut = ReplayCut(pos=pos, base_pos=base_pos)
        if base is not None and not cut.approximate:
            keep = list(base.history)  # exactly truncate: the base's own history
        elif cut.approximate:
            prev = keep[-1].digest if keep else GENESIS
            content = b"rebase from %d to %d over " % (base_pos, pos) + base_digest
            keep.append(Run(RunKind.REBASE, pos, 0, 0,
                            chain_digest(prev, RunKind.REBASE, content)))
        self._seqs.replace(seq, keep)
        return cut

    def _set_recurrent(self, seq: int, data: bytes) -> None:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if llama_cpp.llama_state_seq_set_data_ext(self._native.ctx, buf, len(data), seq,
                                                  _PARTIAL) == 0:
            llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
            self._seqs.replace(seq, [])
            raise RestoreError(f"llama.cpp refused the recurrent base for sequence {seq}; "
                               "the sequence was cleared")
