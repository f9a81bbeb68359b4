"""The vision encoder: flash attention reaches mtmd, the encoder checks can fail, and an image
encodes while the llama context is busy when the encoder runs beside it (its own lock)."""

from __future__ import annotations

import threading

import attrs
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.records import encoder_runs_beside
from cachepolicy.engine.images import EncodedImage
from cachepolicy.oracle.checks import oracle_screenshot, run_checks
from cachepolicy.oracle.encoder import encoder_after_eviction, encoder_run_to_run, image_prompt

SHOT, OTHER = oracle_screenshot(), oracle_screenshot(variant=1)


def _nudged(img: EncodedImage) -> EncodedImage:
    """The same image with one embedding value moved by one ulp."""
    rows = img.embeddings.copy()
    rows[0, 0] = np.nextafter(rows[0, 0], np.float32(np.inf))
    return attrs.evolve(img, embeddings=rows)


def _perturb_call(engine: Engine, n: int):
    """``Engine.encode_image``, except that call number ``n`` (from 1) comes back nudged."""
    calls = [0]

    def encode(png: bytes, use_cache: bool) -> EncodedImage:
        calls[0] += 1
        img = engine.encode_image(png, use_cache=use_cache)
        return _nudged(img) if calls[0] == n else img

    return encode


def _prompt(engine: Engine):
    return image_prompt(engine, engine.tokenize("Screenshot 0:"),
                        engine.tokenize("\nclick(3, 4)"))


def test_encoder_checks_pass_and_catch_a_one_ulp_perturbation(engines) -> None:
    e = engines("qwen35")
    assert encoder_run_to_run(e, [SHOT, OTHER]).bitwise
    ok = encoder_after_eviction(e, SHOT, OTHER, _prompt(e))
    assert ok.bitwise and ok.max_abs_diff == 0.0, ok.detail

    moved = encoder_run_to_run(e, [SHOT, OTHER], encode=_perturb_call(e, 5))  # image 1, run 1
    assert not moved.bitwise and "image 1, run 1: embeddings" in moved.detail
    assert moved.max_abs_diff > 0
    # the third call is the re-encode after the eviction: a nudged copy there must show
    again = encoder_after_eviction(e, SHOT, OTHER, _prompt(e), encode=_perturb_call(e, 3))
    assert not again.bitwise and again.detail.startswith("embeddings")
    cache = e.image_cache_stats()
    assert cache.max_bytes > 0 and cache.entries == 0  # capacity restored


def test_encoder_flash_attention_reaches_mtmd_and_both_kernels_pass_the_checks(forged) -> None:
    """On and off give other bits (the setting takes effect), each deterministic; with the
    encoder's flash attention on, every LLM-side check still passes."""
    m = forged("qwen35")
    rows = {}
    for fa in (False, True):
        config = EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=32, n_threads=1,
                              encoder_flash_attn=fa)
        with Engine(m.model_path, m.mmproj_path, config) as engine:
            rows[fa] = engine.encode_image(SHOT, use_cache=False).embeddings
            if fa:
                failed = [r.name for r in run_checks(engine) if not r.bitwise]
                assert failed == []
            else:
                assert encoder_run_to_run(engine, [SHOT]).bitwise
    assert rows[False].shape == rows[True].shape
    assert not np.array_equal(rows[False], rows[True])


@pytest.mark.parametrize("beside", [True, False])
def test_the_encoder_runs_beside_the_llama_context_only_when_configured(forged,
                                                                        beside: bool) -> None:
    """With its own lock, holding the engine's lock (as a prefill does) does not block the
    encoder, and the embedding is the one encoded with the engine idle; sharing the engine's
    lock, the encode waits for it."""
    m = forged("qwen35")
    config = EngineConfig(n_ctx_per_seq=1024, n_seq_max=1, n_batch=32, n_threads=1,
                          encoder_beside=beside)
    with Engine(m.model_path, m.mmproj_path, config) as e:
        assert e.encoder_runs_beside is beside
        idle = e.encode_image(SHOT, use_cache=False)
        out: list[EncodedImage] = []
        worker = threading.Thread(
            target=lambda: out.append(e.encode_image(SHOT, use_cache=False)))
        with e._native.lock:
            worker.start()
            worker.join(timeout=60 if beside else 0.5)
            finished_while_held = not worker.is_alive()
        worker.join(timeout=60)
        assert finished_while_held is beside
        assert np.array_equal(out[0].embeddings, idle.embeddings)


def test_the_encoder_runs_beside_when_the_cores_hold_both_teams() -> None:
    auto = EngineConfig(n_threads=2)
    assert encoder_runs_beside(auto, cores=4) and not encoder_runs_beside(auto, cores=3)
    assert encoder_runs_beside(attrs.evolve(auto, encoder_beside=True), cores=1)
    assert not encoder_runs_beside(attrs.evolve(auto, encoder_beside=False), cores=64)


@pytest.mark.parametrize("use_cache", [True, False])
def test_use_cache_false_leaves_the_cache_alone(engines, use_cache: bool) -> None:
    e = engines("qwen35")
    e.clear_image_cache()
    first = e.encode_image(SHOT, use_cache=use_cache)
    assert e.image_cache_stats().entries == (1 if use_cache else 0)
    again = e.encode_image(SHOT, use_cache=use_cache)
    assert (again is first) == use_cache
    e.clear_image_cache()
