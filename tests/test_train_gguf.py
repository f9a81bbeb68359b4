"""Parameters ↔ GGUF: loading a forged model and exporting it again gives the forged file
byte for byte; exports are deterministic; a custom spec with extra vocabulary pieces exports
to a model that kvagent's Engine loads, tokenizes with and matches; Q8_0 export loads."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import attrs
import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.forge import ForgedModel, TextSpec, text_spec
from cachepolicy.forge.tokenizer import build_vocab
from runtime.train import (
    ImagePiece, TextPiece, compare_with_engine, count_params, export_gguf, init_params,
    load_gguf,
)
from runtime.train.agents import (AGENT_PIECES, N_VOCAB, SUB_X_PIECES, SUB_Y_PIECES,
                                  agent_vocab)
from runtime.train.gguf_io import write_mmproj_for
from test_train_parity import png_bytes

CONFIG = EngineConfig(n_ctx_per_seq=1024, n_seq_max=1, n_threads=1, decode_rows=1)


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_export_of_a_loaded_forged_model_is_the_forged_file(
        arch: str, forged: Callable[..., ForgedModel], tmp_path: Path) -> None:
    m = forged(arch)
    model = load_gguf(m.model_path)
    assert model.spec == text_spec(arch, "tiny")
    assert count_params(model.params) == m.n_params
    # the forge's random init is the pytree init: same names, shapes and values
    fresh = init_params(model.spec, seed=m.seed)
    assert all(bool(jnp.array_equal(fresh[k], model.params[k])) for k in model.params)
    out = export_gguf(tmp_path / "again.gguf", model.spec, model.params, vocab=model.vocab)
    assert out.path.read_bytes() == m.model_path.read_bytes()
    again = export_gguf(tmp_path / "twice.gguf", model.spec, fresh)  # default vocab: forge's
    assert again.sha256 == out.sha256 == hashlib.sha256(m.model_path.read_bytes()).hexdigest()


def test_trained_values_round_to_f16_and_load_back(forged: Callable[..., ForgedModel],
                                                   tmp_path: Path) -> None:
    model = load_gguf(forged("qwen35").model_path)
    rng = np.random.default_rng(0)
    params = {k: v + jnp.asarray(rng.standard_normal(v.shape).astype(np.float32) * 1e-3)
              for k, v in model.params.items()}
    out = export_gguf(tmp_path / "t.gguf", model.spec, params)
    back = load_gguf(out.path)
    for name, value in params.items():
        f16 = value.ndim >= 2 and "ssm_conv1d" not in name  # matrices f16, vectors f32
        want = np.asarray(value).astype(np.float16 if f16 else np.float32).astype(np.float32)
        assert np.array_equal(np.asarray(back.params[name]), want), name
    assert export_gguf(tmp_path / "u.gguf", model.spec, params).sha256 == out.sha256
    bad = dict(params)
    bad["blk.0.ssm_a"] = bad["blk.0.ssm_a"].at[0].set(jnp.nan)
    with pytest.raises(ValueError, match="non-finite"):
        export_gguf(tmp_path / "bad.gguf", model.spec, bad)
    with pytest.raises(ValueError, match="missing"):
        export_gguf(tmp_path / "bad.gguf", model.spec,
                    {k: v for k, v in params.items() if k != "blk.0.ssm_a"})


def test_custom_spec_and_vocabulary_run_in_the_engine_and_match(tmp_path: Path) -> None:
    """A trainer-chosen size (not one of the forge's) with extra word pieces: the Engine loads
    it with a projector of its width, the pieces tokenize as one token each, and the JAX
    forward matches llama.cpp on a text + image prompt."""
    spec = TextSpec(arch="qwen35", size="train-s", n_vocab=640, n_embd=128, n_layer=4,
                    n_head=2, n_head_kv=1, head_dim=64, n_ff=256, full_attention_interval=2,
                    ssm_state=32, ssm_groups=1, ssm_v_heads=2)
    pieces = ("pyautogui.click(", " pyautogui.typewrite(")
    vocab = build_vocab(spec.n_vocab, pieces)
    params = init_params(spec, seed=5)
    model_path = export_gguf(tmp_path / "m.gguf", spec, params, vocab=vocab).path
    mmproj = write_mmproj_for(spec, tmp_path / "mmproj.gguf", seed=5)
    loaded = load_gguf(model_path)
    assert loaded.spec == spec
    assert loaded.vocab.tokens == vocab.tokens and loaded.vocab.types == vocab.types
    assert np.array_equal(np.float32(loaded.vocab.scores), np.float32(vocab.scores))  # stored f32
    with Engine(model_path, mmproj, CONFIG) as engine:
        assert engine.n_params == count_params(params)
        assert len(engine.tokenize("pyautogui.click(")) == 1
        assert len(engine.tokenize(" pyautogui.typewrite(")) == 1
        tok = engine.tokenize
        prompt = [TextPiece(tok("<|im_start|>user\nopen the menu")), ImagePiece(png_bytes(96, 64)),
                  TextPiece(tok("<|im_end|>\n<|im_start|>assistant\npyautogui.click(3, 4)"))]
        report = compare_with_engine(engine, spec, loaded.params, prompt)
    assert report.passed, report.summary()


def test_q8_0_export_loads_in_the_engine(forged: Callable[..., ForgedModel],
                                         tmp_path: Path) -> None:
    model = load_gguf(forged("llama").model_path)
    out = export_gguf(tmp_path / "q8.gguf", model.spec, model.params, quant="q8_0")
    f16 = export_gguf(tmp_path / "f16.gguf", model.spec, model.params)
    assert out.n_bytes < f16.n_bytes
    assert export_gguf(tmp_path / "q8b.gguf", model.spec, model.params,
                       quant="q8_0").sha256 == out.sha256
    back = load_gguf(out.path)  # dequantized: close to the f16 weights, not equal
    w, q = model.params["blk.0.ffn_up.weight"], back.params["blk.0.ffn_up.weight"]
    assert 0 < float(jnp.abs(w - q).max()) < 0.01 * float(jnp.abs(w).max())
    with Engine(out.path, None, CONFIG) as engine:
        tokens = engine.tokenize("<|im_start|>user\nclick the button<|im_end|>\n")
        logits = engine.prefill_tokens(0, tokens)
    assert logits is not None and np.isfinite(logits).all()
    with pytest.raises(ValueError, match="unknown quantization"):
        export_gguf(tmp_path / "x.gguf", model.spec, model.params, quant="q9")
    with pytest.raises(ValueError):  # a spec the file does not match
        export_gguf(tmp_path / "x.gguf", attrs.evolve(model.spec, n_ff=64), model.params)


def test_extra_pieces_that_do_not_fit_are_refused_not_cut() -> None:
    """The single characters come before the extra pieces: a vocabulary whose room they
    and the pieces (with prefixes) overflow is refused — the agents' vocabulary with the
    sub-cell pieces overflowed 1536 tokens, and before the check lost 48 of them silently."""
    with pytest.raises(ValueError, match="do not fit"):
        build_vocab(N_VOCAB, (*AGENT_PIECES, *SUB_X_PIECES, *SUB_Y_PIECES))
    vocab = agent_vocab(sub_cell=True)
    tokens = set(vocab.tokens)
    assert all(p.replace(" ", "\u2581") in tokens
               for p in (*AGENT_PIECES, *SUB_X_PIECES, *SUB_Y_PIECES))
