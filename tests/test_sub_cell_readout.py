"""The sub-cell pieces' read-out (``grounding`` / ``readout`` with ``x_sub_ids``): an agent
made with them names a point 8 px off a cell's centre exactly where the projector's sub-cell
value of the copied cell says so, on both arches.

- A screenshot's rows with the asked class at one cell: the x pieces (centres and sub-cell
  points) rank the cell's column first, and among its three points the one its sub-cell
  value names (past ±½ of ``SUB_SCALE``); then, at the row that writes y after that x piece,
  the y pieces name the cell's row and its own sub-cell point.
- The class at two cells of adjacent columns with opposite steps (the classic OK button:
  the left cell's point is after its centre, the right cell's before): whichever column
  wins, its own step is the one read — a single dim averaged over both would read neither.
- Without a screenshot no x piece is preferred, sub-cell ones included (bitwise ties), and
  the masks keep every sub-cell piece's embedding and the sub-cell dims fixed.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from runtime.train.agents import (SUB_X_PIECES, SUB_Y_PIECES, X_PIECES, Y_PIECES, agent_shape,
                                  agent_vocab)
from runtime.train.cell_vision import POS_SCALE, SUB_SCALE, row_layout
from runtime.train.grounding import Grounding, design, frozen_lookup, piece_ids
from runtime.train.model import Rows, forward
from runtime.train.optim import merge_masks
from runtime.train.params import init_params
from runtime.train.readout import Readout, design_readout, frozen_readout

VOCAB = agent_vocab(sub_cell=True)
LAYOUT = row_layout(192, sub_cell=True)
X_IDS, Y_IDS = piece_ids(VOCAB.tokens, X_PIECES), piece_ids(VOCAB.tokens, Y_PIECES)
XS_IDS = piece_ids(VOCAB.tokens, SUB_X_PIECES)
YS_IDS = piece_ids(VOCAB.tokens, SUB_Y_PIECES)
ALL_X, ALL_Y = [*X_IDS, *XS_IDS], [*Y_IDS, *YS_IDS]


def _x_point(tok: int) -> int:
    """The pixel an x piece names."""
    return int(VOCAB.tokens[tok])


def _y_point(tok: int) -> int:
    return int(VOCAB.tokens[tok].removeprefix(",▁"))


def _grounding() -> Grounding:
    rng = np.random.default_rng(5)
    codes = rng.normal(size=(6, 36))
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    return Grounding(LAYOUT, {f"c{i}": c.astype(np.float32) for i, c in enumerate(codes)},
                     X_IDS, Y_IDS, x_sub_ids=XS_IDS, y_sub_ids=YS_IDS)


def _designed(arch: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], Readout]:
    spec = agent_shape(arch, sub_cell=True).spec
    g = _grounding()
    readout = Readout(LAYOUT, X_IDS, Y_IDS, XS_IDS, YS_IDS)
    params = design(init_params(spec, seed=0), spec, g)
    masks = [frozen_lookup(params, spec, g)]
    params = design_readout(params, spec, readout)
    masks.append(frozen_readout(params, spec, readout))
    return params, merge_masks(*masks), readout


def _rows(spec, embeds: np.ndarray, tokens: list[int] | None = None) -> Rows:
    n = len(embeds)
    width = 4 if spec.is_hybrid else 1
    pos = np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)
    return Rows(jnp.asarray(np.asarray(tokens or [0] * n, np.int32)), jnp.asarray(embeds),
                jnp.ones(n, bool), jnp.asarray(pos), jnp.ones(n, bool))


def _screen(spec, g: Grounding, target: int, cells: dict[tuple[int, int], tuple[float, float]],
            seed: int = 7) -> list[np.ndarray]:
    """Image rows: ``cells`` (row, col) -> the target class with that (x, y) step value;
    every other cell another class with a random step."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(LAYOUT.rows):
        for c in range(LAYOUT.cols):
            h = np.zeros(spec.n_embd, np.float32)
            if (r, c) in cells:
                cls, (sx, sy) = target, cells[(r, c)]
            else:
                cls, sx, sy = int(rng.choice([0, 1, 2, 4, 5])), *rng.uniform(-1, 1, 2)
            h[LAYOUT.key] = 3.0 * g.codes[f"c{cls}"]
            h[LAYOUT.column.start + c] = POS_SCALE
            h[LAYOUT.row.start + r] = POS_SCALE
            h[LAYOUT.sub_x.start + c] = SUB_SCALE * sx
            h[LAYOUT.sub_y.start + r] = SUB_SCALE * sy
            out.append(h)
    return out


def _click(arch: str, cells: dict[tuple[int, int], tuple[float, float]]) -> tuple[int, int]:
    """The point the designed model writes: x after the asking row, then y at the row of
    that x piece (asking the same class)."""
    spec = agent_shape(arch, sub_cell=True).spec
    params, _, _ = _designed(arch)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    g = _grounding()
    target = 3
    rows = _screen(spec, g, target, cells)
    ask = np.zeros(spec.n_embd, np.float32)
    ask[LAYOUT.query] = 6.0 * g.codes[f"c{target}"]
    logits = np.asarray(forward(p, spec, _rows(spec, np.stack(rows + [ask]))))
    x_tok = ALL_X[int(np.argmax(logits[-1, ALL_X]))]
    x_row = params["token_embd.weight"][x_tok].copy()
    x_row[LAYOUT.query] += 6.0 * g.codes[f"c{target}"]
    logits = np.asarray(forward(p, spec, _rows(spec, np.stack(rows + [ask, x_row]))))
    y_tok = ALL_Y[int(np.argmax(logits[-1, ALL_Y]))]
    return _x_point(x_tok), _y_point(y_tok)


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
@pytest.mark.parametrize(("step", "want"), [((0.0, 0.0), (432, 176)), ((1.0, -1.0), (440, 168)),
                                            ((-0.9, 0.8), (424, 184)), ((0.3, -0.3), (432, 176))])
def test_the_copied_step_names_the_point(arch: str, step: tuple[float, float],
                                         want: tuple[int, int]) -> None:
    assert _click(arch, {(5, 13): step}) == want


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_two_cells_of_a_class_keep_their_own_steps(arch: str) -> None:
    x, y = _click(arch, {(6, 11): (1.0, -1.0), (6, 12): (-1.0, -1.0)})
    assert (x, y) in {(376, 200), (392, 200)}


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_without_a_screenshot_no_point_is_preferred_and_the_masks_hold(arch: str) -> None:
    spec = agent_shape(arch, sub_cell=True).spec
    params, masks, readout = _designed(arch)
    rng = np.random.default_rng(1)
    trained = {k: np.where(masks[k] > 0, a, (1.0 if "norm" in k else 0.0)
                           + 0.3 * rng.normal(size=a.shape)).astype(np.float32)
               for k, a in params.items()}
    p = {k: jnp.asarray(v) for k, v in trained.items()}
    ordinary = [i for i in range(len(VOCAB.tokens)) if i not in set(ALL_X) | set(ALL_Y)]
    toks = [int(t) for t in rng.choice(ordinary, size=40)]
    embeds = np.asarray(params["token_embd.weight"])[toks]
    n = len(toks)
    width = 4 if spec.is_hybrid else 1
    rows = Rows(jnp.asarray(np.asarray(toks, np.int32)), jnp.asarray(embeds),
                jnp.zeros(n, bool),
                jnp.asarray(np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)),
                jnp.ones(n, bool))
    x_logits = np.asarray(forward(p, spec, rows))[:, ALL_X]
    assert not (x_logits.max(axis=1) - x_logits.min(axis=1)).any()
    em = masks["token_embd.weight"]
    assert em[list(XS_IDS + YS_IDS)].all()
    dims = readout.coordinate_dims
    assert len(dims) == 2 * (LAYOUT.cols + LAYOUT.rows)
    assert em[:, dims].all() and masks["output_norm.weight"][dims].all()
