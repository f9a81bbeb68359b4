"""The trainer's JAX model is llama.cpp's model: logits of every row of a text + image prompt,
from kvagent's real Engine and from ``runtime.train.forward``, agree within the stated
tolerance on both architectures; and the check can fail (negative controls)."""

from __future__ import annotations

import io
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from cachepolicy.forge import ForgedModel
from runtime.train import (
    ForwardOptions, ImagePiece, Numerics, TextPiece, build_example, compare, compare_with_engine,
    load_gguf, to_rows,
)
from runtime.train.model import jit_forward
from runtime.train.parity import PARITY_OPTIONS, compare_logits, engine_logits

ARCHES = ("llama", "qwen35")


def png_bytes(width: int, height: int, seed: int = 7) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def prompt(engine: object) -> list[TextPiece | ImagePiece]:
    tok = engine.tokenize  # type: ignore[attr-defined]
    return [TextPiece(tok("<|im_start|>user\nclick the submit button on")),
            ImagePiece(png_bytes(160, 96)),
            TextPiece(tok("then type hello<|im_end|>\n<|im_start|>assistant\n")),
            TextPiece(tok("click(10, 20)<|im_end|>"), train=True)]


@pytest.fixture(scope="module")
def loaded(forged: Callable[..., ForgedModel]) -> Callable[[str], object]:
    cache: dict[str, object] = {}

    def get(arch: str) -> object:
        if arch not in cache:
            cache[arch] = load_gguf(forged(arch).model_path)
        return cache[arch]

    return get


@pytest.mark.parametrize("arch", ARCHES)
def test_jax_forward_matches_llama_cpp_on_text_and_image(arch: str, engines, loaded) -> None:
    engine = engines(arch)
    model = loaded(arch)
    report = compare_with_engine(engine, model.spec, model.params, prompt(engine))
    assert report.passed, report.summary()
    assert report.n_image_rows > 0 and report.n_rows > report.n_image_rows
    assert report.max_abs_diff_image_rows <= report.tolerance
    assert report.near_tie_mismatches_only
    if arch == "qwen35":  # M-RoPE: an image advances the position by less than its rows
        assert report.trainer_next_pos < report.n_rows
    else:
        assert report.trainer_next_pos == report.n_rows


def test_compare_api_loads_its_own_engine(forged: Callable[..., ForgedModel]) -> None:
    m = forged("qwen35")
    from cachepolicy.engine import Engine, EngineConfig

    with Engine(m.model_path, m.mmproj_path, EngineConfig(n_seq_max=1, n_threads=1)) as e:
        pieces = prompt(e)
    report = compare(m.model_path, m.mmproj_path, pieces)
    assert report.passed, report.summary()
    assert report.f16_numerics and report.logit_scale > 0.1


@pytest.mark.parametrize("arch", ARCHES)
def test_one_changed_weight_fails_the_check(arch: str, engines, loaded) -> None:
    engine = engines(arch)
    model = loaded(arch)
    params = dict(model.params)
    w = np.array(params["blk.1.ffn_down.weight"])
    w[0, 0] += 0.5  # one scalar of one matrix
    params["blk.1.ffn_down.weight"] = jnp.asarray(w)
    report = compare_with_engine(engine, model.spec, params, prompt(engine))
    assert not report.passed
    assert report.max_abs_diff > 3 * report.tolerance, report.summary()


def test_dropping_the_delta_net_conv_fails_the_check(engines, loaded) -> None:
    engine = engines("qwen35")
    model = loaded("qwen35")
    params = dict(model.params)
    taps = np.zeros(params["blk.0.ssm_conv1d.weight"].shape, dtype=np.float32)
    taps[:, -1] = 1.0  # the conv becomes the identity: only the current row, no history
    params["blk.0.ssm_conv1d.weight"] = jnp.asarray(taps)
    report = compare_with_engine(engine, model.spec, params, prompt(engine))
    assert not report.passed
    assert report.max_abs_diff > 10 * report.tolerance, report.summary()


def test_sequential_positions_for_image_rows_fail_the_check(engines, loaded) -> None:
    """Feeding the image rows at 1-D positions (as if M-RoPE did not exist) is caught."""
    engine = engines("qwen35")
    model = loaded("qwen35")
    pieces = prompt(engine)
    example = build_example(engine, pieces)
    reference = engine_logits(engine, pieces)
    engine.clear(0)
    rows = to_rows(example)
    n = rows.positions.shape[0]
    wrong = np.stack([np.arange(n)] * 3 + [np.zeros(n, dtype=int)], axis=1).astype(np.int32)
    is_image = example.embed_index >= 0
    for positions, should_pass in ((rows.positions, True), (wrong, False)):
        got = jit_forward(model.params, model.spec,
                      jax.tree.map(jnp.asarray, rows._replace(positions=positions)),
                      PARITY_OPTIONS)
        numbers = compare_logits(reference, np.asarray(got), is_image=is_image)
        assert (numbers["max_abs_diff"] <= numbers["tolerance"]) == should_pass, numbers


def test_f16_rounding_brings_jax_closer_to_llama_cpp(engines, loaded) -> None:
    """Numerics(f16=True) models what llama.cpp rounds: without it the difference is larger
    (the tolerance holds either way on these models, the rounding is the tighter model)."""
    engine = engines("qwen35")
    model = loaded("qwen35")
    diffs = {}
    for f16 in (True, False):
        options = ForwardOptions(numerics=Numerics(f16=f16))
        report = compare_with_engine(engine, model.spec, model.params, prompt(engine),
                                     options=options)
        assert report.passed, report.summary()
        diffs[f16] = report.max_abs_diff
    assert diffs[True] < diffs[False]


@pytest.mark.parametrize("arch", ARCHES)
def test_image_rows_are_what_the_engine_feeds(arch: str, engines) -> None:
    """``image_rows`` returns the encoder's own embedding bits, positions that move with the
    start (t, y, x by the start; z stays 0), and the next position the engine reaches."""
    from runtime.train import image_rows

    engine = engines(arch)
    png = png_bytes(160, 96)
    at0, at9 = image_rows(engine, png, 0), image_rows(engine, png, 9)
    enc = engine.encode_image(png)
    assert np.array_equal(at0.embeddings, enc.embeddings) and at0.embeddings.dtype == np.float32
    assert at0.embeddings.shape == (at0.n_rows, engine.n_embd)
    moved = at9.positions - at0.positions
    if arch == "qwen35":
        assert at0.positions.shape == (at0.n_rows, 4)
        assert (moved[:, :3] == 9).all() and (moved[:, 3] == 0).all()
        assert (at0.positions[:, 0] == 0).all()  # every image row shares the start as t
        assert at0.next_pos < at0.n_rows  # M-RoPE: fewer positions than rows
    else:
        assert at0.positions.shape == (at0.n_rows, 1) and (moved == 9).all()
        assert np.array_equal(at0.positions[:, 0], np.arange(at0.n_rows))
        assert at0.next_pos == at0.n_rows
    engine.prefill_tokens(0, engine.tokenize("<|im_start|>user\nlook here"), logits=False)
    start = engine.seq_info(0).next_pos
    engine.prefill_image(0, enc)
    assert engine.seq_info(0).next_pos == image_rows(engine, png, start).next_pos
    engine.clear(0)
