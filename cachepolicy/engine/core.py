"""The Engine: one llama.cpp model + context holding ``n_seq_max`` sequences.

Numerical contract (see ../shared/notes/llama-cpp.md, and ``kvagent check-exact``):
* flash attention is OFF and n_ubatch == n_batch, so splitting a prefill into several calls
  gives bitwise the same logits as one call;
* no prefill ever sends a 1-token batch when it has more than one token (a 1-token batch takes
  another kernel); a 1-token prefill call is refused unless explicitly allowed;
* each sequence has its own KV stream (``kv_unified=False``), so a sequence's KV cells sit at
  the same indices whether it was prefilled from scratch or restored from a checkpoint;
* edits that llama.cpp would accept but that silently corrupt a recurrent state (a middle-range
  removal, a tail trim without a recurrent checkpoint) are refused with ``UnsafeEditError``.

Every public method takes the engine's lock: one llama context is not thread-safe.  The class
is synchronous; ``AsyncEngine`` runs it in a worker thread for the event loop.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import numpy as np

import llama_cpp
from llama_cpp import mtmd_cpp

from cachepolicy.checkpoint import (
    GENESIS, Checkpoint, CheckpointKind, ModelKind, Run, RunKind, chain_digest, history_digest,
)
from cachepolicy.engine.backend import init_backend
from cachepolicy.engine.records import (
    EngineConfig, MemoryReport, SeqInfo, chunk_sizes, history_prefix_at,
)
from cachepolicy.engine.sampler import Sampler
from cachepolicy.engine.vision import MtmdChunks
from cachepolicy.errors import (
    ContextFullError, DecodeError, EngineError, ImageError, ModelLoadError, NoVisionError,
    RestoreError, SingleTokenPrefillError, UnsafeEditError,
)
from cachepolicy.images import DecodedImage, EmbeddingCache, EncodedImage, decode_png
from cachepolicy.sampling import SamplingParams

_F = TypeVar("_F", bound=Callable[..., Any])
_PARTIAL = 1  # LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY


def _locked(method: _F) -> _F:
    @functools.wraps(method)
    def wrapper(self: Engine, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise EngineError("engine is closed")
            return method(self, *args, **kwargs)
    return wrapper  # type: ignore[return-value]


def _file_identity(path: Path) -> str:
    h = hashlib.blake2b(digest_size=12)
    size = path.stat().st_size
    h.update(str(size).encode())
    with path.open("rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return h.hexdigest()


class Engine:
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

    def _decode(self, seq: int, *, tokens: np.ndarray | None, embd: np.ndarray | None,
                pos: np.ndarray, want_logits: bool) -> None:
        """One llama_decode of ``m`` rows of one sequence; positions already laid out."""
        m = len(tokens) if tokens is not None else len(embd)  # type: ignore[arg-type]
        seq_ids = np.full(m, seq, dtype=np.int32)
        seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * m)(
            *[ctypes.cast(seq_ids.ctypes.data + 4 * i, ctypes.POINTER(ctypes.c_int32))
              for i in range(m)])
        n_seq_id = np.ones(m, dtype=np.int32)
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
            raise DecodeError(f"llama_decode returned {rc} on sequence {seq} ({m} rows)", rc)

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

    # ------------------------------------------------------------------ checkpoints

    @_locked
    def checkpoint(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> Checkpoint:
        """Snapshot ``seq``.  PARTIAL_ONLY (recurrent state only) exists on recurrent models."""
        hist = self._check_seq(seq)
        if kind is CheckpointKind.PARTIAL_ONLY and not self.kind.has_recurrent_state:
            raise UnsafeEditError("an attention-only model has no recurrent state to checkpoint; "
                                  "take a FULL checkpoint or truncate directly")
        flags = _PARTIAL if kind is CheckpointKind.PARTIAL_ONLY else 0
        size = llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq, flags)
        buf = ctypes.create_string_buffer(max(1, size))
        n = llama_cpp.llama_state_seq_get_data_ext(
            self._ctx, ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)), size, seq, flags)
        if n == 0 and size > 0:
            raise EngineError(f"llama.cpp returned no state for sequence {seq}")
        ckpt = Checkpoint(data=buf.raw[:n], kind=kind, pos=self._next_pos(seq),
                          n_tokens=sum(r.n_tokens for r in hist), history=tuple(hist),
                          model_id=self.model_id)
        self._live_ckpt[0] += 1
        self._live_ckpt[1] += n
        weakref.finalize(ckpt, self._forget_checkpoint, n)
        return ckpt

    def _forget_checkpoint(self, nbytes: int) -> None:
        self._live_ckpt[0] -= 1
        self._live_ckpt[1] -= nbytes

    def _set_state(self, seq: int, ckpt: Checkpoint, flags: int) -> None:
        data = ckpt.data
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        nread = llama_cpp.llama_state_seq_set_data_ext(self._ctx, buf, len(data), seq, flags)
        if nread == 0:
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._hist[seq] = []
            raise RestoreError(f"llama.cpp refused the checkpoint for sequence {seq}; "
                               "the sequence was cleared")

    @_locked
    def restore(self, seq: int, ckpt: Checkpoint) -> None:
        """Replace ``seq``'s state with a FULL checkpoint (taken on any sequence)."""
        self._check_seq(seq)
        if ckpt.model_id != self.model_id:
            raise RestoreError("checkpoint was taken on another model")
        if ckpt.kind is not CheckpointKind.FULL:
            raise RestoreError("a PARTIAL_ONLY checkpoint holds no attention KV; "
                               "use truncate(seq, pos, via=checkpoint)")
        llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
        self._hist[seq] = []
        self._set_state(seq, ckpt, 0)
        self._hist[seq] = list(ckpt.history)

    @_locked
    def truncate(self, seq: int, pos: int, *, via: Checkpoint | None = None) -> None:
        """Cut ``seq`` back so that ``pos`` is its next position.

        Attention-only models: a plain tail trim (``via`` is not needed).  Recurrent / hybrid
        models: only through a PARTIAL_ONLY checkpoint taken at ``pos`` on this same history
        (restore its recurrent state, then trim the attention KV); anything else raises
        ``UnsafeEditError`` and leaves the sequence untouched.
        """
        hist = self._check_seq(seq)
        end = self._next_pos(seq)
        if not 0 <= pos <= end:
            raise ValueError(f"truncate position {pos} outside 0..{end}")
        keep = history_prefix_at(hist, pos)
        if via is not None and (via.history != tuple(keep) or via.pos != pos):
            raise UnsafeEditError("checkpoint was taken on another history or position")
        if not self.kind.has_recurrent_state:
            if pos < end and not llama_cpp.llama_memory_seq_rm(self._mem, seq, pos, -1):
                raise EngineError(f"llama.cpp refused to trim sequence {seq} at {pos}")
            self._hist[seq] = keep
            return
        if via is None or via.kind is not CheckpointKind.PARTIAL_ONLY:
            raise UnsafeEditError(
                f"a {self.kind.value} model cannot drop positions from its recurrent state; "
                f"truncate needs a PARTIAL_ONLY checkpoint taken at position {pos}")
        if via.model_id != self.model_id:
            raise RestoreError("checkpoint was taken on another model")
        self._set_state(seq, via, _PARTIAL)
        if pos < end and not llama_cpp.llama_memory_seq_rm(self._mem, seq, pos, -1):
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)
            self._hist[seq] = []
            raise EngineError(f"attention trim of sequence {seq} at {pos} failed; sequence cleared")
        self._hist[seq] = keep

    @_locked
    def remove_range(self, seq: int, p0: int, p1: int) -> None:
        """Remove positions [p0, p1) and shift later ones down (attention-only models).

        On recurrent / hybrid models llama.cpp would return success here while the removed
        tokens stay inside the recurrent state, so this raises ``UnsafeEditError`` instead.
        """
        hist = self._check_seq(seq)
        end = self._next_pos(seq)
        if self.kind.has_recurrent_state:
            raise UnsafeEditError(
                f"cannot remove positions [{p0}, {p1}) from the middle of a {self.kind.value} "
                "model's sequence: the recurrent state keeps what it absorbed (llama.cpp would "
                "report success and silently corrupt it)")
        if not 0 <= p0 < p1 <= end:
            raise ValueError(f"range [{p0}, {p1}) outside 0..{end}")
        if p1 < end and not llama_cpp.llama_memory_can_shift(self._mem):
            raise UnsafeEditError("this model's memory cannot shift positions")
        starts = {r.pos0 for r in hist} | {end}
        if p0 not in starts or p1 not in starts:
            raise UnsafeEditError("remove_range must cut at run boundaries")
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise EngineError("llama.cpp refused the range removal")
        delta = p1 - p0
        if p1 < end:
            llama_cpp.llama_memory_seq_add(self._mem, seq, p1, -1, -delta)
        # The survivors are no longer the history they were: re-chain their digests with an
        # "edited" tag so no checkpoint of the unedited history can match them.
        new: list[Run] = []
        prev = GENESIS
        for r in hist:
            if p0 <= r.pos0 < p1:
                continue
            shifted = r.pos0 - delta if r.pos0 >= p1 else r.pos0
            tag = b"edited" if r.pos0 >= p1 else b""
            prev = chain_digest(prev, r.kind, tag + r.digest)
            new.append(attrs.evolve(r, pos0=shifted, digest=prev))
        self._hist[seq] = new

    # ------------------------------------------------------------------ images

    @_locked
    def encode_image(self, png: bytes | DecodedImage, *,
                     image_id: str | None = None) -> EncodedImage:
        """PNG bytes → embedding rows and decoder positions (cached by pixel identity).

        ``image_id`` (the pixel hash, when the caller already knows it) lets a cache hit skip
        decoding the PNG.
        """
        if self._mtmd is None:
            raise NoVisionError("this engine was loaded without an mmproj")
        if image_id is not None:
            hit = self.image_cache.get(image_id)
            if hit is not None:
                return hit
        img = png if isinstance(png, DecodedImage) else decode_png(png)
        hit = self.image_cache.get(img.image_id)
        if hit is not None:
            return hit
        with MtmdChunks(self._mtmd, img, self._marker) as chunks:
            enc = chunks.encode(img, self.n_embd, self.uses_mrope)
        self.image_cache.put(enc)
        return enc

    @_locked
    def image_tokens(self, png: bytes | DecodedImage) -> tuple[int, int]:
        """(n_tokens, n_pos) an image would cost, without running the vision encoder."""
        if self._mtmd is None:
            raise NoVisionError("this engine was loaded without an mmproj")
        img = png if isinstance(png, DecodedImage) else decode_png(png)
        with MtmdChunks(self._mtmd, img, self._marker) as chunks:
            return chunks.image_counts()

    # ------------------------------------------------------------------ accounting

    def _measure_state_bytes(self) -> tuple[int, int, int]:
        """KV bytes per cell, recurrent bytes per sequence and a sequence state's fixed part
        (its size at zero tokens), as llama.cpp serialises them."""
        seq = 0
        probe = list(range(3, 11))
        sizes = []
        for n in (4, 8):
            self.prefill_tokens(seq, probe[:n], logits=False)
            sizes.append(llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq, 0))
            self.clear(seq)
        per_token = (sizes[1] - sizes[0]) // 4
        recurrent = 0
        if self.kind.has_recurrent_state:
            self.prefill_tokens(seq, probe[:4], logits=False)
            recurrent = llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq, _PARTIAL)
            self.clear(seq)
        return per_token, recurrent, sizes[0] - 4 * per_token

    @_locked
    def state_bytes(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> int:
        """What llama.cpp says a checkpoint of ``seq`` would take right now."""
        self._check_seq(seq)
        flags = _PARTIAL if kind is CheckpointKind.PARTIAL_ONLY else 0
        return int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, seq, flags))

    @_locked
    def memory(self) -> MemoryReport:
        return MemoryReport(
            kv_bytes_per_token=self.kv_bytes_per_token,
            recurrent_bytes_per_seq=self.recurrent_bytes_per_seq,
            seq_state_bytes={s: int(llama_cpp.llama_state_seq_get_size_ext(self._ctx, s, 0))
                             for s, h in self._hist.items() if h},
            live_checkpoints=self._live_ckpt[0], live_checkpoint_bytes=self._live_ckpt[1],
            image_cache_bytes=self.image_cache.nbytes)
