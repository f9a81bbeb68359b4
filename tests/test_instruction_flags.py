"""The designed instruction flags (runtime/train/instruction_flags.py).

- Each flag word is one piece through llama.cpp's own tokenizer and occurs in exactly the
  instructions of the kinds that ask for its step (`` Save``: the kinds that save a note;
  `` menu``: menu-launch; `` Enter``: menu-launch's Terminal variant), over many seeds.
- With the whole designed start, the row that chooses the verb carries the named flag after
  the copy layer — and the other flags not — on both arches; without a flag word in the
  prompt the flags' output columns add exactly nothing.
- With ``key_row`` (the text flag on ``press("`` and the ``enter`` piece reading the Enter flag)
  the designed start already prefers ``enter`` over ``backspace`` at the row that chooses a key
  when the instruction asks for Enter, by more than it does without the read-out; the read-out
  is the one flag-dim entry training may move.
- The shipped agents carry the flags exactly as designed (kept fixed through the done stage
  and the f16 export), and the masks keep the flag dims fixed.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from designed_start import (CODES, LAYOUT, VOCAB, designed_start, last_residual, line_rows,
                            token_ids)
from runtime.agent_models import AGENT_DIR
from runtime.train.agents import agent_shape
from runtime.train.gguf_io import export_gguf, load_gguf
from runtime.train.grounding import piece_ids
from runtime.train.instruction_flags import (
    FLAG_PIECES, InstructionFlags, design_flags, frozen_flags, instruction_flags,
)
from runtime.train.label_copy import label_copy
from runtime.train.model import ForwardOptions, hidden_and_residual, project
from runtime.train.params import init_params
from runtime.train.word_copy import copy_layer
from vmenv.simdesk.drafts import KINDS

#: the kinds whose instructions ask for each flag's step (some instances, for Enter)
ASKING = {" Save": {"save-note", "switch-window", "remember-code", "marked-launch"},
          " menu": {"menu-launch"}, " Enter": {"menu-launch"}}


def test_flag_words_are_pieces_in_exactly_the_asking_instructions(tmp_path: Path) -> None:
    spec = agent_shape("llama").spec
    model = export_gguf(tmp_path / "init.gguf", spec, init_params(spec, seed=0), vocab=VOCAB)
    seen: dict[str, set[str]] = {p: set() for p in FLAG_PIECES}
    ids = dict(zip(FLAG_PIECES, piece_ids(VOCAB.tokens, FLAG_PIECES)))
    with Engine(model.path, None, EngineConfig(n_seq_max=1, n_threads=1)) as engine:
        for name, draft in KINDS.items():
            # a dense or classic-style kind says what its kind says
            kind = name.removeprefix("dense-").removeprefix("classic-")
            for seed in range(24):
                text = draft(random.Random(seed), ["hello", "jackal"]).instruction
                pieces = set(engine.tokenize(f"Task: {text}"))
                for flag in FLAG_PIECES:
                    if ids[flag] in pieces:
                        seen[flag].add(kind)
                    elif kind in ASKING[flag] and flag != " Enter":
                        pytest.fail(f"{kind}@{seed} lacks {flag!r}: {text}")
    assert seen == ASKING


def _start(arch: str, *, key_row: bool = False,
           ) -> tuple[dict[str, np.ndarray], InstructionFlags]:
    """The designed start with the flags (``key_row``: the text flag on ``press("`` too and
    the key read-outs)."""
    params, labels = designed_start(arch, key_row=key_row)
    flags = instruction_flags(VOCAB.tokens, labels, key_row=key_row)
    return design_flags(params, agent_shape(arch).spec, flags), flags


def _prompt(word: str | None) -> list[int]:
    """A user turn with ``word`` in it (``None``: none of the flag words), a history line that
    clicked, the assistant header: its last row chooses the verb."""
    asked = [word.replace(" ", "▁")] if word else ["▁the"]
    pieces = ["<|im_start|>", "user", "<0x0A>", "Task", ":", "▁Open", "▁Notes", "▁then",
              "▁click", *asked, ".", "<0x0A>", *["▁the", "▁text", "▁field"] * 12,
              "<0x0A>", "Step", "▁", "1", ":", "▁click(", "304", ",▁176", ")", "<0x0A>",
              "<|im_end|>", "<0x0A>", "<|im_start|>", "assistant", "<0x0A>"]
    return token_ids(pieces)


def _verb_row(params: dict[str, np.ndarray], arch: str, word: str | None) -> np.ndarray:
    """The residual entering the layer after the copy layer, at the verb's row."""
    return last_residual(params, arch, _prompt(word), copy_layer(agent_shape(arch).spec) + 1)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_verb_row_carries_the_asked_flag(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, flags = _start(arch)
    silent = dict(params)
    name = f"blk.{copy_layer(spec)}.attn_output.weight"
    silent[name] = params[name].copy()
    silent[name][:, list(flags.output_columns(spec))] = 0.0
    dims = list(flags.dims)
    # no flag word: the flags' columns add exactly nothing
    assert np.array_equal(_verb_row(params, arch, None), _verb_row(silent, arch, None))
    for i, word in enumerate(FLAG_PIECES):
        added = _verb_row(params, arch, word)[dims] - _verb_row(silent, arch, word)[dims]
        assert added[i] > 0.5, (word, added)
        assert np.abs(np.delete(added, i)).max() < 0.05 * added[i], (word, added)


def _enter_over_backspace(params: dict[str, np.ndarray], arch: str, enter: bool) -> float:
    """The logit of ``enter`` minus ``backspace`` at the key row, after a typed line, with the
    instruction asking for Enter or not."""
    spec = agent_shape(arch).spec
    asked = ["▁and", "▁press", "▁Enter"] if enter else ["▁and", "▁wait"]
    pieces = ["<|im_start|>", "user", "<0x0A>", "Task", ":", "▁Open", "▁Notes", "▁then",
              "▁type", *asked, ".", "<0x0A>", "Step", "▁", "1", ":", "▁type(\"", "hello",
              "\"", ")", "<0x0A>", "<|im_end|>", "<0x0A>", "<|im_start|>", "assistant",
              "<0x0A>", 'press("']
    p = {k: np.asarray(v) for k, v in params.items()}
    hidden, _ = hidden_and_residual(p, spec, line_rows(spec, token_ids(pieces)),
                                    ForwardOptions(), 0)
    logits = np.asarray(project(p, hidden[-1]))
    return float(logits[VOCAB.tokens.index("enter")] - logits[VOCAB.tokens.index("backspace")])


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_key_row_reads_enter_where_it_is_asked(arch: str) -> None:
    (with_row, flags), (without, _) = _start(arch, key_row=True), _start(arch)
    gain = _enter_over_backspace(with_row, arch, True) - _enter_over_backspace(with_row, arch,
                                                                               False)
    plain = _enter_over_backspace(without, arch, True) - _enter_over_backspace(without, arch,
                                                                               False)
    assert gain > 0.5 and gain > plain + 0.5, (gain, plain)
    masks = frozen_flags(with_row, agent_shape(arch).spec, flags)["token_embd.weight"]
    masks = masks[:, list(flags.dims)]
    assert masks.size - masks.sum() == 1  # the read-out, and only it, is trained
    e = with_row["token_embd.weight"][:, list(flags.dims)]
    assert e[VOCAB.tokens.index("enter"), FLAG_PIECES.index(" Enter")] > 0


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_shipped_agents_carry_the_flags_as_designed(arch: str) -> None:
    """The done stage designed the flags into the shipped agents and kept them fixed through
    its updates and the f16 export: the flag dims hold exactly the design (one entry per
    flag piece), and the label head's flag rows and columns are taken."""
    loaded = load_gguf(AGENT_DIR / f"agent-{arch}.gguf")
    spec = loaded.spec
    labels = label_copy(VOCAB.tokens, LAYOUT, CODES, LAYOUT.content.stop - 1)
    recipe = json.loads((AGENT_DIR / "recipe.json").read_text())["config"]
    flags = instruction_flags(VOCAB.tokens, labels, key_row=recipe.get("key_row", False))
    shipped = {k: np.asarray(v) for k, v in loaded.params.items()}
    e = shipped["token_embd.weight"][:, list(flags.dims)].copy()
    for tok, flag in flags.key_reads:  # the key read-outs: designed, then trained
        assert e[tok, flag] > 0
        e[tok, flag] = 0.0
    assert np.count_nonzero(e) == len(FLAG_PIECES)
    assert np.array_equal(e[list(flags.flag_ids)], np.diag([3.0] * len(FLAG_PIECES)))
    v = shipped[f"blk.{copy_layer(spec)}.attn_v.weight"]
    for row, dim in zip(flags.value_rows(spec), flags.dims):
        assert np.count_nonzero(v[row]) == 1 and v[row, dim] == 1.0
    with pytest.raises(ValueError, match="no free value rows"):
        design_flags(shipped, spec, flags)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_masks_keep_the_flag_dims(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, flags = _start(arch)
    masks = frozen_flags(params, spec, flags)
    assert masks["token_embd.weight"][:, list(flags.dims)].all()
    assert not masks["token_embd.weight"][:, : LAYOUT.content.start].any()
    norm = masks[f"blk.{copy_layer(spec)}.attn_norm.weight"]
    assert norm[list(flags.dims)].all() and norm.sum() == len(FLAG_PIECES)
    if spec.is_hybrid:  # the Gated DeltaNet layer before writes nothing there, and keeps so
        assert masks["blk.0.ssm_out.weight"][list(flags.dims)].all()
        assert not np.asarray(params["blk.0.ssm_out.weight"])[list(flags.dims)].any()
