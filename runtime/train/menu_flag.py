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
  the recogniser's menu read-out (``menu_readout``): ~``POS_SCALE`` on a cell of the open
  menu, ~0 elsewhere.  Every text piece holds 0 in that dim and nothing writes it before
  the copy layer;
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
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.cell_vision import RowLayout
from runtime.train.grounding import first_head_of
from runtime.train.instruction_flags import FLAG_PIECES
from runtime.train.label_copy import CODE, writers_before_copy
from runtime.train.word_copy import copy_layer, match_dim

__all__ = ["KEY_GAIN", "MENU_GAIN", "MenuFlag", "VALUE_ROW", "design_menu_flag",
           "frozen_menu_flag"]

#: the typed head's value row that carries the menu dim: past the ask flag (row 0), the
#: label code (``CODE`` rows) and the instruction flags
VALUE_ROW = 1 + CODE + len(FLAG_PIECES)
MENU_GAIN = 0.3  # value -> output: the flag's size in the residual (x2 under qwen35's gate)
#: the key's weight on the menu dim: how sharp the head is on menu cells (the ask flag's is
#: 1, a piece's flag being exact; a cell's read-out is not: sharp, the head would find the
#: few off-menu cells read highest on a screen without the menu)
KEY_GAIN = 0.3


@attrs.frozen(eq=False)
class MenuFlag:
    """The design's input: the row layout, whose ``menu`` dim the projector writes (the
    head's query is the typed flag's, already designed)."""

    layout: RowLayout

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
