"""Screenshots: typed errors for bad PNGs, pixel identity, the embedding cache, token costs."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cachepolicy.errors import ImageError, NoVisionError
from cachepolicy.engine.images import EmbeddingCache, decode_png, resolution_for_tokens
from cachepolicy.oracle.checks import oracle_screenshot


def _png(img: Image.Image, **kw: object) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG", **kw)
    return buf.getvalue()


@pytest.mark.parametrize("bad", [b"", b"not a png at all", oracle_screenshot()[:200],
                                 oracle_screenshot()[:-40]])
def test_corrupt_or_truncated_png_is_a_typed_error(engines, bad: bytes) -> None:
    with pytest.raises(ImageError):
        decode_png(bad)
    e = engines("qwen35")
    with pytest.raises(ImageError):
        e.encode_image(bad)
    # the engine is still fine afterwards
    assert e.encode_image(oracle_screenshot()).n_tokens > 0


def test_identity_is_the_pixels_not_the_bytes() -> None:
    img = Image.open(io.BytesIO(oracle_screenshot()))
    fast, small = _png(img, compress_level=1), _png(img, compress_level=9)
    assert fast != small
    assert decode_png(fast).image_id == decode_png(small).image_id
    other = img.copy()
    other.putpixel((3, 3), (1, 2, 3))
    assert decode_png(_png(other)).image_id != decode_png(fast).image_id


def test_reencoding_a_retained_screenshot_hits_the_cache(engines) -> None:
    e = engines("qwen35")
    shot = oracle_screenshot(192, 128)
    first = e.encode_image(shot)
    hits = e.image_cache_stats().hits
    again = e.encode_image(_png(Image.open(io.BytesIO(shot)), compress_level=1))
    assert again is first
    assert e.image_cache_stats().hits == hits + 1


def test_cache_is_bounded_by_bytes(engines) -> None:
    e = engines("llama")
    items = [e.encode_image(oracle_screenshot(64 + 8 * i, 64)) for i in range(4)]
    cache = EmbeddingCache(max_bytes=2 * items[0].nbytes + 1)
    for item in items:
        cache.put(item)
    assert cache.nbytes <= cache.max_bytes
    assert len(cache) == 2 and cache.evictions == 2
    assert cache.get(items[0].image_id) is None and cache.get(items[3].image_id) is items[3]


@pytest.mark.parametrize("target", [64, 256, 1024, 2400])
def test_resolution_helper_hits_the_token_target(engines, target: int) -> None:
    e = engines("qwen35")
    w, h = resolution_for_tokens(target, patch_size=16, merge=2)
    n_tokens, n_pos = e.image_tokens(_png(Image.new("RGB", (w, h), (90, 90, 90))))
    assert abs(n_tokens - target) <= 0.05 * target
    assert n_pos < n_tokens  # M-RoPE: an image advances the position by less than its count


def test_image_positions_follow_mtmd(engines) -> None:
    e = engines("qwen35")
    img = e.encode_image(oracle_screenshot(128, 64))  # a 4 x 2 token grid
    at = img.positions_at(10)
    assert at.shape == (4, img.n_tokens)
    assert (at[0] == 10).all()  # temporal section: the start position for every token
    assert set(at[1]) == {10, 11} and set(at[2]) == {10, 11, 12, 13}  # rows, columns
    assert img.n_pos == 4


def test_text_only_engine_cannot_encode(engines) -> None:
    with pytest.raises(NoVisionError):
        engines("llama", vision=False).encode_image(oracle_screenshot())


def test_decoded_pixels_are_rgb() -> None:
    rgba = Image.new("RGBA", (4, 3), (10, 20, 30, 40))
    dec = decode_png(_png(rgba))
    assert (dec.width, dec.height) == (4, 3)
    assert np.frombuffer(dec.rgb, dtype=np.uint8).reshape(3, 4, 3)[0, 0].tolist() == [10, 20, 30]
