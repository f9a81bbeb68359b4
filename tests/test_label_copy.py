"""The designed label copy (runtime/train/label_copy.py).

- Every button label dialog-button's instruction quotes is one label piece through llama.cpp's
  own tokenizer; a quoted message that starts with a label word (click-ok's "Discard unsaved
  changes?") holds none.
- Before any training, with the whole designed start (lookup, read-out, word copy, typed
  flag), the residual entering the lookup layer at the ``click(`` row carries the named
  button's class code — nearest among every dialog button's code for every label, on both
  arches; the same start without the label copy does not.
- Without a label in the prompt the head writes exactly nothing (every value it could read is
  0), so the other kinds' asking rows are as without the design.
- The recipe's masks cover the designed slices.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from runtime.train.agents import (LABEL_PIECES, TYPED_WORDS, X_PIECES, Y_PIECES, agent_shape,
                                  agent_vocab)
from runtime.train.cell_vision import row_layout
from runtime.train.codes import spread_codes
from runtime.train.gguf_io import export_gguf
from runtime.train.grounding import Grounding, design, piece_ids
from runtime.train.label_copy import CODE, design_label, frozen_label, label_copy, label_head
from runtime.train.model import ForwardOptions, Rows, hidden_and_residual, lookup_layer
from runtime.train.params import init_params
from runtime.train.readout import Readout, design_readout
from runtime.train.typed_flag import design_typed, typed_flag
from runtime.train.word_copy import ASK_PIECES, WordCopy, copy_layer, design_copy
from vmenv.simdesk.words import BUTTON_WORDS

VOCAB = agent_vocab()
LAYOUT = row_layout(192)
CLASSES = [f"dialog.{w.lower()}" for w in BUTTON_WORDS] + ["dialog.ok", "other"]
CODES = dict(zip(CLASSES, spread_codes(len(CLASSES), 36, seed=0)))


def test_quoted_labels_are_label_pieces_through_llama_cpp(tmp_path: Path) -> None:
    spec = agent_shape("llama").spec
    model = export_gguf(tmp_path / "init.gguf", spec, init_params(spec, seed=0), vocab=VOCAB)
    with Engine(model.path, None, EngineConfig(n_seq_max=1, n_threads=1)) as engine:
        def pieces(text: str) -> list[str]:
            return [VOCAB.tokens[t] for t in engine.tokenize(text)]
        for word, piece in zip(BUTTON_WORDS, LABEL_PIECES):
            for text in (f'A dialog is open. Press its "{word}" button.',
                         f'Answer the dialog by clicking "{word}".'):
                assert piece in pieces(text), (text, pieces(text))
        for message in ("Discard unsaved changes?", "Delete the selected file?"):
            got = pieces(f'A dialog asks "{message}" Confirm it by clicking OK.')
            assert not set(got) & set(LABEL_PIECES), got


def _start(arch: str, labelled: bool) -> tuple[dict[str, np.ndarray], object]:
    spec = agent_shape(arch).spec
    g = Grounding(LAYOUT, CODES, piece_ids(VOCAB.tokens, X_PIECES),
                  piece_ids(VOCAB.tokens, Y_PIECES))
    words = WordCopy(LAYOUT, piece_ids(VOCAB.tokens, TYPED_WORDS),
                     piece_ids(VOCAB.tokens, ASK_PIECES))
    typed = typed_flag(VOCAB.tokens, words)
    p = design(init_params(spec, seed=0), spec, g)
    p = design_readout(p, spec, Readout(LAYOUT, g.x_ids, g.y_ids))
    p = design_typed(design_copy(p, spec, words), spec, typed)
    labels = label_copy(VOCAB.tokens, LAYOUT, CODES, typed.text_flag)
    if labelled:
        p = design_label(p, spec, labels)
    return p, labels


def _prompt(word: str | None) -> list[int]:
    """A system turn, a user turn naming the button (``None``: naming none), a stretch of
    filler, the click."""
    named = ["▁", '"', f'{word}"'] if word else ["▁the", "▁text"]
    pieces = ["<|im_start|>", "system", "<0x0A>", "▁You", "▁are", "▁a", "▁GUI", "▁agent",
              "<|im_end|>", "<0x0A>", "<|im_start|>", "user", "<0x0A>", "Task", ":", "▁Press",
              "▁its", *named, "▁button", ".", "<0x0A>",
              *["▁the", "▁text", "▁field"] * 20, "<|im_end|>", "<0x0A>", "<|im_start|>",
              "assistant", "<0x0A>", "click("]
    return [VOCAB.tokens.index(p) for p in pieces]


def _asked(params: dict[str, np.ndarray], arch: str, word: str | None) -> np.ndarray:
    """The query dims of the residual entering the lookup layer at the ``click(`` row."""
    spec = agent_shape(arch).spec
    p = {k: jnp.asarray(v) for k, v in params.items()}
    toks = np.asarray(_prompt(word), np.int32)
    n = len(toks)
    width = 4 if spec.is_hybrid else 1
    pos = np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)
    if width == 4:
        pos[:, 3] = 0
    rows = Rows(jnp.asarray(toks), jnp.zeros((n, spec.n_embd)), jnp.zeros(n, bool),
                jnp.asarray(pos), jnp.ones(n, bool))
    _, res = hidden_and_residual(p, spec, rows, ForwardOptions(), lookup_layer(spec))
    return np.asarray(res[-1, LAYOUT.query])


def _nearest_labels(arch: str, labelled: bool) -> list[str]:
    params, _ = _start(arch, labelled)
    codes = np.stack([CODES[f"dialog.{w.lower()}"][:CODE] for w in BUTTON_WORDS])
    return [BUTTON_WORDS[int((codes @ _asked(params, arch, w)[:CODE]).argmax())]
            for w in BUTTON_WORDS]


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_click_row_asks_for_the_named_button(arch: str) -> None:
    assert _nearest_labels(arch, labelled=True) == list(BUTTON_WORDS)
    plain = _nearest_labels(arch, labelled=False)
    assert sum(a == b for a, b in zip(plain, BUTTON_WORDS)) <= 3


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_without_a_label_the_head_writes_nothing(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, _ = _start(arch, labelled=True)
    silent = dict(params)
    silent[f"blk.{copy_layer(spec)}.attn_output.weight"] = params[
        f"blk.{copy_layer(spec)}.attn_output.weight"].copy()
    silent[f"blk.{copy_layer(spec)}.attn_output.weight"][:, label_head(spec).out] = 0.0
    assert np.array_equal(_asked(params, arch, None), _asked(silent, arch, None))
    named = _asked(params, arch, "Apply") - _asked(silent, arch, "Apply")
    assert np.linalg.norm(named) > 1.0  # and with one it writes the code


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_masks_cover_the_label_copy(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, labels = _start(arch, labelled=True)
    masks = frozen_label(params, spec, labels)
    e = masks["token_embd.weight"]
    assert e[:, labels.label_flag].all() and e[:, labels.code_dims].all()
    assert not e[:, LAYOUT.key].any() and not e[:, LAYOUT.query.stop - 1].any()
    pre = f"blk.{copy_layer(spec)}"
    head = label_head(spec)
    assert masks[f"{pre}.attn_q.weight"][head.q].all()
    assert masks[f"{pre}.attn_output.weight"][:, head.out].all()
    assert not masks[f"{pre}.attn_output.weight"][:, :head.out.start].any()
    if spec.is_hybrid:  # the Gated DeltaNet layer before writes nothing there, and keeps so
        assert masks["blk.0.ssm_out.weight"][labels.code_dims].all()
        assert not np.asarray(params["blk.0.ssm_out.weight"])[labels.code_dims].any()


def test_a_label_without_a_class_is_left_out() -> None:
    codes = {c: v for c, v in CODES.items() if c not in ("dialog.apply", "dialog.skip")}
    labels = label_copy(VOCAB.tokens, LAYOUT, codes, text_flag=LAYOUT.content.stop - 1)
    kept = [VOCAB.tokens[t] for t in labels.label_ids]
    assert 'Apply"' not in kept and 'Skip"' not in kept and len(kept) == len(BUTTON_WORDS) - 2
    assert np.array_equal(labels.codes[0], CODES["dialog.save"])
    empty = label_copy(VOCAB.tokens, LAYOUT, {"other": CODES["other"]}, LAYOUT.content.stop - 1)
    spec = agent_shape("llama").spec
    start, _ = _start("llama", labelled=False)
    params = design_label(start, spec, empty)  # a head that writes 0
    assert not params["token_embd.weight"][:, empty.code_dims].any()
