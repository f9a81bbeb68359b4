"""The designed lookup (runtime/train/grounding.py) does what it is designed to do before any
training, and the query scaffold is exactly the term it states.

- For both shipped arches, the lookup layer's attention, given image rows laid out as the
  cell projector lays them out (``row_layout``) and a query row carrying a class's code: the
  column head copies the column one-hot of a cell of that class (two instances on screen:
  one of theirs), and with the x token's column added the row head copies the row of the
  instance in *that* column — not the other's.
- ``query_targets`` marks exactly the response rows whose target is a coordinate piece of a
  click on a known class; the loss with the scaffold is the loss without it plus
  ``Σ w (1 − cos) / #rows``; weight 0 changes nothing.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from runtime.train import attention, rope
from runtime.train.agents import X_PIECES, Y_PIECES, agent_shape, agent_vocab
from runtime.train.cell_vision import POS_SCALE, row_layout
from runtime.train.example import Batch
from runtime.train.grounding import Grounding, design, piece_ids, query_targets
from runtime.train.loss import loss_fn
from runtime.train.model import Rows, lookup_layer
from runtime.train.numerics import Numerics, rms_norm
from runtime.train.params import init_params

LAYOUT = row_layout(192)
N_CLASSES = 12


def _grounding(weight: float = 3.0) -> Grounding:
    rng = np.random.default_rng(5)
    codes = rng.normal(size=(N_CLASSES, 36))
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    tokens = agent_vocab().tokens
    return Grounding(LAYOUT, {f"c{i}": codes[i].astype(np.float32) for i in range(N_CLASSES)},
                     piece_ids(tokens, X_PIECES), piece_ids(tokens, Y_PIECES), weight=weight)


def _screen(g: Grounding, target: int, places: list[tuple[int, int]]) -> np.ndarray:
    """Image rows: every cell a random class other than ``target``, ``target`` at
    ``places`` (row, col)."""
    rng = np.random.default_rng(1)
    lay = LAYOUT
    h = np.zeros((lay.rows, lay.cols, 192), np.float32)
    cls = rng.integers(0, N_CLASSES - 1, (lay.rows, lay.cols))
    cls[cls >= target] += 1
    for r, c in places:
        cls[r, c] = target
    for r in range(lay.rows):
        for c in range(lay.cols):
            h[r, c, lay.key] = 3.0 * g.codes[f"c{cls[r, c]}"]
            h[r, c, lay.column.start + c] = POS_SCALE
            h[r, c, lay.row.start + r] = POS_SCALE
            h[r, c, lay.content] = 0.1 * rng.normal(size=lay.content.stop - lay.content.start)
    return h.reshape(-1, 192)


def _lookup(arch: str, query_row: np.ndarray, image: np.ndarray) -> np.ndarray:
    spec = agent_shape(arch).spec
    g = _grounding()
    p = {k: jnp.asarray(v) for k, v in design(init_params(spec, seed=0), spec, g).items()}
    h = jnp.asarray(np.concatenate([image, query_row[None]]))
    n = h.shape[0]
    if spec.is_hybrid:
        pos = np.zeros((n, 4), np.int32)
        pos[:-1, 1] = np.repeat(np.arange(LAYOUT.rows), LAYOUT.cols)
        pos[:-1, 2] = np.tile(np.arange(LAYOUT.cols), LAYOUT.rows)
        pos[-1, :3] = 40
    else:
        pos = np.arange(n, dtype=np.int32)[:, None] + 900  # far along a prompt
    pos = jnp.asarray(pos)
    cos, sin = rope.angles(pos, spec)
    visible = attention.visibility(pos, jnp.ones(n, bool))
    pre = f"blk.{lookup_layer(spec)}"
    x = rms_norm(h, p[f"{pre}.attn_norm.weight"], spec.rms_eps)
    block = attention.gated_attention if spec.is_hybrid else attention.llama_attention
    return np.asarray(block(p, pre, x, cos, sin, visible, spec, Numerics()))[-1]


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_designed_heads_copy_the_named_cell(arch: str) -> None:
    g = _grounding()
    target, places = 4, [(2, 3), (9, 15)]  # two instances: other row, other column
    image = _screen(g, target, places)
    query = np.zeros(192, np.float32)
    query[LAYOUT.query] = 3.0 * g.codes[f"c{target}"]
    out = _lookup(arch, query, image)
    col = out[LAYOUT.column]
    assert int(col.argmax()) in (3, 15)
    others = np.delete(col, [3, 15])
    assert col[[3, 15]].sum() > 4 * np.abs(others).max()
    # the x token of column 15 written: the row head picks that instance's row
    query[LAYOUT.column.start + 15] = POS_SCALE
    rows = _lookup(arch, query, image)[LAYOUT.row]
    assert int(rows.argmax()) == 9
    assert rows[9] > 2 * rows[2]


def test_query_targets_and_the_scaffold_term() -> None:
    g = _grounding(weight=2.0)
    x, y = g.x_ids[7], g.y_ids[4]
    click = agent_vocab().tokens.index("click(")
    # rows: ... click( -> x -> y -> ) ; targets are the next row's token
    targets = np.array([5, click, x, y, 9, 0], np.int32)
    mask = np.array([0, 1, 1, 1, 1, 0], np.float32)
    codes, weight = query_targets(targets, mask, "c3", g)
    assert weight.tolist() == [0, 0, 2, 2, 0, 0]
    assert np.array_equal(codes[2], g.codes["c3"]) and np.array_equal(codes[3], codes[2])
    assert not codes[[0, 1, 4, 5]].any()
    assert not query_targets(targets, mask, "", g)[1].any()
    assert not query_targets(targets, mask, "other", g)[1].any()

    spec = agent_shape("qwen35").spec
    params = {k: jnp.asarray(v) for k, v in init_params(spec, seed=0).items()}
    n = 6
    rows = Rows(jnp.asarray(targets)[None], jnp.zeros((1, n, 192)), jnp.zeros((1, n), bool),
                jnp.asarray(np.repeat(np.arange(n), 4).reshape(n, 4) * [1, 1, 1, 0])[None],
                jnp.ones((1, n), bool))
    plain = Batch(rows, jnp.asarray(targets)[None], jnp.asarray(mask)[None])
    loss0, m0 = loss_fn(params, plain, spec)
    zero = plain._replace(query_codes=jnp.asarray(codes)[None],
                          query_weight=jnp.zeros((1, n)))
    assert float(loss_fn(params, zero, spec)[0]) == float(loss0)
    scaffolded = zero._replace(query_weight=jnp.asarray(weight)[None])
    loss, m = loss_fn(params, scaffolded, spec)
    assert float(m["loss"]) == float(m0["loss"])  # the token loss is unchanged
    assert float(loss) == pytest.approx(float(loss0) + float(m["scaffold"]), rel=1e-6)
    assert 0.0 < float(m["scaffold"]) < 2 * 2.0  # 2 (1 - cos) per row, averaged


def test_design_refuses_models_it_cannot_hold() -> None:
    import attrs

    spec = agent_shape("llama").spec
    slow = attrs.evolve(spec, rope_freq_base=10_000.0)
    with pytest.raises(ValueError, match="RoPE base"):
        design(init_params(slow, seed=0), slow, _grounding())
