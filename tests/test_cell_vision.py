"""The cell projector (runtime/train/cell_vision.py) is what the trainer designed it to be when
llama.cpp's mtmd runs it.

On a real simdesk screen at 640x384 encoded through kvagent's Engine:
- each row's column and row one-hots are exact (bitwise POS_SCALE or 0): the step units land
  in ggml's exact GELU ranges;
- the query dims are zero; the key dims equal the recogniser's numpy keys within 5e-3 and
  name the same class for every cell; every dim equals the numpy replica of the whole
  projector (``cell_features`` + the merger) within 5e-3;
- the recogniser is deterministic in its seed, and learns (its lookup on held-out screens
  beats the chance of picking a cell at random);
- with the sub-cell read-out, its value lands in the cell's own column / row dim only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.vision import declares_position_features
from runtime.agent_models import agent_files
from runtime.train.agents import agent_shape
from runtime.train.cell_features import cell_features
from runtime.train.cell_labels import sub_cell_grid
from runtime.train.cell_vision import (POS_SCALE, SUB_SCALE, _merger, row_layout, width,
                                      write_cell_mmproj)
from runtime.train.recogniser import (SCREEN, cell_data, lookup_accuracy, train_recogniser)
from vmenv.simdesk import demonstration, sample_task
from vmenv.simdesk.render import render, render_png
from vmenv.simdesk.seeds import eval_seeds, train_seeds
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import default_tasks

SPEC = agent_shape("qwen35").spec
CONFIG = EngineConfig(n_ctx_per_seq=2048, n_seq_max=1, n_threads=2, decode_rows=1)


@pytest.fixture(scope="module")
def data():
    return cell_data(train_seeds(), 24)


@pytest.fixture(scope="module")
def rec(data):
    return train_recogniser(data, key_dims=36, hidden=128, updates=150, seed=0)


@pytest.fixture(scope="module")
def screen():
    return demonstration(sample_task("dialog-button", 3), *SCREEN)[0].state


def test_rows_from_llama_cpp_are_the_design(rec, screen, tmp_path) -> None:
    mmproj = write_cell_mmproj(SPEC, tmp_path / "cells.gguf", rec)
    assert declares_position_features(mmproj)
    model, _ = agent_files("qwen35", vision=False)
    with Engine(model, mmproj, CONFIG) as engine:
        rows = np.asarray(engine.encode_image(render_png(screen)).embeddings)
    lay = row_layout(SPEC.n_embd)
    assert rows.shape == (lay.cols * lay.rows, SPEC.n_embd) == (240, 192)
    cols = np.tile(np.arange(lay.cols), lay.rows)
    rws = np.repeat(np.arange(lay.rows), lay.cols)
    assert np.array_equal(rows[:, lay.column], POS_SCALE * np.eye(lay.cols, dtype=np.float32)[cols])
    assert np.array_equal(rows[:, lay.row], POS_SCALE * np.eye(lay.rows, dtype=np.float32)[rws])
    assert not rows[:, lay.query].any()

    feats = cell_features(np.asarray(render(screen).convert("RGB"))).reshape(-1, 384)
    keys = rec.keys(feats)
    assert np.abs(rows[:, lay.key] - keys).max() < 5e-3
    assert np.array_equal((rows[:, lay.key] @ rec.codes.T).argmax(-1),
                          (keys @ rec.codes.T).argmax(-1))
    w = _merger(rec, lay, 0)
    hidden = np.asarray(jax.nn.gelu(jnp.asarray(feats @ w["mm.0.weight"].T + w["mm.0.bias"])))
    replica = hidden @ w["mm.2.weight"].T + w["mm.2.bias"]
    assert np.abs(rows - replica).max() < 5e-3
    # the content is not empty: cells differ in what they look like
    assert rows[:, lay.content].std(axis=0).mean() > 0.01


def test_recogniser_is_deterministic_and_learns(data, rec) -> None:
    again = train_recogniser(data, key_dims=36, hidden=128, updates=150, seed=0)
    assert np.array_equal(again.w0, rec.w0) and np.array_equal(again.w2, rec.w2)
    held_out = cell_data(iter(eval_seeds(200)), 16, rec.classes)
    n_cells = held_out.labels.shape[1] * held_out.labels.shape[2]
    clicked = held_out.click_class >= 0
    # chance: the share of cells of the clicked class on its screen
    chance = np.mean([(held_out.labels[n] == held_out.click_class[n]).sum() / n_cells
                      for n in np.nonzero(clicked)[0]])
    assert lookup_accuracy(rec, held_out) > max(0.3, 3 * chance)


def test_layout_and_features_refuse_what_they_cannot_hold() -> None:
    with pytest.raises(ValueError, match="no room"):
        row_layout(96)
    with pytest.raises(ValueError, match="multiples of 32"):
        cell_features(np.zeros((360, 640, 3), np.uint8))


@pytest.fixture(scope="module")
def sub_rec():
    grid = sub_cell_grid()
    data = cell_data(train_seeds(), 24, kinds=("dense-click-ok", "dense-save-note",
                                                "save-note"), grid=grid)
    return train_recogniser(data, key_dims=36, hidden=128, updates=150, seed=0, sub_units=4)


def test_the_sub_cell_read_out_lands_gated_by_column_and_row(sub_rec, tmp_path) -> None:
    """Through llama.cpp's mtmd, on a dense screen and the classic click-ok: each cell's
    sub-cell value sits in its own column's x dim and its own row's y dim, SUB_SCALE times
    the numpy read-out (within 1e-2, as the keys are within 5e-3), and every other column's
    / row's dim is 0 (within 2e-2: f32 rounding of the pairs, ~1e3 in their identity
    range, against a signal of ±3): the gate holds though the content moves the position
    read-out by up to 0.01 of a cell. The one-hots stay bitwise."""
    assert sub_rec.sub is not None and sub_rec.sub.bound > 0
    mmproj = write_cell_mmproj(SPEC, tmp_path / "cells.gguf", sub_rec)
    lay = row_layout(SPEC.n_embd, sub_cell=True)
    assert width(lay.sub_x) == lay.cols and width(lay.sub_y) == lay.rows
    assert width(lay.content) == width(row_layout(SPEC.n_embd).content) - lay.cols - lay.rows
    screens = [demonstration(sample_task("dense-click-ok", 5), *SCREEN)[0].state,
               default_tasks()["click-ok"].setup(DeskState.empty(*SCREEN))]
    model, _ = agent_files("qwen35", vision=False)
    cols = np.tile(np.arange(lay.cols), lay.rows)
    rws = np.repeat(np.arange(lay.rows), lay.cols)
    with Engine(model, mmproj, CONFIG) as engine:
        for screen in screens:
            rows = np.asarray(engine.encode_image(render_png(screen)).embeddings)
            assert np.array_equal(rows[:, lay.column],
                                  POS_SCALE * np.eye(lay.cols, dtype=np.float32)[cols])
            assert np.array_equal(rows[:, lay.row],
                                  POS_SCALE * np.eye(lay.rows, dtype=np.float32)[rws])
            feats = cell_features(np.asarray(render(screen).convert("RGB"))).reshape(-1, 384)
            want = SUB_SCALE * sub_rec.sub.values(feats)
            sx, sy = rows[:, lay.sub_x], rows[:, lay.sub_y]
            assert np.abs(sx[np.arange(240), cols] - want[:, 0]).max() < 1e-2
            assert np.abs(sy[np.arange(240), rws] - want[:, 1]).max() < 1e-2
            sx[np.arange(240), cols] = 0.0
            sy[np.arange(240), rws] = 0.0
            assert np.abs(sx).max() < 2e-2 and np.abs(sy).max() < 2e-2
            assert np.abs(rows[:, lay.key] - sub_rec.keys(feats)).max() < 5e-3
            assert want.std() > 0.05  # the read-out says something
