"""Feeding rows to llama.cpp: prefill of text and image embeddings in chunks, and the decode
lanes' calls (``DecodeBatcher`` drives those).

Keeps the engine's numerical contract (see the package docstring): chunks come from
``chunk_sizes`` (never a 1-row batch inside a multi-row prefill), and a failed llama_decode
leaves the sequence as it was before the call (attention-only: a tail trim; recurrent or
hybrid: the sequence is cleared and the caller told).
"""

from __future__ import annotations

import ctypes
import functools
import time
from collections.abc import Callable, Sequence

import llama_cpp
import numpy as np

from cachepolicy.engine.checkpoint import ModelKind, Run, RunKind, chain_digest, history_digest
from cachepolicy.engine.native import Native, locked
from cachepolicy.engine.records import PAD_TOKEN, chunk_sizes
from cachepolicy.engine.sequences import Sequences
from cachepolicy.engine.errors import (
    ContextFullError, DecodeError, ImageError, SingleTokenPrefillError, UnsafeEditError,
)
from cachepolicy.engine.images import EncodedImage

_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


class Decoder:
    def __init__(self, native: Native, seqs: Sequences, *, kind: ModelKind, n_batch: int,
                 n_ctx_per_seq: int, n_vocab: int, n_embd: int) -> None:
        self._native, self._seqs, self.kind = native, seqs, kind
        self.n_batch, self.n_ctx_per_seq = n_batch, n_ctx_per_seq
        self.n_vocab, self.n_embd = n_vocab, n_embd

    # ------------------------------------------------------------------ one llama_decode

    def _decode(self, seq: int | np.ndarray, *, tokens: np.ndarray | None,
                embd: np.ndarray | None, pos: np.ndarray, want_logits: bool | np.ndarray) -> None:
        """One llama_decode of ``m`` rows; ``seq`` is one id or one id per row, positions are
        already laid out, ``want_logits`` is for the last row or a per-row mask."""
        m = len(tokens) if tokens is not None else len(embd)  # type: ignore[arg-type]
        seq_ids = np.ascontiguousarray(np.broadcast_to(np.asarray(seq, dtype=np.int32), (m,)))
        seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * m)(
            *[ctypes.cast(seq_ids.ctypes.data + 4 * i, ctypes.POINTER(ctypes.c_int32))
              for i in range(m)])
        n_seq_id = np.ones(m, dtype=np.int32)
        if isinstance(want_logits, np.ndarray):
            logits = want_logits.astype(np.int8)
        else:
            logits = np.zeros(m, dtype=np.int8)
            logits[-1] = 1 if want_logits else 0
        pos = np.ascontiguousarray(pos, dtype=np.int32)
        batch = llama_cpp.llama_batch()
        batch.n_tokens = m
        batch.token = (tokens.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token))
                       if tokens is not None else None)
        batch.embd = (embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                      if embd is not None else None)
        batch.pos = pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        batch.n_seq_id = n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(seq_ptrs, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        batch.logits = logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        rc = self._native.compute.run(llama_cpp.llama_decode, self._native.ctx, batch)
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} on sequence(s) {np.unique(seq_ids)} "
                              f"({m} rows)", rc)
        self._seqs.shift_pending = False  # the decode applied every pending K-shift first

    def logits(self, row: int = -1) -> np.ndarray:
        """A copy of the last call's logits of ``row`` (-1: the last row with logits)."""
        ptr = llama_cpp.llama_get_logits_ith(self._native.ctx, row)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _chunk(self, seq: int, *, tokens: np.ndarray | None, embd: np.ndarray | None,
               pos: np.ndarray, want_logits: bool, rows_out: list[np.ndarray] | None) -> None:
        """One chunk of a prefill: with ``rows_out`` every row asks for logits and their
        copies are appended to it (row order), else only the last row if ``want_logits``."""
        m = len(tokens) if tokens is not None else len(embd)  # type: ignore[arg-type]
        mask: bool | np.ndarray = want_logits if rows_out is None else np.ones(m, dtype=np.int8)
        self._decode(seq, tokens=tokens, embd=embd, pos=pos, want_logits=mask)
        if rows_out is not None:
            rows_out.extend(self.logits(i) for i in range(m))

    def _check_at(self, seq: int, at: int | None) -> None:
        if at is not None and (self._seqs.runs(seq) or at < 0):
            raise ValueError("a prefill starts at a chosen position only on an empty "
                             "sequence, at a position >= 0")

    def _reserve_room(self, seq: int, n_tokens: int, n_pos: int) -> None:
        used = self._seqs.n_tokens(seq)
        limit = self.n_ctx_per_seq
        if used + n_tokens > limit or self._seqs.next_pos(seq) + n_pos > limit:
            raise ContextFullError(f"sequence {seq} holds {used} tokens; {n_tokens} more "
                                   f"exceed n_ctx_per_seq={limit}")

    def _run_batches(self, seq: int, start_runs: int, start_pos: int,
                     batches: list[Callable[[], None]]) -> None:
        """Run decode closures; on failure leave the sequence as it was before the call."""
        try:
            for run in batches:
                run()
        except DecodeError:
            runs = self._seqs.runs(seq)
            if (not self.kind.has_recurrent_state
                    and llama_cpp.llama_memory_seq_rm(self._native.mem, seq, start_pos, -1)):
                del runs[start_runs:]
            else:  # a recurrent state cannot be trimmed: drop the sequence, tell the caller
                llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
                self._seqs.replace(seq, [])
            raise

    # ------------------------------------------------------------------ prefill / decode

    @locked
    def prefill_tokens(self, seq: int, tokens: Sequence[int], *, logits: bool = True,
                       allow_single: bool = False, all_logits: bool = False,
                       at: int | None = None) -> np.ndarray | None:
        """Append text tokens to ``seq``; returns the last position's logits if asked, or
        with ``all_logits`` every row's, shape ``(n, n_vocab)`` (the trainer's parity check:
        the output matmul then has ``n`` rows, so the last row may differ from a
        ``logits=True`` call's in the last bits, as any 1-row matmul does).  ``at`` starts
        an EMPTY sequence at that position instead of 0 (a context placed at an offset:
        the screenshot store's position tests)."""
        runs = self._seqs.runs(seq)
        self._check_at(seq, at)
        n = len(tokens)
        if n == 0:
            raise ValueError("nothing to prefill")
        if n == 1 and not allow_single:
            raise SingleTokenPrefillError(
                "a 1-token prefill is not bitwise comparable with a multi-token one; "
                "merge it with neighbouring text or pass allow_single=True")
        self._reserve_room(seq, n, n + (at or 0))
        toks = np.asarray(tokens, dtype=np.int32)
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        pos0 = self._seqs.next_pos(seq) if at is None else at
        start = len(runs)
        rows_out: list[np.ndarray] | None = [] if all_logits else None
        batches, off = [], 0
        for size in chunk_sizes(n, self.n_batch):
            batches.append(functools.partial(
                self._chunk, seq, tokens=toks[off:off + size], embd=None,
                pos=np.arange(pos0 + off, pos0 + off + size, dtype=np.int32),
                want_logits=logits and off + size == n, rows_out=rows_out))
            off += size
        self._run_batches(seq, start, pos0, batches)
        digest = chain_digest(history_digest(tuple(runs)), RunKind.TEXT, toks.tobytes())
        runs.append(Run(RunKind.TEXT, pos0, n, n, digest, tuple(int(t) for t in toks)))
        if rows_out is not None:
            return np.stack(rows_out)
        return self.logits() if logits else None

    @locked
    def prefill_image(self, seq: int, image: EncodedImage, *, logits: bool = False,
                      all_logits: bool = False) -> np.ndarray | None:
        """Append an encoded image's embedding rows at the decoder positions mtmd assigns;
        returns the last row's logits if asked, or with ``all_logits`` every row's."""
        runs = self._seqs.runs(seq)
        if image.embeddings.shape[1] != self.n_embd:
            raise ImageError(f"image rows have width {image.embeddings.shape[1]}, "
                             f"model needs {self.n_embd}")
        n = image.n_tokens
        if n < 2:
            raise SingleTokenPrefillError("a 1-row image prefill is not bitwise comparable")
        self._reserve_room(seq, n, image.n_pos)
        pos0 = self._seqs.next_pos(seq)
        positions = image.positions_at(pos0)  # (n_pos_per_embd, n)
        rows = np.ascontiguousarray(image.embeddings, dtype=np.float32)
        start = len(runs)
        rows_out: list[np.ndarray] | None = [] if all_logits else None
        batches, off = [], 0
        for size in chunk_sizes(n, self.n_batch):
            batches.append(functools.partial(
                self._chunk, seq, tokens=None, embd=rows[off:off + size],
                pos=positions[:, off:off + size].reshape(-1),
                want_logits=logits and off + size == n, rows_out=rows_out))
            off += size
        ctx = self._native.ctx
        if image.non_causal:
            llama_cpp.llama_set_causal_attn(ctx, False)
        try:
            self._run_batches(seq, start, pos0, batches)
        finally:
            if image.non_causal:
                llama_cpp.llama_set_causal_attn(ctx, True)
        digest = chain_digest(history_digest(tuple(runs)), RunKind.EMBEDDINGS,
                              image.image_id.encode())
        runs.append(Run(RunKind.EMBEDDINGS, pos0, image.n_pos, n, digest, ()))
        if rows_out is not None:
            return np.stack(rows_out)
        return self.logits() if logits else None

    @locked
    def run_lanes(self, rows: Sequence[tuple[int, int | None, int]],
                  ) -> tuple[list[np.ndarray | None], float]:
        """One llama_decode over consecutive decode lanes, in lane order: a generation's lane
        feeds its token at its position, an empty lane a pad row (a fixed token at position
        0, removed again after the call).  Every row asks for logits; returns the logits of
        the real rows (None for pads) and the seconds the call took."""
        ids = np.asarray([lane for lane, _, _ in rows], dtype=np.int32)
        if len(ids) > self.n_batch:  # llama.cpp would abort the process (GGML_ASSERT)
            raise ValueError(f"{len(ids)} lane rows exceed a call's {self.n_batch} rows")
        if len(ids) > 1 and not np.array_equal(np.diff(ids), np.ones(len(ids) - 1)):
            # llama.cpp computes non-consecutive streams apart: the row count would change
            raise ValueError(f"lane rows must be consecutive sequence ids, got {ids.tolist()}")
        toks = np.asarray([PAD_TOKEN if t is None else t for _, t, _ in rows], dtype=np.int32)
        pos = np.asarray([p if t is not None else 0 for _, t, p in rows], dtype=np.int32)
        mem = self._native.mem
        t0 = time.perf_counter()
        try:
            self._decode(ids, tokens=toks, embd=None, pos=pos,
                         want_logits=np.ones(len(rows), dtype=np.int8))
        finally:
            for lane, token, _ in rows:  # idle lanes are empty between calls
                if token is None:
                    llama_cpp.llama_memory_seq_rm(mem, lane, -1, -1)
        elapsed = time.perf_counter() - t0
        return ([self.logits(i) if t is not None else None for i, (_, t, _) in enumerate(rows)],
                elapsed)

    @locked
    def run_tokens(self, lane: int, tokens: Sequence[int], pos0: int,
                   ) -> tuple[list[np.ndarray], float]:
        """One llama_decode of ``tokens`` on ``lane`` at positions ``pos0``.. (a run: one
        sequence, every row with logits); returns each row's logits and the seconds."""
        toks = np.asarray(tokens, dtype=np.int32)
        if len(toks) == 0:
            raise ValueError("an empty run")
        if len(toks) > self.n_batch:  # llama.cpp would abort the process (GGML_ASSERT)
            raise ValueError(f"a run of {len(toks)} tokens exceeds a call's {self.n_batch} "
                             "rows")
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        t0 = time.perf_counter()
        self._decode(lane, tokens=toks, embd=None,
                     pos=np.arange(pos0, pos0 + len(toks), dtype=np.int32),
                     want_logits=np.ones(len(toks), dtype=np.int8))
        elapsed = time.perf_counter() - t0
        return [self.logits(i) for i in range(len(toks))], elapsed

    @locked
    def snapshot_lane(self, lane: int) -> bytes:
        """The lane's recurrent state (PARTIAL_ONLY): what ``rewind_lane`` restores."""
        ctx = self._native.ctx
        size = llama_cpp.llama_state_seq_get_size_ext(ctx, lane, _PARTIAL)
        buf = ctypes.create_string_buffer(max(1, size))
        n = llama_cpp.llama_state_seq_get_data_ext(
            ctx, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), size, lane, _PARTIAL)
        if n == 0 and size > 0:
            raise DecodeError(f"llama.cpp returned no recurrent state for lane {lane}", 0)
        return buf.raw[:n]

    @locked
    def rewind_lane(self, lane: int, pos: int, snapshot: bytes | None) -> None:
        """Cut the lane back so that ``pos`` is its next position: attention-only models trim
        the tail; recurrent ones restore ``snapshot`` (taken at ``pos``) and trim the
        attention part (the engine's truncate, on a lane)."""
        mem = self._native.mem
        if self.kind.has_recurrent_state:
            if snapshot is None:
                raise UnsafeEditError("a recurrent lane rewinds only through a snapshot")
            buf = (ctypes.c_uint8 * len(snapshot)).from_buffer_copy(snapshot)
            if llama_cpp.llama_state_seq_set_data_ext(self._native.ctx, buf, len(snapshot),
                                                      lane, _PARTIAL) == 0:
                llama_cpp.llama_memory_seq_rm(mem, lane, -1, -1)
                raise DecodeError(f"llama.cpp refused the snapshot of lane {lane}", 0)
        if not llama_cpp.llama_memory_seq_rm(mem, lane, pos, -1):
            llama_cpp.llama_memory_seq_rm(mem, lane, -1, -1)
            raise DecodeError(f"llama.cpp could not trim lane {lane} at {pos}", 0)

    @locked
    def copy_to_lane(self, seq: int, lane: int) -> int:
        """Copy ``seq``'s state (KV cells and recurrent state) into the empty ``lane``;
        returns the lane's next position."""
        mem = self._native.mem
        llama_cpp.llama_memory_seq_rm(mem, lane, -1, -1)
        llama_cpp.llama_memory_seq_cp(mem, seq, lane, -1, -1)
        return self._seqs.next_pos(seq)

    @locked
    def occupied(self, seq: int) -> bool:
        """Whether llama.cpp holds any cell of ``seq`` (for sequences outside the engine's
        bookkeeping: the decode lanes)."""
        return int(llama_cpp.llama_memory_seq_pos_max(self._native.mem, seq)) >= 0

    @locked
    def clear_lane(self, lane: int) -> None:
        llama_cpp.llama_memory_seq_rm(self._native.mem, lane, -1, -1)
