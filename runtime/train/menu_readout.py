"""The recogniser's *menu read-out*: which cells of a screen are part of the open launcher
menu — what the menu flag (``menu_flag``) carries from the projector to the text model.

A linear read-out of the recogniser's hidden units (``MenuReadout``; the merger writes it
into the row layout's ``menu`` dim, ``cell_vision``), trained with the recogniser as a term
of its loss (``menu_loss``) to say ``POS_SCALE`` on a cell of the open menu (its panel or an
entry: ``menu_cells``) and 0 elsewhere.  Fitted afterwards by least squares on the trained
units instead, it read 1.4 % of other held-out cells as menu (trained with them: 0.65 %;
docs/training.md, "The menu flag").  A cell's pixels cannot say whether a menu is open
elsewhere on the screen, so only the menu's own cells are marked.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from runtime.train.cell_features import CELL, POS_SCALE
from runtime.train.cell_labels import cell_classes
from vmenv.simdesk.state import DeskState

__all__ = ["MenuReadout", "menu_cells", "menu_loss", "readout_errors"]

#: the menu's widgets that show on every screen (the button) or are not drawn (outside)
_NOT_OPEN_MENU = ("menu.button", "menu.outside")


def menu_cells(state: DeskState) -> np.ndarray:
    """[rows, cols] bool: the cells whose centre is part of the open menu (its panel or an
    entry); all False while the menu is closed.  Read off ``cell_classes`` with the menu's
    own class names (``entries="menu"``), whatever the recipe classes entries as."""
    if not state.menu_open:
        lay = state.layout
        return np.zeros((lay.height // CELL, lay.width // CELL), bool)
    return np.vectorize(lambda c: c.startswith("menu.") and c not in _NOT_OPEN_MENU,
                        otypes=[bool])(cell_classes(state, "menu"))


@attrs.frozen(eq=False)
class MenuReadout:
    """``menu = gelu(f @ w0 + b0) @ w + b``: the projector's menu dim, over the recogniser's
    hidden units (``Recogniser.w0`` / ``b0``)."""

    w: np.ndarray = attrs.field(repr=False)
    b: float

    def values(self, hidden: np.ndarray) -> np.ndarray:
        """The menu dim for the recogniser's hidden units ``[..., units]``."""
        return hidden @ self.w + self.b


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


def readout_errors(readout: MenuReadout, hidden: np.ndarray, menu: np.ndarray,
                   ) -> tuple[float, float]:
    """(share of menu cells read below ``POS_SCALE / 2``, share of other cells read above
    it) by ``readout`` on the recogniser's ``hidden [..., units]`` (``Recogniser.
    hidden_units``) of cells ``menu [...]``."""
    values = readout.values(hidden).reshape(-1)
    m = menu.reshape(-1)
    high = values > POS_SCALE / 2
    return float(np.mean(~high[m])) if m.any() else 0.0, float(np.mean(high[~m]))
