"""The designed typed flag (runtime/train/typed_flag.py).

- With the agents' vocabulary, ``▁type("`` occurs in a prompt only on a history line that
  typed: the system prompt's own ``, type("text")`` is a piece of its own (llama.cpp's
  tokenizer, the kvagent profile's real system prompt).
- Before any training (the word copy designed, which gives ``type("`` its ask flag), the
  designed head writes the typed dim at the row that picks the
  verb: its gain after a typed history line however long the prompt, under a third of it
  without one, on both arches; the same model without the design does not separate the two.
- With ``key_row``, the row that chooses a pressed key (the response's ``press("``) reads the
  typed history the same way; without it that row does not separate the two.
- The masks cover the head and the text flag's embedding column, nothing of another layer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from designed_start import copy_layer_mix
from runtime.profiles.kvagent import KvAgentProfile
from runtime.train.agents import TYPED_WORDS, agent_shape, agent_vocab
from runtime.train.cell_vision import row_layout
from runtime.train.gguf_io import export_gguf
from runtime.train.grounding import piece_ids
from runtime.train.params import init_params
from runtime.train.typed_flag import (TYPED_GAIN, TypedFlag, design_typed, frozen_typed,
                                      typed_flag)
from runtime.train.word_copy import ASK_PIECES, WordCopy, copy_layer, design_copy

VOCAB = agent_vocab()
LAYOUT = row_layout(192)
WORDS = WordCopy(LAYOUT, piece_ids(VOCAB.tokens, TYPED_WORDS),
                 piece_ids(VOCAB.tokens, ASK_PIECES))


def _flag(key_row: bool = False) -> TypedFlag:
    return typed_flag(VOCAB.tokens, WORDS, key_row=key_row)


def test_only_a_typed_history_line_holds_the_history_type_piece(tmp_path: Path) -> None:
    spec = agent_shape("llama").spec
    model = export_gguf(tmp_path / "init.gguf", spec, init_params(spec, seed=0), vocab=VOCAB)
    system = KvAgentProfile().system_prompt(640, 384)
    history = 'Step 0: click(304, 176)\nStep 1: type("hello")\nStep 2: press("backspace")\n'
    with Engine(model.path, None, EngineConfig(n_seq_max=1, n_threads=1)) as engine:
        in_system = [VOCAB.tokens[t] for t in engine.tokenize(system)]
        in_history = [VOCAB.tokens[t] for t in engine.tokenize(history)]
    assert "▁type(\"" not in in_system and ",▁type(\"" in in_system
    assert in_history.count("▁type(\"") == 1 and in_history.count("▁press(\"") == 1
    assert "hello" in in_history and "backspace" in in_history  # whole pieces


def _prompt(typed: bool, filler: int, rng: np.random.Generator, *,
            pressing: bool = False) -> list[int]:
    """A long text prompt (``filler`` ordinary pieces), a history line that clicks, one that
    types or clicks, then the row that picks the verb (``pressing``: the row after the
    response's ``press("``, which picks the key)."""
    ordinary = [i for i, t in enumerate(VOCAB.tokens)
                if t.startswith("▁") and "type" not in t and len(t) > 2]
    pieces = ["Step", "▁", "0", ":", "▁click(", "304", ",▁176", ")", "<0x0A>", "Step", "▁",
              "1", ":"]
    pieces += ["▁type(\"", "hello", "\"", ")"] if typed else ["▁click(", "48", ",▁80", ")"]
    pieces += ["<0x0A>", "<|im_start|>", "assistant", "<0x0A>"]
    pieces += ['press("'] if pressing else []
    return list(rng.choice(ordinary, size=filler)) + [VOCAB.tokens.index(p) for p in pieces]


def _typed_at_last_row(arch: str, designed: bool, tokens: list[int], *,
                       key_row: bool = False) -> float:
    """The copy layer's attention output at the typed dim, last row (what the head adds)."""
    spec = agent_shape(arch).spec
    params = design_copy(init_params(spec, seed=0), spec, WORDS)  # gives type(" its ask flag
    if designed:
        params = design_typed(params, spec, _flag(key_row))
    embeds = np.asarray(params["token_embd.weight"])[np.asarray(tokens)]
    out = copy_layer_mix(params, arch, embeds)
    return float(out[-1, _flag().typed])


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
@pytest.mark.parametrize("filler", [40, 1200])
def test_designed_head_flags_a_typed_history(arch: str, filler: int) -> None:
    rng = np.random.default_rng(filler)
    typed, clicked = _prompt(True, filler, rng), _prompt(False, filler, rng)
    on = _typed_at_last_row(arch, True, typed)
    off = _typed_at_last_row(arch, True, clicked)
    # the flag is the ask flag's normalised size (~12) times the gain; without a typed line
    # the head lands on the rows whose (untrained, O(1)) ask dim is largest: a floor
    assert on > 0.6 * 10 * TYPED_GAIN and abs(off) < 0.35 * on
    plain_on = _typed_at_last_row(arch, False, typed)
    plain_off = _typed_at_last_row(arch, False, clicked)
    assert abs(plain_on - plain_off) < 0.2 * (on - off)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_key_row_reads_a_typed_history_with_key_row_only(arch: str) -> None:
    rng = np.random.default_rng(7)
    typed = _prompt(True, 40, rng, pressing=True)
    clicked = _prompt(False, 40, rng, pressing=True)
    on = _typed_at_last_row(arch, True, typed, key_row=True)
    off = _typed_at_last_row(arch, True, clicked, key_row=True)
    assert on > 0.6 * 10 * TYPED_GAIN and abs(off) < 0.35 * on
    plain_on = _typed_at_last_row(arch, True, typed)  # designed, but not at the key row
    plain_off = _typed_at_last_row(arch, True, clicked)
    assert abs(plain_on - plain_off) < 0.2 * (on - off)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_masks_cover_the_design_only(arch: str) -> None:
    spec = agent_shape(arch).spec
    params = design_typed(design_copy(init_params(spec, seed=0), spec, WORDS), spec, _flag())
    masks = frozen_typed(params, spec, _flag())
    assert set(masks) == set(params)
    touched = {k for k, m in masks.items() if m.any()}
    il = copy_layer(spec)
    assert "token_embd.weight" in touched
    assert all(k == "token_embd.weight" or k.startswith(f"blk.{il}.") for k in touched)
    e = masks["token_embd.weight"]
    assert e.sum() == e.shape[0] and e[:, _flag().text_flag].all()  # the text flag only
    # the text flag is on the rows that pick a verb or a coordinate, and on no other piece
    flagged = np.flatnonzero(params["token_embd.weight"][:, _flag().text_flag])
    assert set(flagged) == set(_flag().query_ids) and VOCAB.tokens.index("<0x0A>") in flagged
    keyed = set(_flag(key_row=True).query_ids) - set(_flag().query_ids)
    assert [VOCAB.tokens[i] for i in keyed] == ['press("']  # not a history line's ▁press("
