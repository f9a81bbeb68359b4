"""The designed word copy (runtime/train/word_copy.py) and the frozen slices (optim).

- Every word a simdesk task types is one token of the agents' vocabulary through llama.cpp's
  own tokenizer, in the action (``type("word")``) and quoted in an instruction.
- Before any training, the designed head makes the row of ``type("`` predict the quoted word
  among all typed words — held-out words included — on both arches; the same model without
  the design does not.
- ``apply_updates`` keeps masked entries bitwise (weight decay included) and moves the rest;
  the recipe's masks cover the designed slices and nothing of the layers between them.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from runtime.train.agents import (TYPED_WORDS, X_PIECES, Y_PIECES, agent_shape,
                                  agent_vocab)
from runtime.train.cell_vision import row_layout
from runtime.train.gguf_io import export_gguf
from runtime.train.grounding import Grounding, design, frozen_lookup, piece_ids
from runtime.train.model import Rows, forward, lookup_layer
from runtime.train.optim import AdamW, apply_updates, init_state, merge_masks
from runtime.train.params import init_params
from runtime.train.codes import spread_codes
from runtime.train.word_copy import (ASK_PIECES, WordCopy, copy_layer, design_copy,
                                     frozen_copy)
from vmenv.simdesk.words import EVAL_ONLY_WORDS

VOCAB = agent_vocab()
LAYOUT = row_layout(192)


def _copy() -> WordCopy:
    return WordCopy(LAYOUT, piece_ids(VOCAB.tokens, TYPED_WORDS),
                    piece_ids(VOCAB.tokens, ASK_PIECES))


def test_every_typed_word_is_one_token_through_llama_cpp(tmp_path: Path) -> None:
    spec = agent_shape("llama").spec
    model = export_gguf(tmp_path / "init.gguf", spec, init_params(spec, seed=0), vocab=VOCAB)
    split = []
    with Engine(model.path, None, EngineConfig(n_seq_max=1, n_threads=1)) as engine:
        for word in TYPED_WORDS:
            for text in (f'type("{word}")', f'Type the word "{word}" into the field.',
                         f'Save the note "{word}": open Notes'):
                pieces = [VOCAB.tokens[t] for t in engine.tokenize(text)]
                if word not in pieces:
                    split.append((text, pieces))
    assert not split


def _prompts(words: tuple[str, ...]) -> list[list[int]]:
    """A user turn quoting each word, then the assistant's earlier click and ``type("``."""
    out = []
    for word in words:
        pieces = ["<|im_start|>", "user", "<0x0A>", "▁Type", "▁the", "▁word", "▁", '"', word,
                  '"', "▁into", "▁the", "▁text", "▁field", "<|im_end|>", "<0x0A>",
                  "<|im_start|>", "assistant", "<0x0A>", "click(", X_PIECES[9],
                  Y_PIECES[5].replace(" ", "▁"), ")", "<0x0A>", 'type("']
        out.append([VOCAB.tokens.index(p) for p in pieces])
    return out


def _predicted_words(arch: str, designed: bool) -> list[str]:
    spec = agent_shape(arch).spec
    params = init_params(spec, seed=0)
    if designed:
        params = design_copy(params, spec, _copy())
    p = {k: jnp.asarray(v) for k, v in params.items()}
    tokens = np.asarray(_prompts(TYPED_WORDS), np.int32)
    n = tokens.shape[1]
    width = 4 if spec.is_hybrid else 1
    pos = np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)
    if width == 4:
        pos[:, 3] = 0

    @jax.jit
    def last_logits(toks: jax.Array) -> jax.Array:
        rows = Rows(toks, jnp.zeros((n, spec.n_embd)), jnp.zeros(n, bool), jnp.asarray(pos),
                    jnp.ones(n, bool))
        return forward(p, spec, rows, select=jnp.asarray([n - 1]))[0]

    logits = np.stack([np.asarray(last_logits(jnp.asarray(t))) for t in tokens])
    ids = np.asarray(_copy().word_ids)
    return [VOCAB.tokens[ids[i]] for i in logits[:, ids].argmax(axis=1)]


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_designed_head_types_the_quoted_word(arch: str) -> None:
    assert _predicted_words(arch, designed=True) == list(TYPED_WORDS)
    plain = _predicted_words(arch, designed=False)
    assert sum(a == b for a, b in zip(plain, TYPED_WORDS)) < len(TYPED_WORDS) // 4
    assert set(EVAL_ONLY_WORDS) <= set(TYPED_WORDS)  # held-out words are among those copied


def test_word_codes_are_unit_deterministic_and_apart() -> None:
    c = spread_codes(len(TYPED_WORDS), 48, seed=0)
    assert np.allclose(np.linalg.norm(c, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(c, spread_codes(len(TYPED_WORDS), 48, seed=0))
    gram = c @ c.T
    np.fill_diagonal(gram, 0.0)
    assert np.abs(gram).max() < 0.5  # a copied code outscores every other word's


def test_frozen_entries_stay_bitwise_and_the_rest_moves() -> None:
    rng = np.random.default_rng(0)
    params = {"w": rng.normal(size=(6, 5)).astype(np.float32),
              "b": rng.normal(size=5).astype(np.float32)}
    mask = np.zeros((6, 5), np.float32)
    mask[1:3] = 1.0
    grads = {k: jnp.asarray(rng.normal(size=v.shape), jnp.float32) for k, v in params.items()}
    opt = AdamW(learning_rate=0.1, weight_decay=0.5)
    state, _ = apply_updates(init_state(params), grads, opt, {"w": jnp.asarray(mask)})
    w = np.asarray(state.params["w"])
    assert np.array_equal(w[1:3], params["w"][1:3])
    assert not np.isclose(w[[0, 3, 4, 5]], params["w"][[0, 3, 4, 5]]).any()
    assert not np.isclose(np.asarray(state.params["b"]), params["b"]).any()
    # the dropped gradient does not count in the clipping norm
    _, norm = apply_updates(init_state(params), grads, opt, {"w": jnp.asarray(mask)})
    kept = np.concatenate([np.asarray(grads["w"])[[0, 3, 4, 5]].ravel(),
                           np.asarray(grads["b"])])
    assert float(norm) == pytest.approx(float(np.linalg.norm(kept)), rel=1e-5)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_recipes_masks_cover_the_designs_only(arch: str) -> None:
    spec = agent_shape(arch).spec
    rng = np.random.default_rng(3)
    codes = {f"c{i}": v / np.linalg.norm(v) for i, v in enumerate(rng.normal(size=(4, 36)))}
    g = Grounding(LAYOUT, codes, piece_ids(VOCAB.tokens, X_PIECES),
                  piece_ids(VOCAB.tokens, Y_PIECES))
    params = design_copy(design(init_params(spec, seed=0), spec, g), spec, _copy())
    masks = merge_masks(frozen_lookup(params, spec, g), frozen_copy(params, spec, _copy()))
    assert set(masks) == set(params)
    touched = {k for k, m in masks.items() if m.any()}
    layers = {copy_layer(spec), lookup_layer(spec)}
    assert all(k == "token_embd.weight" or int(k.split(".")[1]) in layers for k in touched)
    assert "token_embd.weight" in touched
    assert not masks["output_norm.weight"].any()
    # whole rows of the embedding are never frozen: each frozen row keeps trainable dims
    e = masks["token_embd.weight"]
    assert (e.sum(axis=1) < e.shape[1]).all()
    hd = spec.head_dim
    # the designed heads' outputs are frozen, another head's are not
    o = masks[f"blk.{copy_layer(spec)}.attn_output.weight"]
    assert o[:, :hd].all() and not o[:, hd:2 * hd].any()
