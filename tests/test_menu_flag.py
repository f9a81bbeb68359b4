"""The designed menu flag (runtime/train/menu_flag.py).

- ``menu_cells`` marks the open menu's cells: none before menu-launch's menu opens, the
  expert's entry click lands on one after, none once the app opened.
- The recogniser trained with the menu read-out (a toy budget) reads held-out screens'
  open menus: few menu cells missed, fewer others read as menu; llama.cpp's mtmd writes
  exactly that read-out into the layout's menu dim (the numpy replica within 5e-3); every
  other merger weight is the projector's without it.
- Before any training, given image rows whose menu dim is the open menu's cells, the
  designed head writes the menu dim at the row that picks the verb when a screenshot in the
  prompt shows the menu open, under a third of that when none does, on both arches, with 1
  or 3 screenshots; the same model without the design does not separate the two; a typed
  history line's flag is what it was without the menu flag.
- The masks cover the menu dim of every piece and nothing of a later layer (``--from``
  refusing base agents made the other way: test_recipe_base.py).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from designed_start import copy_layer_mix
from runtime.agent_models import agent_files
from runtime.train.agents import agent_shape, agent_vocab
from runtime.train.cell_features import CELL, cell_features
from runtime.train.cell_vision import POS_SCALE, _merger, row_layout, write_cell_mmproj
from runtime.train.designs import agent_designs
from runtime.train.grounding import first_head_of
from runtime.train.menu_flag import VALUE_ROW, frozen_menu_flag
from runtime.train.menu_readout import menu_cells, readout_errors
from runtime.train.params import init_params
from runtime.train.recogniser import cell_data, train_recogniser
from runtime.train.word_copy import copy_layer
from vmenv.actions import Click
from vmenv.simdesk import demonstration, sample_task
from vmenv.simdesk.render import render, render_png
from vmenv.simdesk.seeds import eval_seeds, train_seeds

SPEC = agent_shape("qwen35").spec
LAYOUT = row_layout(SPEC.n_embd)
VOCAB = agent_vocab()
CONFIG = EngineConfig(n_ctx_per_seq=2048, n_seq_max=1, n_threads=2, decode_rows=1)
KINDS = ("menu-launch", "type-in-field", "click-ok", "save-note")


def _menu_launch(seed: int):
    return demonstration(sample_task("menu-launch", seed), 640, 384)


def test_menu_cells_are_the_open_menus() -> None:
    checked = 0
    for seed in eval_seeds(40)[:12]:
        demo = _menu_launch(seed)
        opened = [i for i, s in enumerate(demo) if s.state.menu_open]
        if not opened:
            continue
        assert not menu_cells(demo[0].state).any()  # the first screen: menu closed
        at = opened[0]
        cells = menu_cells(demo[at].state)
        click = demo[at].action
        assert isinstance(click, Click) and cells[click.y // CELL, click.x // CELL]
        later = [s.state for s in demo[at + 1:] if not s.state.menu_open]
        assert later and not any(menu_cells(s).any() for s in later)
        checked += 1
    assert checked >= 8


@pytest.fixture(scope="module")
def trained():
    data = cell_data(train_seeds(), 32, kinds=KINDS)
    return train_recogniser(data, key_dims=36, hidden=128, updates=500, seed=0, menu=True)


@pytest.fixture(scope="module")
def projector(trained, tmp_path_factory) -> Path:
    return write_cell_mmproj(SPEC, tmp_path_factory.mktemp("menu") / "cells.gguf", trained)


def _rows(mmproj: Path, pngs: list[bytes]) -> list[np.ndarray]:
    model, _ = agent_files("qwen35", vision=False)
    with Engine(model, mmproj, CONFIG) as engine:
        return [np.asarray(engine.encode_image(png).embeddings) for png in pngs]


def test_the_projector_reads_the_open_menu_off_held_out_cells(trained, projector) -> None:
    rec = trained
    held_out = cell_data(iter(eval_seeds(300)), 16, rec.classes, kinds=KINDS)
    assert held_out.menu.sum() > 50
    # a toy recogniser (the recipe's, 512 units and 1500 updates: ~0.05 and ~0.005)
    missed, forged = readout_errors(rec.menu, rec.hidden_units(held_out.features),
                                    held_out.menu)
    assert missed < 0.25 and forged < 0.03
    # what llama.cpp computes: a menu-launch screen with the menu open and the one before
    demo = _menu_launch(eval_seeds(40)[0])
    at = next(i for i, s in enumerate(demo) if s.state.menu_open)
    states = (demo[at].state, demo[0].state)
    rows = _rows(projector, [render_png(s) for s in states])
    for state, got in zip(states, rows):
        feats = cell_features(np.asarray(render(state).convert("RGB"))).reshape(-1, 384)
        want = rec.menu.values(rec.hidden_units(feats))
        assert np.abs(got[:, LAYOUT.menu] - want).max() < 5e-3
    menu = menu_cells(states[0]).reshape(-1)
    assert menu.sum() >= 4
    shown = rows[0][:, LAYOUT.menu]
    assert shown[menu].mean() > POS_SCALE / 2 > 3 * max(shown[~menu].mean(),
                                                        rows[1][:, LAYOUT.menu].mean())
    # the read-out replaces the menu dim's content unit and touches no other weight
    plain, with_menu = _merger(attrs.evolve(rec, menu=None), LAYOUT, 0), _merger(rec, LAYOUT, 0)
    for name in plain:
        a, b = plain[name], with_menu[name]
        other = np.arange(len(a)) != LAYOUT.menu if name.startswith("mm.2") else slice(None)
        assert np.array_equal(a[other], b[other]), name
    assert not np.array_equal(plain["mm.2.weight"][LAYOUT.menu],
                              with_menu["mm.2.weight"][LAYOUT.menu])


def _ids(pieces: list[str]) -> list[int]:
    return [VOCAB.tokens.index(p) for p in pieces]


HEADER = _ids(["<|im_start|>", "user", "<0x0A>"])
GENERATION = _ids(["<|im_end|>", "<0x0A>", "<|im_start|>", "assistant", "<0x0A>"])


def _last_row(arch: str, params, embeds: np.ndarray, dim: int) -> float:
    """The copy layer's attention output at ``dim``, last row (what its heads add)."""
    return float(copy_layer_mix(params, arch, embeds)[-1, dim])


def _prompt(params, images: list[np.ndarray], history: list[str]) -> np.ndarray:
    e = np.asarray(params["token_embd.weight"])
    parts = [e[HEADER], e[_ids(history)], *images, e[GENERATION]]
    return np.concatenate(parts).astype(np.float32)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_designed_head_flags_a_window_with_the_menu_open(arch, trained, projector) -> None:
    rec = trained
    spec = agent_shape(arch).spec
    demo = _menu_launch(eval_seeds(40)[1])
    at = next(i for i, s in enumerate(demo) if s.state.menu_open)
    states = (demo[0].state, demo[at].state, demo[at + 1].state)
    before, shown, after = _rows(projector, [render_png(s) for s in states])
    # the read-out's own errors are the test above's: here the menu dim is what it reads at
    # best, so the head is judged alone
    for rows, state in zip((before, shown, after), states):
        rows[:, LAYOUT.menu] = POS_SCALE * menu_cells(state).reshape(-1)
    designed = agent_designs(VOCAB.tokens, rec.classes, spec.n_embd, seed=0,
                             scaffold_weight=10.0, menu_flag=True)
    plain = agent_designs(VOCAB.tokens, rec.classes, spec.n_embd, seed=0, scaffold_weight=10.0)
    start = init_params(spec, seed=0)
    with_flag, without = designed.apply(start, spec), plain.apply(start, spec)
    step = ["Step", "▁", "0", ":", "▁click(", "304", ",▁176", ")", "<0x0A>"]
    dim = LAYOUT.menu
    for window_on, window_off in (([shown], [before]), ([before, after, shown],
                                                        [before, after, after])):
        on = _last_row(arch, with_flag, _prompt(with_flag, window_on, step), dim)
        off = _last_row(arch, with_flag, _prompt(with_flag, window_off, step), dim)
        assert on > 0.3 * POS_SCALE and abs(off) < on / 3, (on, off)
        plain_on = _last_row(arch, without, _prompt(without, window_on, step), dim)
        plain_off = _last_row(arch, without, _prompt(without, window_off, step), dim)
        assert abs(plain_on - plain_off) < 0.2 * (on - off)
    # a typed history line, no image: the typed flag is what it was without the menu flag
    # (up to the random embedding column the design zeroes, which qwen35's key projection
    # reads)
    typed = ["Step", "▁", "0", ":", "▁type(\"", "hello", "\"", ")", "<0x0A>"]
    t_dim = designed.typed.typed
    assert _last_row(arch, with_flag, _prompt(with_flag, [], typed), t_dim) == pytest.approx(
        _last_row(arch, without, _prompt(without, [], typed), t_dim), rel=1e-3)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_masks_cover_the_menu_dim_and_the_head_is_the_typed_ones(arch, trained) -> None:
    rec = trained
    spec = agent_shape(arch).spec
    designs = agent_designs(VOCAB.tokens, rec.classes, spec.n_embd, seed=0,
                            scaffold_weight=10.0, menu_flag=True)
    params = designs.apply(init_params(spec, seed=0), spec)
    masks = frozen_menu_flag(params, spec, designs.menu)
    il = copy_layer(spec)
    touched = {k for k, m in masks.items() if m.any()}
    assert all(k == "token_embd.weight" or int(k.split(".")[1]) <= il for k in touched)
    assert masks["token_embd.weight"][:, LAYOUT.menu].all()
    assert not params["token_embd.weight"][:, LAYOUT.menu].any()
    # the value row and output column it writes are kept fixed by the typed flag's masks
    every = designs.frozen(params, spec)
    head = first_head_of(spec, 1)  # the typed flag's head
    assert every[f"blk.{il}.attn_v.weight"][head.kv.start + VALUE_ROW].all()
    out = head.out.start + VALUE_ROW
    assert every[f"blk.{il}.attn_output.weight"][:, out].all()
    assert params[f"blk.{il}.attn_output.weight"][LAYOUT.menu, out] != 0
