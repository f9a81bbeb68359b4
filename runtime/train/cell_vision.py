"""The agents' cell projector: every image row says, in dimensions of its own, *which widget*
its 32x32 cell is, *where* the cell is, and what it looks like.

A ``qwen3vl_merger`` GGUF like any other (mtmd runs it): the designed front of
``cell_features`` (conv, position grid, identity ViT block, post-LayerNorm), then a merger
whose hidden layer has three parts, each exact in llama.cpp's arithmetic:

* the **recogniser** (``recogniser.py``): its GELU units and their projection to the row's
  ``key`` dims;
* **steps**: per cell boundary b (between columns, between rows), the pair of units
  ``S (p − b)`` and ``S (p − b) − 1`` with p the cell's index read linearly off the position
  features (``position_readout``); their GELUs differ by exactly 1 past the boundary and 0
  before it (ggml's GELU is the identity from 10 and 0 below −10, and |S (p − b)| ≥ S / 2 − ε
  with S = 40), so ``mm.2`` writes the column's and the row's one-hot as differences of
  adjacent steps;
* **content**: a fixed random projection of the luminance and colour features, shifted by
  +20 into GELU's identity range and shifted back by ``mm.2``'s bias.

Row layout (``RowLayout``): ``key`` | column one-hot | row one-hot | content | ``query``
(zero in image rows: where the text model's lookup query lives); with the menu flag
(``menu_flag``) one content dim (``RowLayout.menu``) holds its read-out of the recogniser's
units instead of content. The merger's weights are
kept in f32 so the designed values are exact. The position one-hots are exact on the screen
the projector is made for (640x384: 20 x 12 cells); another image size gets, per cell, the
one-hot of the designed cell at the same relative place.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import numpy as np

from cachepolicy.engine.vision import POSITION_FEATURES_KEY
from cachepolicy.forge import TextSpec
from cachepolicy.forge.mmproj import mmproj_plans, write_mmproj
from cachepolicy.forge.specs import VisionSpec
from cachepolicy.forge.writer import TensorPlan, given
from runtime.train.cell_features import (CELL, MERGED_FEATURES, PATCH, POS_SCALE, SIGMA,
                                         VISION_EMBD, content_mask, patch_kernel,
                                         position_grid, position_readout, unit_readout)
from runtime.train.agents import AGENT_SCREEN

if TYPE_CHECKING:
    from runtime.train.recogniser import Recogniser
    from runtime.train.sub_readout import SubReadout

__all__ = ["RowLayout", "cell_vision_spec", "row_layout", "width", "write_cell_mmproj"]

STEEPNESS = 40.0
SHIFT = 20.0
CONTENT_SCALE = 0.3
KEY_DIMS = 36
MENU_FROM_END = 8  # RowLayout.menu: the content dim this far from the content's end
SUB_SCALE = POS_SCALE  # the sub-cell read-out's value (about -1, 0, 1) times this


@attrs.frozen
class RowLayout:
    """Where each part of an image row lives in the text model's ``n_embd`` dims."""

    n_embd: int
    cols: int
    rows: int
    key: slice
    column: slice
    row: slice
    content: slice
    query: slice
    #: the sub-cell read-out's value per column / row (``sub_readout``; empty without it)
    sub_x: slice = slice(0, 0)
    sub_y: slice = slice(0, 0)

    @property
    def menu(self) -> int:
        """The content dim the menu flag's projector writes (``menu_flag``): below the text
        side's flags (typed and text flag, the read-out's kind dims, the instruction
        flags), where text pieces hold 0."""
        return self.content.stop - MENU_FROM_END


def row_layout(n_embd: int, screen: tuple[int, int] = AGENT_SCREEN,
               sub_cell: bool = False) -> RowLayout:
    """The layout for a text model ``n_embd`` wide on ``screen`` (ValueError if too narrow);
    ``sub_cell``: with the sub-cell read-out's dims (one per column, one per row) after the
    row one-hot, taken from the content."""
    cols, rows = screen[0] // CELL, screen[1] // CELL
    sub = (cols + rows) if sub_cell else 0
    content = n_embd - 2 * KEY_DIMS - cols - rows - sub
    if content < 8:
        raise ValueError(f"a text model {n_embd} wide has no room for a {cols}x{rows} cell "
                         f"row layout (needs >= {2 * KEY_DIMS + cols + rows + sub + 8})")
    c0 = KEY_DIMS + cols + rows
    s0 = c0 + sub
    return RowLayout(n_embd, cols, rows, slice(0, KEY_DIMS), slice(KEY_DIMS, KEY_DIMS + cols),
                     slice(KEY_DIMS + cols, c0), slice(s0, s0 + content),
                     slice(s0 + content, n_embd),
                     slice(c0, c0 + cols) if sub_cell else slice(c0, c0),
                     slice(c0 + cols, s0) if sub_cell else slice(c0, c0))


def _hidden_size(rec: Recogniser, lay: RowLayout) -> int:
    gates = 2 * rec.sub.units * (lay.cols + lay.rows) if rec.sub is not None else 0
    return rec.hidden + 2 * (lay.cols + 1) + 2 * (lay.rows + 1) + width(lay.content) + gates


def width(part: slice) -> int:
    """How many dims a part of a ``RowLayout`` spans."""
    return part.stop - part.start


def cell_vision_spec(spec: TextSpec, rec: Recogniser) -> VisionSpec:
    lay = row_layout(spec.n_embd, sub_cell=rec.sub is not None)
    return VisionSpec(projector="qwen3vl_merger", image_size=512, patch_size=PATCH,
                      n_embd=VISION_EMBD, n_ff=32, n_layer=1, n_head=2,
                      projection_dim=spec.n_embd, pos_side=64,
                      merger_hidden=_hidden_size(rec, lay))


def _steps(w0: np.ndarray, b0: np.ndarray, w2: np.ndarray, start: int, axis: str, n: int,
           n_patches: int, out: slice) -> int:
    """Step units for ``n`` cells along ``axis`` from hidden unit ``start``; returns the next
    free unit.  One-hot of cell c = step(c − ½) − step(c + ½); step(b) = g(u1) − g(u2)."""
    w, b = position_readout(axis, n_patches)
    for k in range(n + 1):
        boundary = k - 0.5
        u1, u2 = start + 2 * k, start + 2 * k + 1
        w0[:, u1], b0[u1] = STEEPNESS * w, STEEPNESS * (b - boundary)
        w0[:, u2], b0[u2] = STEEPNESS * w, STEEPNESS * (b - boundary) - 1.0
        for c, sign in ((k, 1.0), (k - 1, -1.0)):  # step k opens cell k, closes cell k - 1
            if 0 <= c < n:
                w2[out.start + c, u1] += sign * POS_SCALE
                w2[out.start + c, u2] -= sign * POS_SCALE
    return start + 2 * (n + 1)


def _sub_gates(w0: np.ndarray, b0: np.ndarray, w2: np.ndarray, b2: np.ndarray, start: int,
               sub: SubReadout, axis: int, n: int, n_patches: int, steps: int,
               out: slice) -> int:
    """The sub-cell read-out's ``axis`` (0: x, 1: y) value, written into ``out``'s dim c
    only on a cell of column / row c: ``SUB_SCALE (gelu(z) @ w2 + b2) [p = c]``.  Per unit
    z and cell c, the pair ``gelu(z + G)`` and ``gelu(z + G + β)`` with ``G = S (c − p)``
    (``unit_readout``: exactly 0 at p = c), ``S = 24 + 2 Z`` and ``β = −(12 + Z)``, Z the
    read-out's bound on |z|: for p < c both are the identity and differ by −β, at p = c the
    first is gelu(z) and the second 0, for p > c both 0 — so their difference, with β
    added back where p < c (``1 − step_c``, from the exact step units at ``steps``), is
    ``gelu(z) [p = c]``, exact in ggml's GELU (the identity from 10, 0 below −10).
    Returns the next free unit."""
    k_units = sub.units
    z_w = sub.w0[:, axis * k_units:(axis + 1) * k_units].astype(np.float64)
    z_b = sub.b0[axis * k_units:(axis + 1) * k_units].astype(np.float64)
    read = sub.w2[axis * k_units:(axis + 1) * k_units, axis].astype(np.float64)
    bias = float(sub.b2[axis])
    slope, beta = 24.0 + 2.0 * sub.bound, -(12.0 + sub.bound)
    w_p, b_p = position_readout("xy"[axis], n_patches)
    one = unit_readout()
    at = start
    for c in range(n):
        gate = slope * ((c - b_p) * one - w_p)
        for k in range(k_units):
            w0[:, at], b0[at] = z_w[:, k] + gate, z_b[k]
            w0[:, at + 1], b0[at + 1] = z_w[:, k] + gate, z_b[k] + beta
            w2[out.start + c, at] += SUB_SCALE * read[k]
            w2[out.start + c, at + 1] -= SUB_SCALE * read[k]
            at += 2
        # + β Σ read where p < c:  β Σ read (1 − step_c)
        fix = SUB_SCALE * beta * read.sum()
        b2[out.start + c] += fix
        u1, u2 = steps + 2 * c, steps + 2 * c + 1
        w2[out.start + c, u1] -= fix
        w2[out.start + c, u2] += fix
        # + bias [p = c]:  bias (step_c − step_{c+1})
        for u, sign in ((u1, 1.0), (u2, -1.0), (u1 + 2, -1.0), (u2 + 2, 1.0)):
            w2[out.start + c, u] += sign * SUB_SCALE * bias
    return at


def _merger(rec: Recogniser, lay: RowLayout, seed: int) -> dict[str, np.ndarray]:
    hidden = _hidden_size(rec, lay)
    w0 = np.zeros((MERGED_FEATURES, hidden), np.float64)  # x @ w0 (numpy order transposed)
    b0 = np.zeros(hidden, np.float64)
    w2 = np.zeros((lay.n_embd, hidden), np.float64)
    b2 = np.zeros(lay.n_embd, np.float64)
    h = rec.hidden
    w0[:, :h], b0[:h] = rec.w0, rec.b0
    w2[lay.key, :h], b2[lay.key] = rec.w2.T, rec.b2
    x_steps = h
    y_steps = _steps(w0, b0, w2, x_steps, "x", lay.cols, 2 * lay.cols, lay.column)
    at = _steps(w0, b0, w2, y_steps, "y", lay.rows, 2 * lay.rows, lay.row)
    n_content = width(lay.content)
    read = content_mask()
    rng = np.random.default_rng(seed)
    proj = np.zeros((MERGED_FEATURES, n_content))
    proj[read] = rng.normal(0.0, read.sum() ** -0.5, (read.sum(), n_content)) * SIGMA
    w0[:, at:at + n_content], b0[at:at + n_content] = proj, SHIFT
    w2[lay.content, at:at + n_content] = CONTENT_SCALE * np.eye(n_content)
    b2[lay.content] = -CONTENT_SCALE * SHIFT
    at += n_content
    if rec.sub is not None:  # after every other unit: those stay where they were
        at = _sub_gates(w0, b0, w2, b2, at, rec.sub, 0, lay.cols, 2 * lay.cols, x_steps,
                        lay.sub_x)
        at = _sub_gates(w0, b0, w2, b2, at, rec.sub, 1, lay.rows, 2 * lay.rows, y_steps,
                        lay.sub_y)
    assert at == hidden
    if rec.menu is not None:  # the menu dim reads the recogniser's units instead of content
        w2[lay.menu, :], b2[lay.menu] = 0.0, rec.menu.b
        w2[lay.menu, :h] = rec.menu.w
    return {"mm.0.weight": w0.T.astype(np.float32), "mm.0.bias": b0.astype(np.float32),
            "mm.2.weight": w2.astype(np.float32), "mm.2.bias": b2.astype(np.float32)}


def _plan_values(plan: TensorPlan, designed: dict[str, np.ndarray]) -> TensorPlan:
    if plan.name in designed:
        return given(attrs.evolve(plan, force_f32=True), designed[plan.name])
    shape = tuple(reversed(plan.dims))
    if plan.name.endswith(("ln1.weight", "ln2.weight", "post_ln.weight")):
        return given(plan, np.ones(shape, np.float32))
    # the second temporal kernel, the patch bias, the ViT block's projections: zero
    return given(plan, np.zeros(shape, np.float32))


def write_cell_mmproj(spec: TextSpec, path: str | Path, rec: Recogniser, *,
                      seed: int = 0) -> Path:
    """Write the cell projector for ``spec`` with recogniser ``rec`` to ``path``
    (deterministic in ``rec`` and ``seed``); a recogniser trained with the menu read-out
    (``Recogniser.menu``) writes it into the layout's ``menu`` dim (``menu_flag``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    vspec = cell_vision_spec(spec, rec)
    designed = {"v.patch_embd.weight": patch_kernel(),
                "v.position_embd.weight": position_grid(),
                **_merger(rec, row_layout(spec.n_embd, sub_cell=rec.sub is not None), seed)}
    plans = [_plan_values(p, designed) for p in mmproj_plans(vspec)]
    write_mmproj(vspec, path, seed, plans, name="kvagent-cell-mmproj",
                 flags=(POSITION_FEATURES_KEY,))
    return path
