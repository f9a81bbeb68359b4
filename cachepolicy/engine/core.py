"""The Engine: one llama.cpp model + context holding ``n_seq_max`` sequences.

The numerical contract it keeps is stated in the package docstring
(``cachepolicy.engine``) and checked by ``kvagent check-exact``.

The engine owns its parts, each given exactly what it needs: ``Native`` (the llama.cpp handles
and the lock every call takes, loaded by ``loading.load_native``), ``Sequences`` (its record
of what each sequence holds), ``Decoder`` (prefill and decode batches), ``SequenceState``
(checkpoints, edits, sizes) and ``Vision`` (the projector and the embedding cache).  Its
public methods are the API the rest of kvagent uses; they delegate to those parts.  The
decoder, the decode batcher and the embedding cache are private: nothing outside the engine
package reaches them (``tests/test_engine_closed.py``).  The class is synchronous; the
scheduler runs its calls in worker threads (``anyio.to_thread``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import llama_cpp
import numpy as np
import structlog

from cachepolicy.engine import devices, generation
from cachepolicy.engine.checkpoint import Checkpoint, CheckpointKind, ModelKind, Run, RunKind
from cachepolicy.engine.drafts import BREAK, Drafting
from cachepolicy.engine.backend import init_backend
from cachepolicy.engine.batcher import DecodeBatcher, DecodeStats, Lane
from cachepolicy.engine.compute_thread import ComputeThread
from cachepolicy.engine.decoder import Decoder
from cachepolicy.engine.loading import file_identity, load_native
from cachepolicy.engine.native import locked
from cachepolicy.engine.records import (
    EngineConfig, MemoryReport, SeqInfo, encoder_runs_beside,
)
from cachepolicy.engine.kv_access import KvAccess
from cachepolicy.engine.kv_blob import KvRows
from cachepolicy.engine.kv_patch import KvPatch, StoredKv
from cachepolicy.engine.kv_rope import RopeSpec, shift_refusal
from cachepolicy.engine.raw_decode import RawLanes, raw_lanes
from cachepolicy.engine.replay import RecurrentRebase, ReplayCut
from cachepolicy.engine.row_classes import (
    MAX_RUN_ROWS, DecodeShape, RowClasses, choose_shape,
)
from cachepolicy.engine import row_probe
from cachepolicy.engine.grammar_isolation import GrammarWorkers
from cachepolicy.engine.grammar_state import LocalGrammar
from cachepolicy.engine.sampler import CharTokens, Sampler
from cachepolicy.engine.sequences import Sequences
from cachepolicy.engine.state import SequenceState
from cachepolicy.engine.vision import Vision
from cachepolicy.engine.fast_kernels import fast_kernels_problem
from cachepolicy.engine.errors import EngineError, FastKernelsUnavailableError, ModelLoadError
from cachepolicy.engine.images import (
    DecodedImage, EmbeddingCache, EmbeddingCacheSnapshot, EncodedImage,
)
from cachepolicy.engine.sampling import SamplingParams

log = structlog.get_logger("kvagent.engine")

#: How much of a sequence's text prompt-lookup drafts search (its most recent tokens).
DRAFT_CONTEXT = 8192


class Engine:
    """One llama.cpp model + context with ``n_seq_max`` independent sequences."""

    def __init__(self, model_path: str | Path, mmproj_path: str | Path | None = None,
                 config: EngineConfig | None = None, *,
                 row_classes: RowClasses | None = None) -> None:
        """``row_classes`` replaces the measured ones (the oracle's tests inject wrong
        classes to show that its checks catch them)."""
        self.config = config = config or EngineConfig()
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelLoadError(f"model file not found: {model_path}")
        if mmproj_path is not None and not Path(mmproj_path).is_file():
            raise ModelLoadError(f"mmproj file not found: {mmproj_path}")
        if config.fast_kernels and (why := fast_kernels_problem(model_path.resolve())):
            raise FastKernelsUnavailableError(f"fast_kernels: {why}; load with the exact "
                                              "kernels (the default) instead")
        init_backend(config.verbose)
        self.model_path = model_path
        self.model_id = file_identity(model_path)
        # the model loads on the thread that will compute with it (a load may compute)
        compute = ComputeThread("kvagent-engine")
        try:
            self._native, self.config = compute.run(load_native, model_path, config, compute)
        except BaseException:
            compute.close()
            raise
        native, config = self._native, self.config
        if llama_cpp.llama_model_is_hybrid(native.model):
            self.kind = ModelKind.HYBRID
        elif llama_cpp.llama_model_is_recurrent(native.model):
            self.kind = ModelKind.RECURRENT
        else:
            self.kind = ModelKind.ATTENTION
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(native.vocab)
        self.n_embd = llama_cpp.llama_model_n_embd_inp(native.model)
        self.n_params = int(llama_cpp.llama_model_n_params(native.model))
        #: where the layers went: "CPU", or a GPU's share (says so when none went: devices)
        self.offload = devices.offload_for(model_path, config,
                                           llama_cpp.llama_model_n_layer(native.model))
        self._chars: CharTokens | None = None
        # clients' grammars are matched in child processes (started at the first one)
        self._grammars = GrammarWorkers(model_path)
        self._seqs = Sequences(config.n_seq_max)
        self._decoder = Decoder(native, self._seqs, kind=self.kind, n_batch=config.n_batch,
                               n_ctx_per_seq=config.n_ctx_per_seq, n_vocab=self.n_vocab,
                               n_embd=self.n_embd)
        self.states = SequenceState(native, self._seqs, model_id=self.model_id,
                                    kind=self.kind)
        self.kv = KvAccess(native, self._seqs, kind=self.kind,
                           n_ctx_per_seq=config.n_ctx_per_seq, model_path=model_path)
        # before anything is fed: it takes the zero recurrent state from an empty sequence
        self.rebase = RecurrentRebase(native, self._seqs, model_id=self.model_id,
                                      kind=self.kind)
        self._lane_ids = tuple(range(config.n_seq_max, config.n_seq_total))
        self._image_cache = EmbeddingCache(config.image_cache_bytes)
        self.vision = Vision(native, self._image_cache, n_embd=self.n_embd,
                             beside=encoder_runs_beside(config))
        self.mmproj_path = Path(mmproj_path) if mmproj_path is not None else None
        try:
            if self.mmproj_path is not None:
                self.vision.load(self.mmproj_path, n_threads=config.n_threads,
                                 flash_attn=config.encoder_flash_attn,
                                 use_gpu=self.offload.layers > 0)
            (self.kv_bytes_per_token, self.recurrent_bytes_per_seq,
             self.state_overhead_bytes) = self._measure_state_bytes()
            self.row_classes = row_classes or self._row_classes()
            self._batcher = DecodeBatcher(
                lanes=self._lane_ids, n_ctx=config.n_ctx_per_seq,
                shape=self.shape_for(config.decode_runs), decoder=self._decoder,
                recurrent=self.kind.has_recurrent_state)
            log.info("engine_decode_shape", model_id=self.model_id,
                     classes=self.row_classes.describe(),
                     shape=self._batcher.shape.describe(), reason=self._batcher.shape.why)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        native = self._native
        self._grammars.close()
        with native.lock:
            self.vision.close()
            if not native.closed:
                llama_cpp.llama_free(native.ctx)
                llama_cpp.llama_model_free(native.model)
                native.closed = True
                native.compute.close()
            self._image_cache.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def has_vision(self) -> bool:
        return self.vision.loaded

    @property
    def encoder_runs_beside(self) -> bool:
        """The vision encoder has its own lock: it runs while the llama context computes."""
        return self.vision.runs_beside

    @property
    def uses_mrope(self) -> bool:
        return self.vision.uses_mrope

    @property
    def shift_problem(self) -> str | None:
        """Why llama.cpp cannot shift this model's cached positions (``seq_add``, what
        ``remove_range`` does after a cut: relocate's edit), or None."""
        if llama_cpp.llama_memory_can_shift(self._native.mem):
            return None
        return (shift_refusal(self.rope.rope_type)
                or "llama.cpp cannot shift this model's cached positions")

    # ------------------------------------------------------------------ text

    # tokenize / detokenize read only the vocabulary, immutable once loaded: no lock, so a
    # stream's text deltas never wait behind another episode's prefill
    def tokenize(self, text: str, *, add_bos: bool = False,
                 special: bool = True) -> tuple[int, ...]:
        self._check_open()
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self._native.vocab, raw, len(raw), buf, cap, add_bos,
                                     special)
        if n < 0:
            raise EngineError(f"tokenize needed {-n} tokens, more than the {cap} allotted")
        return tuple(buf[:n])

    def detokenize(self, tokens: Sequence[int], *, special: bool = True) -> str:
        self._check_open()
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        cap = 16 * len(tokens) + 16
        out = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(self._native.vocab, arr, len(tokens), out, cap, False,
                                       not special)
        if n < 0:
            raise EngineError("detokenize buffer too small")
        return out.raw[:n].decode("utf-8", errors="replace")

    def _check_open(self) -> None:
        if self._native.closed:
            raise EngineError("engine is closed")

    @property
    def chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._native.model, None)
        return raw.decode("utf-8") if raw else None

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._native.vocab, token))

    # ------------------------------------------------------------------ sequences

    @locked
    def seq_info(self, seq: int) -> SeqInfo:
        return self._seqs.info(seq)

    @locked
    def clear(self, seq: int) -> None:
        self._seqs.runs(seq)
        llama_cpp.llama_memory_seq_rm(self._native.mem, seq, -1, -1)
        self._seqs.replace(seq, [])

    # prefill / decode: the Decoder
    def prefill_tokens(self, seq: int, tokens: Sequence[int], *, logits: bool = True,
                       allow_single: bool = False, all_logits: bool = False,
                       at: int | None = None) -> np.ndarray | None:
        return self._decoder.prefill_tokens(seq, tokens, logits=logits,
                                           allow_single=allow_single, all_logits=all_logits,
                                           at=at)

    def prefill_image(self, seq: int, image: EncodedImage, *, logits: bool = False,
                      all_logits: bool = False) -> np.ndarray | None:
        return self._decoder.prefill_image(seq, image, logits=logits, all_logits=all_logits)


    # checkpoints, edits and sizes: the SequenceState
    def checkpoint(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> Checkpoint:
        return self.states.checkpoint(seq, kind)

    def restore(self, seq: int, ckpt: Checkpoint) -> None:
        self.states.restore(seq, ckpt)

    def truncate(self, seq: int, pos: int, *, via: Checkpoint | None = None) -> None:
        self.states.truncate(seq, pos, via=via)

    def remove_range(self, seq: int, p0: int, p1: int) -> None:
        self.states.remove_range(seq, p0, p1)

    # the approximate edit (tail replay): the RecurrentRebase
    def replay_cut(self, seq: int, pos: int, *, base: Checkpoint | None = None) -> ReplayCut:
        """APPROXIMATE unless ``base`` was taken at ``pos``: keep the attention KV of
        ``[0, pos)``, set the recurrent state to ``base`` (None: zero); see
        ``cachepolicy.engine.replay``."""
        return self.rebase.replay_cut(seq, pos, base=base)

    def state_bytes(self, seq: int, kind: CheckpointKind = CheckpointKind.FULL) -> int:
        return self.states.state_bytes(seq, kind)

    # KV rows (attention-only models): the KvAccess part
    @property
    def rope(self) -> RopeSpec:
        return self.kv.rope

    @property
    def kv_edit_problem(self) -> str | None:
        """Why this model's cached KV cannot be re-rotated and patched (None: it can)."""
        return self.kv.problem(self.vision.uses_mrope)

    @property
    def window_problem(self) -> str | None:
        """Why window-replay cannot keep this model's screenshots' attention KV (None: it can)."""
        return self.kv.window_problem()

    def kv_read(self, seq: int) -> KvRows:
        return self.kv.read(seq)

    def kv_write(self, seq: int, rows: KvRows, history: Sequence[Run]) -> None:
        self.kv.write(seq, rows, history)

    def kv_read_attention(self, seq: int) -> KvRows:
        """``kv_read`` of the attention part (a hybrid's too: window-replay)."""
        return self.kv.read_attention(seq)

    def kv_write_attention(self, seq: int, rows: KvRows, history: Sequence[Run]) -> None:
        """``kv_write`` of the attention part; a hybrid keeps its current recurrent state."""
        self.kv.write_attention(seq, rows, history)

    def kv_keep(self, rows: KvRows, patch: KvPatch | None = None) -> StoredKv:
        return self.kv.keep(rows, patch)

    def held_bytes(self, seq: int) -> int:
        return self.states.held_bytes(seq)

    # images: the Vision part
    def encode_image(self, png: bytes | DecodedImage, *, image_id: str | None = None,
                     use_cache: bool = True) -> EncodedImage:
        return self.vision.encode_image(png, image_id=image_id, use_cache=use_cache)

    def image_tokens(self, png: bytes | DecodedImage) -> tuple[int, int]:
        return self.vision.image_tokens(png)

    # the embedding cache (thread-safe: its own lock, not the engine's)
    def image_cache_stats(self) -> EmbeddingCacheSnapshot:
        """The embedding cache's entries, bytes, capacity, hits, misses and evictions, read
        together under its lock (reads only)."""
        return self._image_cache.snapshot()

    def clear_image_cache(self) -> None:
        """Drop every cached embedding (mutates; the capacity and the counters stay)."""
        self._image_cache.clear()

    def set_image_cache_bytes(self, max_bytes: int) -> int:
        """Set the cache's capacity (mutates), evicting least recently used embeddings until
        the rest fit; returns the bytes freed."""
        return self._image_cache.resize(max_bytes)

    def shrink_image_cache(self, by: int, *, floor: int = 0) -> int:
        """Lower the cache's capacity by ``by`` bytes, not below ``floor`` (mutates; one
        atomic step, see ``EmbeddingCache.shrink``); returns the capacity given up."""
        return self._image_cache.shrink(by, floor=floor)

    @locked
    def memory(self) -> MemoryReport:
        """Bytes the engine holds, as llama.cpp reports them."""
        count, nbytes = self.states.live_checkpoints
        stored, stored_bytes = self.kv.live_stored
        return MemoryReport(
            kv_bytes_per_token=self.kv_bytes_per_token,
            recurrent_bytes_per_seq=self.recurrent_bytes_per_seq,
            seq_state_bytes={s: self.states.held_bytes(s) for s in self._seqs.non_empty()},
            live_checkpoints=count, live_checkpoint_bytes=nbytes,
            image_cache_bytes=self._image_cache.nbytes,
            live_stored_kv=stored, live_stored_kv_bytes=stored_bytes,
            lanes_in_use=tuple(lane for lane in self._lane_ids
                               if self._decoder.occupied(lane)),
            device_bytes=self.offload.device_bytes)

    def _measure_state_bytes(self) -> tuple[int, int, int]:
        """KV bytes per cell, recurrent bytes per sequence and a sequence state's fixed part
        (its size at zero tokens), as llama.cpp serialises them."""
        seq = 0
        probe = list(range(3, 11))
        sizes = []
        for n in (4, 8):
            self.prefill_tokens(seq, probe[:n], logits=False)
            sizes.append(self.state_bytes(seq))
            self.clear(seq)
        per_token = (sizes[1] - sizes[0]) // 4
        recurrent = 0
        if self.kind.has_recurrent_state:
            self.prefill_tokens(seq, probe[:4], logits=False)
            recurrent = self.state_bytes(seq, CheckpointKind.PARTIAL_ONLY)
            self.clear(seq)
        return per_token, recurrent, sizes[0] - 4 * per_token

    # ------------------------------------------------------------------ decode shape

    def measure_row_classes(self) -> RowClasses:
        """Measure which decode calls compute a row alike on this model and CPU (no cache;
        every sequence and lane must be empty)."""
        prompt, feeds = row_probe.probe_tokens(self.tokenize)
        return row_probe.measure(self._decoder, scratch=0, clear=self.clear,
                                 lanes=self._lane_ids, prompt=prompt, feeds=feeds,
                                 max_run=self._max_run)

    @property
    def _max_run(self) -> int:
        """The longest run a call may carry: a prefill call's rows (the MoE cap) at most."""
        return max(2, min(MAX_RUN_ROWS, self.config.n_batch))

    def _row_classes(self) -> RowClasses:
        key = row_probe.cache_key(self.model_id, fast_kernels=self.config.fast_kernels,
                                  lanes=len(self._lane_ids), max_run=self._max_run,
                                  backend=self.offload.cache_key)
        if self.config.row_class_cache and (cached := row_probe.load(key)) is not None:
            return cached
        classes = self.measure_row_classes()
        if self.config.row_class_cache:
            row_probe.store(key, classes, model=str(self.model_path),
                            backend=self.offload.cache_key)
        return classes

    def shape_for(self, runs: bool | None) -> DecodeShape:
        """The decode shape these row classes give with ``runs`` (see ``EngineConfig``):
        lanes as configured; runs no longer than a prefill call (the MoE cap)."""
        return choose_shape(self.row_classes, len(self._lane_ids), runs=runs,
                            max_run_cap=self._max_run)

    @property
    def decode_shape(self) -> DecodeShape:
        return self._batcher.shape

    def decode_lanes(self) -> tuple[int, ...]:
        """The sequence ids of every decode lane (reads only); the decode shape uses the
        first ``decode_shape.lanes`` of them."""
        return self._batcher.all_lanes

    def set_decode_shape(self, shape: DecodeShape) -> None:
        """Decode in another shape from now on (between generations; benchmarks and the
        oracle compare shapes on one engine)."""
        self._batcher.set_shape(shape)

    # ------------------------------------------------------------------ generation

    def generate(self, seq: int, logits: np.ndarray, max_tokens: int,
                 sampling: SamplingParams | None = None, *, stop_at_eog: bool = True,
                 should_stop: Callable[[], bool] | None = None,
                 stop_when: Callable[[list[int]], bool] | None = None,
                 on_token: Callable[[int], None] | None = None,
                 drafting: Drafting | None = None,
                 trace: Callable[[int, np.ndarray | None], None] | None = None) -> list[int]:
        """Sample up to ``max_tokens`` tokens starting from ``logits`` (the prompt's last).

        The tokens are fed in a decode lane holding a copy of ``seq`` (``DecodeBatcher``:
        bitwise the same tokens alone or beside other generations); ``seq`` itself keeps the
        prompt.  ``drafting`` (default: jump-forward and prompt-lookup drafts, where the
        decode shape allows runs) changes the calls, never the tokens (``generation``).
        Generation stops after an end-of-generation token (unless ``stop_at_eog`` is False:
        benchmarks decode a fixed number of tokens).  ``should_stop`` is polled between
        calls: True raises ``Preempted`` (the caller was cancelled).
        """
        sampler = self.sampler(sampling or SamplingParams())
        drafting = drafting or Drafting()
        context = self._draft_context(seq) if drafting.lookup else ()
        try:  # free text decodes alone in the default runs shape (``generating``)
            with self._batcher.generating(seq, free_text=not sampler.constrained) as lane:
                out, counts = generation.generate(
                    lane, sampler, logits, max_tokens, drafting=drafting, context=context,
                    spelling=self._spelling() if sampler.constrained and lane.runs else None,
                    is_eog=self.is_end_of_generation, stop_at_eog=stop_at_eog,
                    should_stop=should_stop, stop_when=stop_when, on_token=on_token,
                    trace=trace)
            self._batcher.note(counts)
        finally:
            sampler.close()
        return out

    def _spelling(self) -> generation.Spelling:
        """The single-character tokens forced text is asked about (found once)."""
        if self._chars is None:
            self._chars = CharTokens.of(self._native.vocab, self.n_vocab)
        return generation.Spelling(self._chars, self.tokenize)

    @locked
    def _draft_context(self, seq: int) -> list[int]:
        """The sequence's text, images as breaks (the last ``DRAFT_CONTEXT`` tokens)."""
        text: list[int] = []
        for run in self._seqs.runs(seq):
            text += run.tokens if run.kind is RunKind.TEXT else [BREAK]
        return text[-DRAFT_CONTEXT:]

    def decode_stats(self) -> DecodeStats:
        """The decode lanes' counters so far: calls, generated rows, seconds in the calls
        (take two and subtract for one run; reads only)."""
        return self._batcher.stats()

    def generating(self, seq: int, *, free_text: bool = False) -> AbstractContextManager[Lane]:
        """A decode lane holding a copy of ``seq`` for one generation fed by the caller
        (``Lane.decode`` / ``feed`` / ``keep``): waits for a free lane; the lane is cleared on
        exit (mutates the lane only).  ``generate`` is this plus sampling; the oracle feeds
        lanes itself."""
        return self._batcher.generating(seq, free_text=free_text)

    def yield_decode_round(self, timeout: float = 1.0) -> None:
        """Between prefill pieces: while generations decode, wait (at most ``timeout`` s)
        until those decoding now have ended — an answer ends some agent's critical path
        (``DecodeBatcher.yield_round``; mutates nothing)."""
        self._batcher.yield_round(timeout)

    def raw_decode(self, seq: int, lanes: int = 1) -> AbstractContextManager[RawLanes]:
        """Copies of ``seq`` in the first ``lanes`` decode lanes, fed straight to llama.cpp
        (``RawLanes.run_tokens`` / ``run_lanes``: no batcher, no sampling, not counted in
        ``decode_stats``) — the oracle's reference rows and ``bench-decode``'s call costs.
        Holds every lane while open (generations wait); the copies are cleared on exit."""
        return raw_lanes(self._decoder, self._batcher, seq, lanes)

    def sampler(self, params: SamplingParams) -> Sampler:
        """A sampler for ``params``; its grammar is matched here (kvagent's own grammars) or
        in the grammar worker within ``params.grammar_budget`` (a client's)."""
        if params.grammar is None:
            return Sampler(params)
        if params.grammar_budget is None:
            return Sampler(params, LocalGrammar(self._native.vocab, self.n_vocab,
                                                params.grammar, params.grammar_root))
        return Sampler(params, self._grammars.open(params.grammar, params.grammar_root,
                                                   params.grammar_budget))
