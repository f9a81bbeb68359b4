"""mtmd (the multimodal part of llama.cpp): one image → embedding rows + decoder positions.

``Vision`` is the part of the ``Engine`` that owns the mtmd context (when an mmproj is loaded)
and fills the engine's embedding cache.  The mtmd context is its own ggml graph with its own
weights and buffers; of the LLM it reads only the vocabulary (to tokenize the image markers),
which never changes once loaded.  So it may have its own lock, not the engine's: an image is
then encoded while the llama context prefills or decodes (a new screenshot while a prefetch
finishes, ``EpisodeDriver.act``; another episode's screenshot).  It does when the cores hold
both OpenMP teams (``EngineConfig.encoder_beside``, ``encoder_runs_beside``); otherwise it
shares the engine's lock, as both would only slow each other down.

Flash attention in the encoder (``EngineConfig.encoder_flash_attn``, on by default): the
LLM keeps it off because a prefill split into calls must equal one call bitwise; an image is
always encoded in ONE call, so that rule has nothing to protect here.  What the encoder must
be is deterministic — the same pixels give the same bits run after run, whether the
embedding came from the cache or was encoded again after an eviction — and ``kvagent
check-exact``'s ``encoder_*`` checks verify exactly that (``cachepolicy.oracle.encoder``).
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp

from cachepolicy.engine.compute_thread import ComputeThread
from cachepolicy.engine.native import Native
from cachepolicy.engine.errors import EngineError, ImageError, ModelLoadError, NoVisionError
from cachepolicy.engine.gguf_meta import GgufUnreadable, metadata
from cachepolicy.engine.images import DecodedImage, EmbeddingCache, EncodedImage, decode_png


#: Projectors that place image tokens with multi-section RoPE (Qwen2/2.5/3-VL mergers,
#: GLM-4V) need a text model that uses it, and projectors known to place them on a line
#: (LLaVA-style and others) need one that does not.  mtmd checks only that the widths
#: match, so a same-width projector of the other kind loads and then feeds image rows at
#: positions the text model does not expect.  Types in neither list are left to mtmd.
MROPE_PROJECTORS = ("qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger", "glm4v")
LINEAR_PROJECTORS = ("mlp", "mlp_norm", "ldp", "ldpv2", "resampler", "gemma3", "idefics3",
                     "pixtral", "internvl", "llama4")
_MROPE_TYPES = (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE)


#: A projector that writes each cell's place into its embedding (kvagent's cell projector,
#: ``runtime/train/cell_vision.py``) declares it with this key; such a projector is valid at
#: plain sequential positions too, so it may pair with a text model without M-RoPE.
POSITION_FEATURES_KEY = "kvagent.vision.position_features"


def projector_type(path: Path) -> str | None:
    """``clip.projector_type`` from an mmproj's GGUF metadata (None if absent / unreadable:
    mtmd then decides)."""
    return _metadata(path).get("clip.projector_type")


def declares_position_features(path: Path) -> bool:
    """Whether the projector declares ``POSITION_FEATURES_KEY`` (see there)."""
    return _metadata(path).get(POSITION_FEATURES_KEY) == "True"


def _metadata(path: Path) -> dict[str, str]:
    """The two keys the pairing check reads, as strings (empty if not readable as GGUF)."""
    try:
        fields = metadata(path)
    except GgufUnreadable:  # mtmd reports an unreadable file properly when it loads it
        return {}
    keys = ("clip.projector_type", POSITION_FEATURES_KEY)
    return {k: str(fields[k]) for k in keys if k in fields}


def check_pairing(path: Path, projector: str | None, rope_type: int, *,
                  position_features: bool = False) -> None:
    """Refuse a projector of another model family (see ``MROPE_PROJECTORS``); an M-RoPE
    projector that declares ``position_features`` may feed a text model without M-RoPE."""
    model_mrope = rope_type in _MROPE_TYPES
    if (projector in MROPE_PROJECTORS and not model_mrope and not position_features
            or projector in LINEAR_PROJECTORS and model_mrope):
        raise ModelLoadError(
            f"mmproj {path} (projector type {projector!r}) is for another model family: it "
            f"{'places' if projector in MROPE_PROJECTORS else 'does not place'} image tokens "
            f"with multi-section RoPE, the text model "
            f"{'does' if model_mrope else 'does not'}; use the mmproj released with this "
            f"model")


class Vision:
    def __init__(self, native: Native, cache: EmbeddingCache, *, n_embd: int,
                 beside: bool) -> None:
        self._native, self.cache, self.n_embd = native, cache, n_embd
        self.runs_beside = beside
        # guards the mtmd context (one encode at a time).  Its own lock is never held while
        # taking the engine's, so the order engine lock → vision lock cannot deadlock
        self._lock = threading.Lock() if beside else native.lock
        # beside: its own OpenMP pool (the cores hold both); else the engine's thread
        self._compute = ComputeThread("kvagent-encoder") if beside else native.compute
        self._closed = False
        self._mtmd: Any = None
        self._marker = b""
        self.uses_mrope = False

    @property
    def loaded(self) -> bool:
        return self._mtmd is not None

    def load(self, path: Path, *, n_threads: int, flash_attn: bool,
             use_gpu: bool = False) -> None:
        """Load the projector for this engine's model (ModelLoadError if mtmd refuses, or if
        the projector belongs to another model family: ``check_pairing``).

        ``flash_attn`` picks the encoder's attention kernel (see the module docstring); the
        warmup lets mtmd size its compute buffers at load time instead of on the first
        screenshot's critical path.  ``use_gpu``: the encoder on the GPU device too (the
        engine asks it when the model's layers went to one; a CPU build ignores it).
        """
        check_pairing(path, projector_type(path),
                      llama_cpp.llama_model_rope_type(self._native.model),
                      position_features=declares_position_features(path))
        params = mtmd_cpp.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.print_timings = False
        params.n_threads = n_threads
        params.warmup = True
        params.flash_attn_type = _FLASH_ATTN_ENABLED if flash_attn else _FLASH_ATTN_DISABLED
        self._mtmd = self._compute.run(mtmd_cpp.mtmd_init_from_file, str(path).encode(),
                                       self._native.model, params)  # warms up: computes
        if not self._mtmd:
            raise ModelLoadError(f"mtmd could not load mmproj {path}")
        self.uses_mrope = bool(mtmd_cpp.mtmd_decode_use_mrope(self._mtmd))
        self._marker = mtmd_cpp.mtmd_default_marker()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._mtmd:
                mtmd_cpp.mtmd_free(self._mtmd)
                self._mtmd = None
            if self._compute is not self._native.compute:
                self._compute.close()

    def _check(self) -> None:
        if self._closed or self._native.closed:
            raise EngineError("engine is closed")
        if self._mtmd is None:
            raise NoVisionError("this engine was loaded without an mmproj")

    def encode_image(self, png: bytes | DecodedImage, *, image_id: str | None = None,
                     use_cache: bool = True) -> EncodedImage:
        """PNG bytes → embedding rows and decoder positions (cached by pixel identity).

        ``image_id`` (the pixel hash, when the caller already knows it) lets a cache hit skip
        decoding the PNG.  ``use_cache=False`` runs the encoder whatever the cache holds and
        leaves the cache as it was (the encoder checks and ``kvagent bench-encode``).  Takes
        the vision lock (see the module docstring).
        """
        self._check()
        if use_cache and image_id is not None:
            hit = self.cache.get(image_id)
            if hit is not None:
                return hit
        img = png if isinstance(png, DecodedImage) else decode_png(png)
        with self._lock:
            self._check()
            if use_cache:
                hit = self.cache.get(img.image_id)  # another thread may have just encoded it
                if hit is not None:
                    return hit
            with MtmdChunks(self._mtmd, img, self._marker) as chunks:
                enc = chunks.encode(img, self.n_embd, self.uses_mrope, self._compute)
            if use_cache:
                self.cache.put(enc)
        return enc

    def image_tokens(self, png: bytes | DecodedImage) -> tuple[int, int]:
        """(n_tokens, n_pos) an image would cost, without running the vision encoder."""
        self._check()
        img = png if isinstance(png, DecodedImage) else decode_png(png)
        with self._lock:
            self._check()
            with MtmdChunks(self._mtmd, img, self._marker) as chunks:
                return chunks.image_counts()


# mtmd's flash_attn_type values (llama.cpp's enum; -1 "auto" would probe at warmup instead)
_FLASH_ATTN_DISABLED, _FLASH_ATTN_ENABLED = 0, 1

_SECTION_ORDER = ("t", "y", "x", "z")  # llama.cpp's M-RoPE section order for decoder positions


class MtmdChunks:
    """mtmd's tokenization of one image (marker text + bitmap); frees its native objects."""

    def __init__(self, mctx: Any, img: DecodedImage, marker: bytes) -> None:
        self._mctx = mctx
        pixels = (ctypes.c_uint8 * len(img.rgb)).from_buffer_copy(img.rgb)
        self._bitmap = mtmd_cpp.mtmd_bitmap_init(img.width, img.height, pixels)
        self._chunks = mtmd_cpp.mtmd_input_chunks_init()
        if not self._bitmap or not self._chunks:
            self.close()
            raise ImageError("mtmd could not allocate the image")
        text = mtmd_cpp.mtmd_input_text(text=marker, text_len=len(marker), add_special=False,
                                        parse_special=True)
        bitmaps = (mtmd_cpp.mtmd_bitmap_p_ctypes * 1)(self._bitmap)
        rc = mtmd_cpp.mtmd_tokenize(mctx, self._chunks, ctypes.byref(text), bitmaps, 1)
        if rc != 0:
            self.close()
            raise ImageError(f"mtmd could not tokenize the image (code {rc})")
        self.prefix: list[int] = []
        self.suffix: list[int] = []
        self.image_chunk: Any = None
        for i in range(mtmd_cpp.mtmd_input_chunks_size(self._chunks)):
            chunk = mtmd_cpp.mtmd_input_chunks_get(self._chunks, i)
            if mtmd_cpp.mtmd_input_chunk_get_type(chunk) == mtmd_cpp.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                self.image_chunk = chunk
                continue
            n = ctypes.c_size_t(0)
            ptr = mtmd_cpp.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
            (self.suffix if self.image_chunk is not None else self.prefix).extend(ptr[: n.value])
        if self.image_chunk is None:
            self.close()
            raise ImageError("mtmd produced no image chunk")

    def __enter__(self) -> MtmdChunks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_chunks", None):
            mtmd_cpp.mtmd_input_chunks_free(self._chunks)
            self._chunks = None
        if getattr(self, "_bitmap", None):
            mtmd_cpp.mtmd_bitmap_free(self._bitmap)
            self._bitmap = None

    def image_counts(self) -> tuple[int, int]:
        return (int(mtmd_cpp.mtmd_input_chunk_get_n_tokens(self.image_chunk)),
                int(mtmd_cpp.mtmd_input_chunk_get_n_pos(self.image_chunk)))

    def _decoder_positions(self, pos0: int, n: int) -> np.ndarray:
        tokens = mtmd_cpp.mtmd_input_chunk_get_tokens_image(self.image_chunk)
        out = (mtmd_cpp.mtmd_decoder_pos * n)()
        mtmd_cpp.mtmd_helper_image_get_decoder_pos(tokens, pos0, out)
        raw = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_uint32)),
                                    shape=(n, 4)).astype(np.int64)
        fields = [name for name, _ in mtmd_cpp.mtmd_decoder_pos._fields_]
        return np.stack([raw[:, fields.index(s)] for s in _SECTION_ORDER]).astype(np.int32)

    def encode(self, img: DecodedImage, n_embd: int, mrope: bool,
               compute: ComputeThread) -> EncodedImage:
        n, n_pos = self.image_counts()
        if compute.run(mtmd_cpp.mtmd_encode_chunk, self._mctx, self.image_chunk) != 0:
            raise ImageError("the vision encoder failed on this image")
        ptr = mtmd_cpp.mtmd_get_output_embd(self._mctx)
        rows = np.ctypeslib.as_array(ptr, shape=(n * n_embd,)).reshape(n, n_embd).copy()
        if not np.isfinite(rows).all():
            raise ImageError("the vision encoder produced non-finite embeddings")
        if mrope:
            # Store positions for start 0 plus a per-section step, and check that positions
            # really are affine in the start (true for the M-RoPE layouts we support).
            p0, p1, p7 = (self._decoder_positions(s, n) for s in (0, 1, 7))
            step = (p1 - p0)[:, 0]
            if not (np.all(p1 - p0 == step[:, None]) and np.all(p7 == p0 + 7 * step[:, None])):
                raise ImageError("this projector's decoder positions are not affine in the start "
                                 "position; unsupported")
        else:
            p0 = np.arange(n, dtype=np.int32)[None, :]
            step = np.ones(1, dtype=np.int32)
        return EncodedImage(
            image_id=img.image_id, width=img.width, height=img.height, embeddings=rows,
            positions0=p0.astype(np.int32), pos_step=step.astype(np.int32), n_pos=n_pos,
            non_causal=bool(mtmd_cpp.mtmd_decode_use_non_causal(self._mctx, self.image_chunk)),
            prefix_tokens=tuple(int(t) for t in self.prefix),
            suffix_tokens=tuple(int(t) for t in self.suffix))
