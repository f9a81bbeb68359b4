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

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from designed_start import CODES, LAYOUT, VOCAB, designed_start, last_residual, token_ids
from runtime.train.agents import LABEL_PIECES, agent_shape
from runtime.train.gguf_io import export_gguf
from runtime.train.label_copy import CODE, design_label, frozen_label, label_copy, label_head
from runtime.train.model import lookup_layer
from runtime.train.params import init_params
from runtime.train.word_copy import copy_layer
from vmenv.simdesk.words import BUTTON_WORDS


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
    return designed_start(arch, labelled=labelled)


def _prompt(word: str | None) -> list[int]:
    """A system turn, a user turn naming the button (``None``: naming none), a stretch of
    filler, the click."""
    named = ["▁", '"', f'{word}"'] if word else ["▁the", "▁text"]
    pieces = ["<|im_start|>", "system", "<0x0A>", "▁You", "▁are", "▁a", "▁GUI", "▁agent",
              "<|im_end|>", "<0x0A>", "<|im_start|>", "user", "<0x0A>", "Task", ":", "▁Press",
              "▁its", *named, "▁button", ".", "<0x0A>",
              *["▁the", "▁text", "▁field"] * 20, "<|im_end|>", "<0x0A>", "<|im_start|>",
              "assistant", "<0x0A>", "click("]
    return token_ids(pieces)


def _asked(params: dict[str, np.ndarray], arch: str, word: str | None) -> np.ndarray:
    """The query dims of the residual entering the lookup layer at the ``click(`` row."""
    spec = agent_shape(arch).spec
    return last_residual(params, arch, _prompt(word), lookup_layer(spec))[LAYOUT.query]


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
