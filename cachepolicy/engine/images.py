"""Screenshots as data: PNG validation, pixel identity, encoded embeddings and their cache.

An image's identity is a hash of its decoded pixels (not of the PNG bytes: two encoders of the
same screen give different bytes but the same pixels, and the model sees pixels).
"""

from __future__ import annotations

import hashlib
import io
import math
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable

import attrs
import numpy as np
from PIL import Image, UnidentifiedImageError

from cachepolicy.engine.errors import ImageError

MAX_IMAGE_SIDE = 16384  # refuse absurd sizes before they allocate gigabytes
#: What ``decode_png`` reads: formats screen grabbers produce that Pillow decodes itself
#: (never EPS & co., which Pillow hands to an external program).
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")


def _check_size(width: int, height: int) -> None:
    if not (1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE):
        raise ImageError(f"image size {width}x{height} outside 1..{MAX_IMAGE_SIDE}")
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        raise ImageError(f"image of {width}x{height} pixels is over Pillow's "
                         f"decompression-bomb limit of {limit}")


@attrs.frozen
class DecodedImage:
    """An RGB image decoded from PNG bytes, with its pixel identity."""

    rgb: bytes = attrs.field(repr=False)  # width * height * 3 bytes, row-major
    width: int
    height: int
    image_id: str  # blake2b of (width, height, rgb)


def decode_png(data: bytes) -> DecodedImage:
    """Decode and fully verify a PNG (or another screenshot format Pillow decodes itself:
    ``IMAGE_FORMATS``) into RGB pixels.

    Raises ``ImageError`` for empty, corrupt, truncated or absurdly large input (more than
    ``MAX_IMAGE_SIDE`` a side, or over Pillow's decompression-bomb pixel limit: refused from
    the header, before any pixel is allocated) instead of crashing later in the vision
    encoder.
    """
    if not isinstance(data, bytes | bytearray) or not data:
        raise ImageError("empty image data")
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as probe:
            _check_size(*probe.size)
            probe.verify()  # checks chunk CRCs without decoding the pixels
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as img:
            rgb_img = img.convert("RGB")
            rgb_img.load()
    except ImageError:
        raise
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError,
            ValueError, EOFError, struct.error) as exc:
        raise ImageError(f"corrupt or truncated image: {exc}") from exc
    rgb = rgb_img.tobytes()
    return DecodedImage(rgb=rgb, width=rgb_img.width, height=rgb_img.height,
                        image_id=pixel_hash(rgb, rgb_img.width, rgb_img.height))


def pixel_hash(rgb: bytes, width: int, height: int) -> str:
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{width}x{height}:".encode())
    h.update(rgb)
    return h.hexdigest()


@attrs.frozen(eq=False)
class EncodedImage:
    """A screenshot turned into decoder inputs by the vision projector.

    ``positions0`` are the decoder positions for a start position of 0, shape
    ``(n_pos_per_embd, n_tokens)`` (section-major, as llama.cpp wants them);
    the positions at start ``p`` are ``positions0 + p * pos_step[:, None]`` (checked affine
    when encoded).  ``prefix_tokens`` / ``suffix_tokens`` are the marker tokens the projector
    expects around the image (e.g. ``<|vision_start|>`` / ``<|vision_end|>``).
    """

    image_id: str
    width: int
    height: int
    embeddings: np.ndarray = attrs.field(repr=False)  # float32 (n_tokens, n_embd)
    positions0: np.ndarray = attrs.field(repr=False)  # int32 (n_pos_per_embd, n_tokens)
    pos_step: np.ndarray = attrs.field(repr=False)  # int32 (n_pos_per_embd,)
    n_pos: int
    non_causal: bool
    prefix_tokens: tuple[int, ...]
    suffix_tokens: tuple[int, ...]

    @property
    def n_tokens(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.embeddings.nbytes + self.positions0.nbytes)

    def positions_at(self, pos0: int) -> np.ndarray:
        return (self.positions0 + np.int32(pos0) * self.pos_step[:, None]).astype(np.int32)


@attrs.frozen
class EmbeddingCacheSnapshot:
    """The embedding cache at one instant (every field read under its lock;
    ``Engine.image_cache_stats``)."""

    entries: int  # embeddings held
    nbytes: int  # the running byte count
    entry_bytes: int  # the entries' bytes summed afresh: equal to ``nbytes`` unless it drifted
    max_bytes: int  # the capacity
    hits: int = 0  # lookups that found their embedding, since the engine loaded
    misses: int = 0  # lookups that did not
    evictions: int = 0  # entries dropped to stay within the capacity


class EmbeddingCache:
    """Bounded LRU of encoded images keyed by pixel identity; its bytes are counted.

    Thread-safe: the vision encoder fills it from worker threads (under the vision lock, not
    the engine's) while the scheduler may shrink it from another.  Invariant after every
    method: ``nbytes <= max_bytes`` (``put`` evicts, ``resize`` evicts).

    The scheduler holds the capacity in its memory ledger and changes it only through the
    engine's ``set_image_cache_bytes`` and ``shrink_image_cache`` (``resize``, ``shrink``); it
    reads it through ``image_cache_stats`` (``snapshot``).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, EncodedImage] = OrderedDict()
        self._lock = threading.Lock()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, image_id: str) -> EncodedImage | None:
        with self._lock:
            item = self._items.get(image_id)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(image_id)
            self.hits += 1
            return item

    def put(self, item: EncodedImage) -> None:
        with self._lock:
            if item.image_id in self._items or item.nbytes > self.max_bytes:
                return
            self._items[item.image_id] = item
            self.nbytes += item.nbytes
            while self.nbytes > self.max_bytes:
                self._evict_one()

    def evict_lru(self) -> int:
        """Drop the least recently used entry (mutates); returns the bytes freed (0 when
        empty).  The capacity stays."""
        with self._lock:
            return self._evict_one()

    def resize(self, max_bytes: int) -> int:
        """Set the capacity (mutates), evicting least recently used entries until the rest
        fit; returns the bytes freed."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        with self._lock:
            self.max_bytes = max_bytes
            freed = 0
            while self.nbytes > self.max_bytes:
                freed += self._evict_one()
            return freed

    def shrink(self, by: int, *, floor: int = 0) -> int:
        """Lower the capacity by ``by`` bytes, not below ``floor`` (mutates), evicting least
        recently used entries until the rest fit — all under the cache's lock, so an encode
        finishing meanwhile can neither slip in above the new capacity nor be counted as
        freed.  Returns the capacity given up (what the ledger may release)."""
        if by < 0 or floor < 0:
            raise ValueError("by and floor must be >= 0")
        with self._lock:
            old = self.max_bytes
            self.max_bytes = max(min(floor, old), old - by)
            while self.nbytes > self.max_bytes:
                self._evict_one()
            return old - self.max_bytes

    def _evict_one(self) -> int:
        if not self._items:
            return 0
        _, old = self._items.popitem(last=False)
        self.nbytes -= old.nbytes
        self.evictions += 1
        return old.nbytes

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.nbytes = 0

    def snapshot(self) -> EmbeddingCacheSnapshot:
        """Entries, byte count, the entries' bytes summed afresh and capacity, read together:
        an encode finishing in another thread cannot fall between them (reads only)."""
        with self._lock:
            return EmbeddingCacheSnapshot(
                entries=len(self._items), nbytes=self.nbytes,
                entry_bytes=sum(item.nbytes for item in self._items.values()),
                max_bytes=self.max_bytes, hits=self.hits, misses=self.misses,
                evictions=self.evictions)


def grid_for_tokens(target_tokens: int, aspect: float = 16 / 9) -> tuple[int, int]:
    """A (columns, rows) token grid near ``aspect`` whose product is close to the target."""
    if target_tokens < 1:
        raise ValueError("target_tokens must be >= 1")
    rows = max(1, round(math.sqrt(target_tokens / aspect)))
    cols = max(1, round(target_tokens / rows))
    return cols, rows


def resolution_for_tokens(target_tokens: int, *, patch_size: int, merge: int,
                          aspect: float = 16 / 9) -> tuple[int, int]:
    """Pixel size (width, height) of a screenshot that costs about ``target_tokens`` tokens.

    For dynamic-resolution projectors (Qwen-VL family) one token covers a
    ``(patch_size * merge)`` pixel square, so the grid maps straight to pixels.
    """
    cols, rows = grid_for_tokens(target_tokens, aspect)
    cell = patch_size * merge
    return cols * cell, rows * cell


def fit_resolution(count_tokens: Callable[[int, int], int], target_tokens: int, *,
                   aspect: float = 16 / 9, tries: int = 5) -> tuple[int, int, int]:
    """Find a (width, height) whose measured token cost is close to ``target_tokens``.

    ``count_tokens(w, h)`` asks the real projector (no encoding needed).  Starts from the
    Qwen-VL geometry (16 px patches, 2x2 merge) and rescales by the measured ratio, so it also
    works for other patch sizes.  Returns (width, height, tokens); fixed-size projectors
    (LLaVA ``mlp``) return their one cost whatever the size.
    """
    w, h = resolution_for_tokens(target_tokens, patch_size=16, merge=2, aspect=aspect)
    best = (w, h, count_tokens(w, h))
    for _ in range(tries):
        got = best[2]
        if got == target_tokens or got <= 0:
            break
        scale = math.sqrt(target_tokens / got)
        w2, h2 = max(16, round(best[0] * scale)), max(16, round(best[1] * scale))
        if (w2, h2) == best[:2]:
            break
        n2 = count_tokens(w2, h2)
        if n2 == got:  # the cost does not depend on the size: a fixed-size projector
            break
        if abs(n2 - target_tokens) < abs(got - target_tokens):
            best = (w2, h2, n2)
        else:
            break
    return best
