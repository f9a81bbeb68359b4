"""Checkpoints and edits of a sequence: snapshot, restore, truncate, remove a range, and what
a sequence holds in bytes.

A part the ``Engine`` owns; every method runs under the engine's lock.  The edits that
llama.cpp would accept but that silently corrupt a recurrent state are refused here, before
the call.  It also counts the checkpoints still alive (weakref-tracked), the engine's side of
the scheduler's integrity check.
"""

from __future__ import annotations

import ctypes

import attrs
import llama_cpp

from cachepolicy.engine.checkpoint import (
    GENESIS, Checkpoint, CheckpointKind, ModelKind, Run, chain_digest, without_trailing_rebase,
)
from cachepolicy.engine.live_count import LiveCount
from cachepolicy.engine.native import Native, locked
from cachepolicy.engine.records import history_prefix_at
from cachepolicy.engine.sequences import Sequences
from cachepolicy.engine.errors import EngineError, RestoreError, UnsafeEditError

_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


class SequenceState:
    def __init__(self, native: Native, seqs: Sequences, *, model_id: str,
                 kind: ModelKind) -> None:
        self._native, self._seqs = native, seqs
        self.model_id, self.kind = model_id, kind
        self._live = LiveCount()  # Checkpoint objects still referenced

    @property
    def live_checkpoints(self) -> tuple[int, int]:
        """(count, bytes) of checkpoints made by this engine that are still referenced."""
        return self._live.snapshot

    @locked
    def checkpoint(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> Checkpoint:
        """Snapshot ``seq``.  PARTIAL_ONLY (recurrent state only) exists on recurrent models."""
        hist = self._seqs.runs(seq)
        if kind is CheckpointKind.PARTIAL_ONLY and not self.kind.has_recurrent_state:
            raise UnsafeEditError("an attention-only model has no recurrent state to checkpoint; "
                                  "take a FULL checkpoint or truncate directly")
        if self._seqs.shift_pending and kind is CheckpointKind.FULL:
            raise UnsafeEditError("positions were shifted since the last decode: llama.cpp "
                                  "re-rotates the keys only then, so a checkpoint now would "
                                  "hold stale keys")
        flags = _PARTIAL if kind is CheckpointKind.PARTIAL_ONLY else 0
        ctx = self._native.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, seq, flags)
        buf = ctypes.create_string_buffer(max(1, size))
        n = llama_cpp.llama_state_seq_get_data_ext(
            ctx, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), size, seq, flags)
        if n == 0 and size > 0:
            raise EngineError(f"llama.cpp returned no state for sequence {seq}")
        ckpt = Checkpoint(data=buf.raw[:n], kind=kind, pos=self._seqs.next_pos(seq),
                          n_tokens=sum(r.n_tokens for r in hist), history=tuple(hist),
                          model_id=self.model_id)
        self._live.track(ckpt, n)
        return ckpt

    def _set_state(self, seq: int, ckpt: Checkpoint, flags: int) -> None:
        data = ckpt.data
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        nread = llama_cpp.llama_state_seq_set_data_ext(self._native.ctx, buf, len(data), seq,
                                                       flags)
        if nread == 0:
            llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
            self._seqs.replace(seq, [])
            raise RestoreError(f"llama.cpp refused the checkpoint for sequence {seq}; "
                               "the sequence was cleared")

    @locked
    def restore(self, seq: int, ckpt: Checkpoint) -> None:
        """Replace ``seq``'s state with a FULL checkpoint (taken on any sequence)."""
        self._seqs.runs(seq)
        if ckpt.model_id != self.model_id:
            raise RestoreError("checkpoint was taken on another model")
        if ckpt.kind is not CheckpointKind.FULL:
            raise RestoreError("a PARTIAL_ONLY checkpoint holds no attention KV; "
                               "use truncate(seq, pos, via=checkpoint)")
        llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
        self._seqs.replace(seq, [])
        self._set_state(seq, ckpt, 0)
        self._seqs.replace(seq, list(ckpt.history))

    @locked
    def truncate(self, seq: int, pos: int, *, via: Checkpoint | None = None) -> None:
        """Cut ``seq`` back so that ``pos`` is its next position.

        Attention-only models: a plain tail trim (``via`` is not needed).  Recurrent / hybrid
        models: only through a PARTIAL_ONLY checkpoint taken at ``pos`` on this same history
        (restore its recurrent state, then trim the attention KV); anything else raises
        ``UnsafeEditError`` and leaves the sequence untouched.
        """
        hist = self._seqs.runs(seq)
        end = self._seqs.next_pos(seq)
        mem = self._native.mem
        if not 0 <= pos <= end:
            raise ValueError(f"truncate position {pos} outside 0..{end}")
        keep = history_prefix_at(hist, pos)
        # a rebase run at ``pos`` itself (``replay_cut``) describes only the recurrent state,
        # which the checkpoint replaces: compare what the attention KV holds
        if via is not None and (without_trailing_rebase(via.history)
                                != without_trailing_rebase(keep) or via.pos != pos):
            raise UnsafeEditError("checkpoint was taken on another history or position")
        if not self.kind.has_recurrent_state:
            if pos < end and not llama_cpp.llama_memory_seq_rm(mem, seq, pos, -1):
                raise EngineError(f"llama.cpp refused to trim sequence {seq} at {pos}")
            self._seqs.replace(seq, keep)
            return
        if via is None or via.kind is not CheckpointKind.PARTIAL_ONLY:
            raise UnsafeEditError(
                f"a {self.kind.value} model cannot drop positions from its recurrent state; "
                f"truncate needs a PARTIAL_ONLY checkpoint taken at position {pos}")
        if via.model_id != self.model_id:
            raise RestoreError("checkpoint was taken on another model")
        self._set_state(seq, via, _PARTIAL)
        if pos < end and not llama_cpp.llama_memory_seq_rm(mem, seq, pos, -1):
            llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
            self._seqs.replace(seq, [])
            raise EngineError(f"attention trim of sequence {seq} at {pos} failed; "
                              "sequence cleared")
        self._seqs.replace(seq, list(via.history))  # what its recurrent state absorbed

    @locked
    def remove_range(self, seq: int, p0: int, p1: int) -> None:
        """Remove positions [p0, p1) and shift later ones down (attention-only models).

        On recurrent / hybrid models llama.cpp would return success here while the removed
        tokens stay inside the recurrent state, so this raises ``UnsafeEditError`` instead.
        """
        hist = self._seqs.runs(seq)
        end = self._seqs.next_pos(seq)
        mem = self._native.mem
        if self.kind.has_recurrent_state:
            raise UnsafeEditError(
                f"cannot remove positions [{p0}, {p1}) from the middle of a {self.kind.value} "
                "model's sequence: the recurrent state keeps what it absorbed (llama.cpp would "
                "report success and silently corrupt it)")
        if not 0 <= p0 < p1 <= end:
            raise ValueError(f"range [{p0}, {p1}) outside 0..{end}")
        if p1 < end and not llama_cpp.llama_memory_can_shift(mem):
            raise UnsafeEditError("this model's memory cannot shift positions")
        starts = {r.pos0 for r in hist} | {end}
        if p0 not in starts or p1 not in starts:
            raise UnsafeEditError("remove_range must cut at run boundaries")
        if not llama_cpp.llama_memory_seq_rm(mem, seq, p0, p1):
            raise EngineError("llama.cpp refused the range removal")
        delta = p1 - p0
        if p1 < end:
            llama_cpp.llama_memory_seq_add(mem, seq, p1, -1, -delta)
            self._seqs.shift_pending = True
        # The survivors are no longer the history they were: re-chain their digests with an
        # "edited" tag so no checkpoint of the unedited history can match them.
        new: list[Run] = []
        prev = GENESIS
        for r in hist:
            if p0 <= r.pos0 < p1:
                continue
            moved = r.pos0 >= p1
            tag = b"edited" if moved else b""
            prev = chain_digest(prev, r.kind, tag + r.digest)
            new.append(attrs.evolve(r, pos0=r.pos0 - delta if moved else r.pos0, digest=prev,
                                    shifted=r.shifted or moved))
        self._seqs.replace(seq, new)

    # ------------------------------------------------------------------ accounting

    @locked
    def state_bytes(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> int:
        """What llama.cpp says a checkpoint of ``seq`` would take right now."""
        self._seqs.runs(seq)
        flags = _PARTIAL if kind is CheckpointKind.PARTIAL_ONLY else 0
        return int(llama_cpp.llama_state_seq_get_size_ext(self._native.ctx, seq, flags))

    @locked
    def held_bytes(self, seq: int) -> int:
        """What ``seq`` holds, as llama.cpp reports it: 0 for an empty sequence (whose
        serialised form is only headers), else its state size."""
        if not self._seqs.runs(seq):
            return 0
        return int(llama_cpp.llama_state_seq_get_size_ext(self._native.ctx, seq, 0))
