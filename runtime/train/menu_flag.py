"""The designed *menu flag*: the rows that choose a verb or a coordinate know whether a
screenshot in the window shows the launcher menu open.

menu-launch's first two steps share the instruction and, but for the open menu, the screen:
the first clicks the menu button, the second the named app's entry.  Every recipe so far
answered both alike — the menu button again with the menu open, or the entry before it
opened (docs/training.md, "Menu entries as launchers, and three times the data") — and
teacher-forced, where it did ask for the entry the lookup found it: the agents did not read
"menu open" off the screen.  The recogniser names each cell's widget, not the screen's state,
and a menu entry's class says nothing to the rows that choose *which* class to ask for.  So
the state is carried to them by design (ordinary weights, kept fixed in training,
``frozen_menu_flag``):

* **the projector** writes, into the row layout's ``menu`` dim (``cell_vision.RowLayout``),
  a linear read-out of the recogniser's hidden units (``MenuReadout``) trained with the
  recogniser (``menu_loss``, a term of its loss) to say "this cell is part of the open
  menu" (its panel or an entry; ``menu_cells``): ``POS_SCALE`` there, 0 elsewhere.  Every
  text piece holds 0 in that dim and nothing writes it before the copy layer;
* **the typed flag's head** (``typed_flag``: its query is the *text* flag of the rows that
  choose a verb or a coordinate) also keys on the menu dim, in the head dim where it keys on
  the ask flag, so those rows attend to the open menu's cells as to a typed history line;
  a value row of its KV head past the label copy's and the instruction flags'
  (``VALUE_ROW``) reads the menu dim and the head's output column of that row writes it back
  into the same dim.  The flag is the attention's mass on menu cells: the full gain while a
  screenshot in the window shows the menu open, about 0 otherwise (cells off the menu hold
  the read-out's small residue; ask rows hold 0 in the menu dim, menu cells 0 in the ask
  flag, so neither flag forges the other; both present at once — a menu opened after
  typing — share the mass: no kind asks for that).

It is a window flag, not a newest-screenshot flag: after the entry's click the menu is gone
from the newest screenshot but still on the one before.  What it tells apart is the pair that
failed — the step before the menu opens from the step after; the layers after the copy layer
learn to read it, as they read the instruction flags.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.cell_features import CELL
from runtime.train.cell_vision import POS_SCALE, RowLayout
from runtime.train.grounding import first_head_of
from runtime.train.instruction_flags import FLAG_PIECES
from runtime.train.label_copy import CODE, writers_before_copy
from runtime.train.word_copy import copy_layer, match_dim
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import hit_in, widgets

__all__ = ["MENU_GAIN", "MenuFlag", "MenuReadout", "VALUE_ROW", "design_menu_flag",
           "frozen_menu_flag", "menu_cells", "menu_loss", "readout_errors"]

#: the menu's widgets that show on every screen (the button) or are not drawn (outside)
_NOT_OPEN_MENU = ("menu.button", "menu.outside")
#: the typed head's value row that carries the menu dim: past the ask flag (row 0), the
#: label code (``CODE`` rows) and the instruction flags
VALUE_ROW = 1 + CODE + len(FLAG_PIECES)
MENU_GAIN = 0.3  # value -> output: the flag's size in the residual (x2 under qwen35's gate)
#: the key's weight on the menu dim: how sharp the head is on menu cells (the ask flag's is
#: 1, a piece's flag being exact; a cell's read-out is not: sharp, the head would find the
#: few off-menu cells read highest on a screen without the menu)
KEY_GAIN = 0.3


def menu_cells(state: DeskState) -> np.ndarray:
    """[rows, cols] bool: the cells whose centre is part of the open menu (its panel or an
    entry); all False while the menu is closed."""
    lay = state.layout
    rows, cols = lay.height // CELL, lay.width // CELL
    out = np.zeros((rows, cols), bool)
    if not state.menu_open:
        return out
    ws = widgets(state)
    for r in range(rows):
        for c in range(cols):
            w = hit_in(ws, c * CELL + CELL // 2, r * CELL + CELL // 2)
            out[r, c] = (w is not None and w.name.startswith("menu.")
                         and w.name not in _NOT_OPEN_MENU)
    return out


@attrs.frozen(eq=False)
class MenuReadout:
    """``menu = gelu(f @ w0 + b0) @ w + b``: the projector's menu dim, over the recogniser's
    hidden units (``Recogniser.w0`` / ``b0``)."""

    w: np.ndarray = attrs.field(repr=False)
    b: float

    def values(self, hidden: np.ndarray) -> np.ndarray:
        return hidden @ self.w + self.b


def _hidden(w0: np.ndarray, b0: np.ndarray, features: np.ndarray) -> np.ndarray:
    """The recogniser's hidden units (tanh GELU, as ggml's) for features [n, 4E]."""
    return np.asarray(jax.nn.gelu(jnp.asarray(features @ w0 + b0)), np.float64)


def menu_loss(p: Mapping[str, jax.Array], hidden: jax.Array, menu: jax.Array) -> jax.Array:
    """The read-out's term of the recogniser's loss (``recogniser.train_recogniser``):
    squared error against ``POS_SCALE`` on menu cells and 0 elsewhere, in units of
    ``POS_SCALE``, the menu cells' mean and the others' mean added (so the ~5 % of cells
    that are a menu's count as much as the rest).  ``p["wm"]`` / ``p["bm"]``: the read-out;
    ``hidden [..., units]``, ``menu [...]`` (1.0 on a menu cell)."""
    err = ((hidden @ p["wm"] + p["bm"]) / POS_SCALE - menu) ** 2
    on = (err * menu).sum() / jnp.maximum(menu.sum(), 1.0)
    off = (err * (1.0 - menu)).sum() / jnp.maximum((1.0 - menu).sum(), 1.0)
    return on + off


def readout_errors(w0: np.ndarray, b0: np.ndarray, readout: MenuReadout,
                   features: np.ndarray, menu: np.ndarray) -> tuple[float, float]:
    """(share of menu cells read below ``POS_SCALE / 2``, share of other cells read above
    it) on ``features [..., 4E]`` / ``menu [...]``."""
    values = readout.values(_hidden(w0, b0, features.reshape(-1, features.shape[-1])))
    m = menu.reshape(-1)
    high = values > POS_SCALE / 2
    return float(np.mean(~high[m])) if m.any() else 0.0, float(np.mean(high[~m]))


@attrs.frozen(eq=False)
class MenuFlag:
    """The design's inputs: the row layout (whose ``menu`` dim the projector writes) and the
    typed flag's text flag (the query the head already has)."""

    layout: RowLayout
    text_flag: int

    @property
    def dim(self) -> int:
        return self.layout.menu


def design_menu_flag(params: Mapping[str, np.ndarray], spec: TextSpec, f: MenuFlag,
                     ) -> dict[str, np.ndarray]:
    """``params`` (with the typed flag and the label copy designed) with the menu flag
    (module docstring); ValueError if the value row or output column it needs is in use."""
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    pre = f"blk.{copy_layer(spec)}"
    k, v = p[f"{pre}.attn_k.weight"], p[f"{pre}.attn_v.weight"]
    o = p[f"{pre}.attn_output.weight"]
    head = first_head_of(spec, 1)  # the typed flag's head
    row, col = head.kv.start + VALUE_ROW, head.out.start + VALUE_ROW
    if row >= head.kv.stop or np.any(v[row]) or np.any(o[:, col]):
        raise ValueError("the typed head has no free value row / output column for the menu")
    p["token_embd.weight"][:, f.dim] = 0.0
    for name in writers_before_copy(spec):
        p[name][f.dim] = 0.0
    p[f"{pre}.attn_norm.weight"][f.dim] = 1.0
    k[head.kv.start + match_dim(spec), f.dim] = KEY_GAIN  # where it keys on the ask flag
    v[row, f.dim] = 1.0
    o[f.dim, col] = (2.0 if spec.is_hybrid else 1.0) * MENU_GAIN  # x2: the gate's 0.5
    return p


def frozen_menu_flag(params: Mapping[str, np.ndarray], spec: TextSpec, f: MenuFlag,
                     ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed) of the designed slices: every piece's menu dim, the earlier
    layers' writes there, the copy layer's input norm there; the head's key, value and
    output are ``frozen_typed``'s."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    masks["token_embd.weight"][:, f.dim] = 1.0
    for name in writers_before_copy(spec):
        masks[name][f.dim] = 1.0
    masks[f"blk.{copy_layer(spec)}.attn_norm.weight"][f.dim] = 1.0
    return masks
