"""The pure coordinate read-out (runtime/train/readout.py).

- Whatever values training gives the entries it may change (here: every one of them drawn
  at random, large), a prompt without a screenshot (or a history coordinate) leaves the
  column / row dims of every row's final hidden state exactly 0 and all x pieces' logits
  equal (bitwise), on both arches:
  no place can be preferred but through the lookup's copy of an image row's one-hot. The
  same perturbation of the model without the read-out does prefer places.
- With a screenshot's rows and a row asking for a class (its code in the query dims), the
  designed model's x pieces rank the named cell's column first, on both arches.
- The masks hold the design and only it: every frozen entry the read-out adds is one the
  design set, and what training may change it does not touch.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from runtime.train.agents import X_PIECES, Y_PIECES, agent_shape, agent_vocab
from runtime.train.cell_vision import POS_SCALE, row_layout
from runtime.train.grounding import Grounding, design, frozen_lookup, piece_ids
from runtime.train.model import Rows, forward, hidden_states
from runtime.train.optim import merge_masks
from runtime.train.params import init_params
from runtime.train.readout import KIND_READ, Readout, design_readout, frozen_readout

VOCAB = agent_vocab()
LAYOUT = row_layout(192)
X_IDS = piece_ids(VOCAB.tokens, X_PIECES)
Y_IDS = piece_ids(VOCAB.tokens, Y_PIECES)
READOUT = Readout(LAYOUT, X_IDS, Y_IDS)


def _grounding() -> Grounding:
    rng = np.random.default_rng(5)
    codes = rng.normal(size=(6, 36))
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    return Grounding(LAYOUT, {f"c{i}": c.astype(np.float32) for i, c in enumerate(codes)},
                     X_IDS, Y_IDS)


def _designed(arch: str, readout: bool) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    spec = agent_shape(arch).spec
    g = _grounding()
    params = design(init_params(spec, seed=0), spec, g)
    masks = [frozen_lookup(params, spec, g)]
    if readout:
        params = design_readout(params, spec, READOUT)
        masks.append(frozen_readout(params, spec, READOUT))
    return params, merge_masks(*masks)


def _trained_at_random(params: dict[str, np.ndarray], masks: dict[str, np.ndarray],
                       seed: int) -> dict[str, np.ndarray]:
    """Every entry training may change set at random (norm weights around 1)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, a in params.items():
        scale = 0.5 if a.ndim == 1 else 0.3
        draw = (1.0 if "norm" in name else 0.0) + scale * rng.normal(size=a.shape)
        out[name] = np.where(masks[name] > 0, a, draw).astype(np.float32)
    return out


def _rows(arch: str, tokens: list[int], images: np.ndarray | None = None) -> Rows:
    spec = agent_shape(arch).spec
    n_img = 0 if images is None else len(images)
    n = n_img + len(tokens)
    width = 4 if spec.is_hybrid else 1
    pos = np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)
    embeds = np.zeros((n, spec.n_embd), np.float32)
    if images is not None:
        embeds[:n_img] = images
    toks = np.zeros(n, np.int32)
    toks[n_img:] = tokens
    is_embed = np.arange(n) < n_img
    return Rows(jnp.asarray(toks), jnp.asarray(embeds), jnp.asarray(is_embed), jnp.asarray(pos),
                jnp.ones(n, bool))


def _prompt(seed: int) -> list[int]:
    """Text without a coordinate piece (a history line's ``click(304, 176)`` is a place in
    the prompt: its pieces' one-hots are there for the lookup to copy)."""
    rng = np.random.default_rng(seed)
    ordinary = [i for i, t in enumerate(VOCAB.tokens) if i not in set(X_IDS) | set(Y_IDS)]
    pieces = [VOCAB.tokens.index(p) for p in ("▁type(\"", "hello", "\"", ")", "<0x0A>")]
    return list(rng.choice(ordinary, size=60)) + pieces + [VOCAB.tokens.index("▁click(")]


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_without_a_screenshot_no_place_is_preferred(arch: str) -> None:
    spec = agent_shape(arch).spec
    cols = np.r_[LAYOUT.column.start:LAYOUT.column.stop, LAYOUT.row.start:LAYOUT.row.stop]
    for readout, seed in ((True, 1), (True, 2), (False, 1)):
        params, masks = _designed(arch, readout)
        p = {k: jnp.asarray(v) for k, v in _trained_at_random(params, masks, seed).items()}
        rows = _rows(arch, _prompt(seed))
        hidden = np.asarray(hidden_states(p, spec, rows))
        x_logits = np.asarray(forward(p, spec, rows))[:, list(X_IDS)]
        spread = x_logits.max(axis=1) - x_logits.min(axis=1)
        if readout:
            assert not hidden[:, cols].any()
            assert not spread.any()  # bitwise ties, every row
        else:
            assert spread.min() > 0.1  # the same weights without the design prefer places


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_lookup_alone_names_the_column(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, _ = _designed(arch, True)
    p = {k: jnp.asarray(v) for k, v in params.items()}
    g = _grounding()
    rng = np.random.default_rng(7)
    cells = []
    target, where = 3, (5, 13)
    for r in range(LAYOUT.rows):
        for c in range(LAYOUT.cols):
            cls = target if (r, c) == where else int(rng.choice([0, 1, 2, 4, 5]))
            h = np.zeros(spec.n_embd, np.float32)
            h[LAYOUT.key] = 3.0 * g.codes[f"c{cls}"]
            h[LAYOUT.column.start + c] = POS_SCALE
            h[LAYOUT.row.start + r] = POS_SCALE
            cells.append(h)
    ask = np.zeros(spec.n_embd, np.float32)
    ask[LAYOUT.query] = 6.0 * g.codes[f"c{target}"]
    images = np.stack(cells + [ask])
    logits = np.asarray(forward(p, spec, _rows(arch, [], images)))
    assert int(np.argmax(logits[-1, list(X_IDS)])) == where[1]


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_masks_hold_the_design_only(arch: str) -> None:
    spec = agent_shape(arch).spec
    params, _ = _designed(arch, True)
    masks = frozen_readout(params, spec, READOUT)
    assert set(masks) == set(params)
    cols = READOUT.coordinate_dims
    e, em = params["token_embd.weight"], masks["token_embd.weight"]
    # coordinate pieces: the one-hot and their kind dim, nothing else
    for ids, kind, dims in ((X_IDS, READOUT.kind_x, LAYOUT.column),
                            (Y_IDS, READOUT.kind_y, LAYOUT.row)):
        for i, tok in enumerate(ids):
            assert em[tok].all()
            want = np.zeros(spec.n_embd, np.float32)
            want[dims.start + i], want[kind] = POS_SCALE, KIND_READ
            assert np.array_equal(e[tok], want)
    others = np.setdiff1d(np.arange(len(e)), X_IDS + Y_IDS)
    assert em[np.ix_(others, cols)].all() and not e[np.ix_(others, cols)].any()
    assert not em[np.ix_(others, np.setdiff1d(np.arange(spec.n_embd), cols))].any()
    # writers: the coordinate rows only, zero there but the lookup heads' copy
    for name, m in masks.items():
        if name.endswith(("attn_output.weight", "ssm_out.weight", "ffn_down.weight")):
            assert m[cols].all() and not np.delete(m, cols, axis=0).any()
            copied = np.flatnonzero(params[name][cols].any(axis=0))
            hd, qh = spec.head_dim, spec.n_head // spec.n_head_kv
            assert set(copied) <= set(range(hd)) | set(range(hd * qh, hd * (qh + 1)))
    assert masks["output_norm.weight"][cols].all()
    assert masks["output_norm.weight"].sum() == len(cols)
