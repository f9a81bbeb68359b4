"""The encoder checks: is the vision encoder a pure function of the pixels?

An image is encoded once and its embedding cached by pixel identity.  When the cache evicts
it, the next step that needs the image encodes it again, and that embedding is prefilled
next to state made from the first one (a checkpoint, a prefetch, another arm of the bench).
Exactness therefore needs the encoder to give the same bits every time — whatever its
kernels (flash attention is on in the encoder, ``EngineConfig.encoder_flash_attn``), threads
or scheduling.  Two checks:

* ``encoder_run_to_run``: each image encoded several times past the cache; embeddings,
  decoder positions and marker tokens bitwise equal;
* ``encoder_after_eviction``: an image encoded through the cache, evicted by the cache's own
  LRU (a second image pushes it out), encoded again through the cache; the embeddings, and
  the logits of the same prompt prefilled with each, bitwise equal.

``encode`` is how the checks reach the encoder (``Encode``: png, use_cache → EncodedImage;
by default ``Engine.encode_image``): a test hands in one that perturbs a result to show the
checks fail when the bits move.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.images import EncodedImage
from cachepolicy.oracle.sweeps import SweepResult

#: (png, use_cache) → the encoded image
Encode = Callable[[bytes, bool], EncodedImage]

#: encodes per image in ``encoder_run_to_run``
RUNS = 3


def engine_encode(engine: Engine) -> Encode:
    """The shipping path: ``Engine.encode_image``."""
    return lambda png, use_cache: engine.encode_image(png, use_cache=use_cache)


def image_prompt(engine: Engine, head: Sequence[int],
                 tail: Sequence[int]) -> Callable[[int, EncodedImage], np.ndarray]:
    """``prompt(seq, image)``: prefill ``head``, the image and ``tail`` into ``seq`` and
    return the last row's logits (what the image did to the model, for comparing)."""
    def prompt(seq: int, img: EncodedImage) -> np.ndarray:
        engine.prefill_tokens(seq, head, logits=False)
        engine.prefill_image(seq, img)
        logits = engine.prefill_tokens(seq, tail)
        assert logits is not None
        return logits

    return prompt


def _differences(ref: EncodedImage, got: EncodedImage) -> tuple[float, list[str]]:
    """max |diff| of the embeddings and the names of every field that is not bitwise equal."""
    bad = [name for name, a, b in (
        ("embeddings", ref.embeddings, got.embeddings),
        ("positions", ref.positions0, got.positions0),
        ("pos_step", ref.pos_step, got.pos_step)) if a.shape != b.shape or not np.array_equal(a, b)]
    bad += [name for name, a, b in (
        ("markers", (ref.prefix_tokens, ref.suffix_tokens), (got.prefix_tokens, got.suffix_tokens)),
        ("n_pos", ref.n_pos, got.n_pos)) if a != b]
    if ref.embeddings.shape != got.embeddings.shape:
        return float("inf"), bad
    diff = float(np.max(np.abs(ref.embeddings.astype(np.float64)
                               - got.embeddings.astype(np.float64))))
    return diff, bad


def encoder_run_to_run(engine: Engine, pngs: Sequence[bytes], *,
                       encode: Encode | None = None) -> SweepResult:
    """Each image encoded ``RUNS`` times past the cache: every run bitwise the first."""
    encode = encode or engine_encode(engine)
    worst, first_bad = 0.0, ""
    for i, png in enumerate(pngs):
        ref = encode(png, False)
        for run in range(1, RUNS):
            diff, bad = _differences(ref, encode(png, False))
            worst = max(worst, diff)
            if bad and not first_bad:
                first_bad = f"image {i}, run {run}: {', '.join(bad)} differ"
    detail = first_bad or f"{len(pngs)} images x {RUNS} runs"
    return SweepResult(not first_bad, worst, detail)


def encoder_after_eviction(engine: Engine, png: bytes, other: bytes,
                           prompt: Callable[[int, EncodedImage], np.ndarray], *,
                           encode: Encode | None = None) -> SweepResult:
    """``png`` through the cache, pushed out by ``other`` (the cache holding one image for
    the while), then through the cache again: the two embeddings, and ``prompt(seq, image)``'s
    logits with each (on a cleared sequence 0), bitwise equal."""
    encode = encode or engine_encode(engine)
    capacity = engine.image_cache_stats().max_bytes
    try:
        engine.clear_image_cache()
        first = encode(png, True)
        engine.set_image_cache_bytes(first.nbytes)  # room for one image: the next evicts it
        before = engine.image_cache_stats()
        encode(other, True)
        after = engine.image_cache_stats()
        # the cache held ``png``'s embedding alone: an eviction is its eviction
        evicted = before.entries == 1 and after.evictions > before.evictions
        engine.set_image_cache_bytes(capacity)
        again = encode(png, True)
    finally:
        engine.set_image_cache_bytes(capacity)
        engine.clear_image_cache()
    if not evicted:
        return SweepResult(False, float("inf"), "the cache did not evict the image")
    diff, bad = _differences(first, again)
    engine.clear(0)
    ref = prompt(0, first)
    engine.clear(0)
    got = prompt(0, again)
    engine.clear(0)
    logits_diff = float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))
    if not np.array_equal(ref, got):
        bad.append("logits")
    detail = (f"{', '.join(bad)} differ" if bad else
              f"{first.n_tokens} image tokens re-encoded after an LRU eviction")
    return SweepResult(not bad, max(diff, logits_diff), detail)
