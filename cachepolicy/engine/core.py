"""The Engine: one llama.cpp model + context holding ``n_seq_max`` sequences.

The numerical contract it keeps is stated in the package docstring
(``cachepolicy.engine``) and checked by ``kvagent check-exact``.

Every public method takes the engine's lock: one llama context is not thread-safe.  The class
is synchronous; ``AsyncEngine`` runs it in a worker thread for the event loop.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import llama_cpp
from llama_cpp import mtmd_cpp

from cachepolicy.checkpoint import (
    ModelKind, Run, RunKind, chain_digest, history_digest,
)
from cachepolicy.engine.backend import init_backend
from cachepolicy.engine.records import (
    EngineConfig, SeqInfo, chunk_sizes,
)
from cachepolicy.engine.locking import locked as _locked
from cachepolicy.engine.sampler import Sampler
from cachepolicy.engine.state import StateMixin
from cachepolicy.engine.vision import VisionMixin
from cachepolicy.errors import (
    ContextFullError, DecodeError, EngineError, ImageError, ModelLoadError, SingleTokenPrefillError,
)
from cachepolicy.images import EmbeddingCache, EncodedImage
from cachepolicy.sampling import SamplingParams

_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def _file_identity(path: Path) -> str:
    h = hashlib.blake2b(digest_size=12)
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()


class Engine(StateMixin, VisionMixin):
    """One llama.cpp model + context with ``n_seq_max`` independent sequences."""

    def __init__(self, model_path: str | Path, mmproj_path: str | Path | None = None,
                 config: EngineConfig | None = None) -> None:
        self.config = config = config or EngineConfig()
        self._lock = threading.RLock()
        self._closed = True
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelLoadError(f"model file not found: {model_path}")
        if mmproj_path is not None and not Path(mmproj_path).is_file():
            raise ModelLoadError(f"mmproj file not found: {mmproj_path}")
        if config.n_batch < 2 or config.n_seq_max < 1 or config.n_ctx_per_seq < config.n_batch:
            raise ValueError("need n_batch >= 2, n_seq_max >= 1, n_ctx_per_seq >= n_batch")
        init_backend(config.verbose)
        self.model_path = model_path
        self.model_id = _file_identity(model_path)
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0
        # Repacked weight layouts pick a matmul kernel by the batch's row count, which
        # breaks split == one-call on quantized models; off unless speed was asked for.
        mparams.use_extra_bufts = config.fast_kernels
        self._model = llama_cpp.llama_model_load_from_file(str(model_path).encode(), mparams)
        if not self._model:
            raise ModelLoadError(f"llama.cpp could not load {model_path}")
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx_per_seq * config.n_seq_max
        cparams.n_batch = cparams.n_ubatch = config.n_batch
        cparams.n_seq_max = config.n_seq_max
        cparams.n_threads = cparams.n_threads_batch = config.n_threads
        cparams.flash_attn_type = 1 if config.flash_attn else 0  # off: split == one-call, bitwise
        cparams.kv_unified = False  # one KV stream per sequence: cell placement is reproducible
        cparams.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise ModelLoadError(f"llama.cpp could not create a context for {model_path}")
        self._closed = False
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)
        if llama_cpp.llama_model_is_hybrid(self._model):
            self.kind = ModelKind.HYBRID
        elif llama_cpp.llama_model_is_recurrent(self._model):
            self.kind = ModelKind.RECURRENT
        else:
            self.kind = ModelKind.ATTENTION
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_embd = llama_cpp.llama_model_n_embd_inp(self._model)
        self.n_params = int(llama_cpp.llama_model_n_params(self._model))
        self._hist: dict[int, list[Run]] = {s: [] for s in range(config.n_seq_max)}
        self._live_ckpt = [0, 0]  # count, bytes of Checkpoint objects still referenced
        self.image_cache = EmbeddingCache(config.image_cache_bytes)
        self._mtmd: Any = None
        self.mmproj_path = Path(mmproj_path) if mmproj_path is not None else None
        if self.mmproj_path is not None:
            self._load_mmproj(self.mmproj_path)
        (self.kv_bytes_per_token, self.recurrent_bytes_per_seq,
         self.state_overhead_bytes) = self._measure_state_bytes()

    # ------------------------------------------------------------------ lifecycle

    def _load_mmproj(self, path: Path) -> None:
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = self.config.n_threads
        params.warmup = False
        params.flash_attn_type = 0
        self._mtmd = mtmd_cpp.mtmd_init_from_file(str(path).encode(), self._model, params)
        if not self._mtmd:
            self.close()
            raise ModelLoadError(f"mtmd could not load mmproj {path} for {self.model_path}")
        self.uses_mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self._mtmd))
        self._marker = mtmd_cpp.mtmd_default_marker()

    def close(self) -> None:
        with self._lock:
            if self._mtmd:
                mtmd_cpp.mtmd_free(self._mtmd)
                self._mtmd = None
            if not self._closed:
                llama_cpp.llama_free(self._ctx)
                llama_cpp.llama_model_free(self._model)
                self._closed = True
            self.image_cache.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def has_vision(self) -> bool:
        return self._mtmd is not None

    # ------------------------------------------------------------------ text

    @_locked
    def tokenize(self, text: str, *, add_bos: bool = False, special: bool = True) -> tuple[int, ...]:
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._vocab, raw, len(raw), buf, cap, add_bos, special)
        if n < 0:
            raise EngineError(f"tokenize needed {-n} tokens, more than the {cap} allotted")
        return tuple(buf[:n])

    @_locked
    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        cap = 16 * len(tokens) + 16
        out = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self._vocab, arr, len(tokens), out, cap, False, not special)
        if n < 0:
            raise EngineError("detokenize buffer too small")
        return out.raw[:n].decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8") if raw else None

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    # ------------------------------------------------------------------ sequences

    def _check_seq(self, seq: int) -> list[Run]:
        if seq not in self._hist:
            raise ValueError(f"sequence id {seq} out of range 0..{self.config.n_seq_max - 1}")
        return self._hist[seq]

    @_locked
    def seq_info(self, seq: int) -> SeqInfo:
        hist = self._check_seq(seq)
        return SeqInfo(seq=seq, next_pos=hist[-1].end_pos if hist else 0,
                       n_tokens=sum(r.n_tokens for r in hist),
                       digest=history_digest(tuple(hist)), history=tuple(hist))

    def _next_pos(self, seq: int) -> int:
        hist = self._hist[seq]
        return hist[-1].end_pos if hist else 0

    @_locked
    def clear(self, seq: int) -> None:
        self._check_seq(seq)
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._hist[seq] = []

    # ------------------------------------------------------------------ prefill / decode

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
        batch.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if embd is not None else None
        batch.pos = pos.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_pos))
        batch.n_seq_id = n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.seq_id = ctypes.cast(seq_ptrs, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        batch.logits = logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        rc = llama_cpp.llama_decode(self._ctx, batch)
        if rc != 0:
            raise DecodeError(f"llama_decode returned {rc} on sequence(s) {np.unique(seq_ids)} "
                              f"({m} rows)", rc)

    def _last_logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def _reserve_room(self, seq: int, n_tokens: int, n_pos: int) -> None:
        hist = self._hist[seq]
        used = sum(r.n_tokens for r in hist)
        limit = self.config.n_ctx_per_seq
        if used + n_tokens > limit or self._next_pos(seq) + n_pos > limit:
            raise ContextFullError(
                f"sequence {seq} holds {used} tokens; {n_tokens} more exceed n_ctx_per_seq={limit}")

    def _run_batches(self, seq: int, start_hist_len: int, start_pos: int,
                     batches: list[Callable[[], None]]) -> None:
        """Run decode closures; on failure leave the sequence as it was before the call."""
        try:
            for run in batches:
                run()
        except DecodeError:
            if self._trim_tail(seq, start_pos):
                del self._hist[seq][start_hist_len:]
            else:  # a recurrent state cannot be trimmed: drop the sequence, tell the caller
                llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
                self._hist[seq] = []
            raise

    def _trim_tail(self, seq: int, pos: int) -> bool:
        if self.kind.has_recurrent_state:
            return False
        return bool(llama_cpp.llama_memory_seq_rm(self._mem, seq, pos, -1))

    @_locked
    def prefill_tokens(self, seq: int, tokens: Sequence[int], *, logits: bool = True,
                       allow_single: bool = False) -> np.ndarray | None:
        """Append text tokens to ``seq``; returns the last position's logits if asked."""
        hist = self._check_seq(seq)
        n = len(tokens)
        if n == 0:
            raise ValueError("nothing to prefill")
        if n == 1 and not allow_single:
            raise SingleTokenPrefillError(
                "a 1-token prefill is not bitwise comparable with a multi-token one; "
                "merge it with neighbouring text or pass allow_single=True")
        self._reserve_room(seq, n, n)
        toks = np.asarray(tokens, dtype=np.int32)
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise ValueError(f"token id out of range 0..{self.n_vocab - 1}")
        pos0 = self._next_pos(seq)
        start_len = len(hist)
        batches, off = [], 0
        for size in chunk_sizes(n, self.config.n_batch):
            last = off + size == n
            batches.append(functools.partial(
                self._decode, seq, tokens=toks[off:off + size], embd=None,
                pos=np.arange(pos0 + off, pos0 + off + size, dtype=np.int32),
                want_logits=logits and last))
            off += size
        self._run_batches(seq, start_len, pos0, batches)
        digest = chain_digest(history_digest(tuple(hist)), RunKind.TEXT, toks.tobytes())
        hist.append(Run(RunKind.TEXT, pos0, n, n, digest, tuple(int(t) for t in toks)))
        return self._last_logits() if logits else None

    @_locked
    def prefill_image(self, seq: int, image: EncodedImage, *, logits: bool = False) -> np.ndarray | None:
        """Append an encoded image's embedding rows at the decoder positions mtmd assigns."""
        hist = self._check_seq(seq)
        if image.embeddings.shape[1] != self.n_embd:
            raise ImageError(f"image rows have width {image.embeddings.shape[1]}, model needs {self.n_embd}")
        n = image.n_tokens
        if n < 2:
            raise SingleTokenPrefillError("a 1-row image prefill is not bitwise comparable")
        self._reserve_room(seq, n, image.n_pos)
        pos0 = self._next_pos(seq)
        positions = image.positions_at(pos0)  # (n_pos_per_embd, n)
        rows = np.ascontiguousarray(image.embeddings, dtype=np.float32)
        start_len = len(hist)
        batches, off = [], 0
        for size in chunk_sizes(n, self.config.n_batch):
            last = off + size == n
            batches.append(functools.partial(
                self._decode, seq, tokens=None, embd=rows[off:off + size],
                pos=positions[:, off:off + size].reshape(-1), want_logits=logits and last))
            off += size
        if image.non_causal:
            llama_cpp.llama_set_causal_attn(self._ctx, False)
        try:
            self._run_batches(seq, start_len, pos0, batches)
        finally:
            if image.non_causal:
                llama_cpp.llama_set_causal_attn(self._ctx, True)
        digest = chain_digest(history_digest(tuple(hist)), RunKind.EMBEDDINGS,
                              image.image_id.encode())
        hist.append(Run(RunKind.EMBEDDINGS, pos0, image.n_pos, n, digest, ()))
        return self._last_logits() if logits else None

    @_locked
    def decode_token(self, seq: int, token: int) -> np.ndarray:
        """Feed one generated token (a 1-row batch, as every decode step is); returns logits."""
        hist = self._check_seq(seq)
        self._reserve_room(seq, 1, 1)
        pos0 = self._next_pos(seq)
        toks = np.asarray([token], dtype=np.int32)
        self._run_batches(seq, len(hist), pos0, [functools.partial(
            self._decode, seq, tokens=toks, embd=None,
            pos=np.asarray([pos0], dtype=np.int32), want_logits=True)])
        digest = chain_digest(history_digest(tuple(hist)), RunKind.TEXT, toks.tobytes())
        hist.append(Run(RunKind.TEXT, pos0, 1, 1, digest, (int(token),)))
        return self._last_logits()

    @_locked
    def decode_many(self, items: Sequence[tuple[int, int]]) -> list[np.ndarray]:
        """Feed one token to each of several sequences in ONE llama_decode (a multi-row
        batch); returns each row's logits.  Faster per token than one call per sequence, but a
        row's logits are not bitwise those of a 1-row decode (another kernel): kvagent's exact
        paths never use it; ``kvagent bench-decode`` measures both."""
        seqs = [s for s, _ in items]
        if len(set(seqs)) != len(seqs) or not seqs:
            raise ValueError("decode_many needs distinct sequences")
        for s in seqs:
            self._check_seq(s)
            self._reserve_room(s, 1, 1)
        toks = np.asarray([t for _, t in items], dtype=np.int32)
        pos = np.asarray([self._next_pos(s) for s in seqs], dtype=np.int32)
        self._decode(np.asarray(seqs, dtype=np.int32), tokens=toks, embd=None, pos=pos,
                     want_logits=np.ones(len(seqs), dtype=np.int8))
        out = []
        for i, (s, tok) in enumerate(items):
            hist = self._hist[s]
            digest = chain_digest(history_digest(tuple(hist)), RunKind.TEXT,
                                  np.asarray([tok], dtype=np.int32).tobytes())
            hist.append(Run(RunKind.TEXT, int(pos[i]), 1, 1, digest, (int(tok),)))
            ptr = llama_cpp.llama_get_logits_ith(self._ctx, i)
            out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        return out

    def generate(self, seq: int, logits: np.ndarray, max_tokens: int,
                 sampling: SamplingParams | None = None, *,
                 stop_at_eog: bool = True) -> list[int]:
        """Sample up to ``max_tokens`` tokens starting from ``logits`` (the prompt's last).

        Every sampled token but the last is fed back; generation stops after an
        end-of-generation token (unless ``stop_at_eog`` is False: benchmarks decode a fixed
        number of tokens).
        """
        sampler = self.sampler(sampling or SamplingParams())
        out: list[int] = []
        try:
            for i in range(max_tokens):
                tok = sampler.sample(logits)
                out.append(tok)
                sampler.accept(tok)
                if (stop_at_eog and self.is_end_of_generation(tok)) or i == max_tokens - 1:
                    break
                logits = self.decode_token(seq, tok)
        finally:
            sampler.close()
        return out

    def sampler(self, params: SamplingParams) -> Sampler:
        return Sampler(self._vocab, self.n_vocab, params)
