"""The pure coordinate read-out: which x and which y a click names comes from the designed
lookup alone (``grounding``), never from where widgets usually are.

Measured before it (thirteenth session, docs/training.md "The pure read-out"): on held-out
instances the trained hybrid's query at the lookup layer named the clicked widget's class at
97 % of the click rows (teacher-forced), and the recogniser's best cell for a launcher or the
menu button is of that class on nearly every screen, yet the first click missed on 17 of
the 70 held-out instances — at a few fixed places (``click(48, 368)`` on all five missed
menu-launch instances, whose menu button sat on the right). Every other part of the network
could write into the column / row dims the coordinate pieces are read from, and the
coordinate pieces' other dims were trained too: training learned a prior over places that
competed with the lookup's copy.

Designed (ordinary weights, kept fixed in training, ``frozen_readout``):

* every writer into the residual stream — attention outputs, Gated DeltaNet outputs, FFN
  down projections — holds 0 in the column and row dims, except the lookup's two heads,
  which copy the one-hots there (``grounding.design``);
* every piece's embedding holds 0 there, except the coordinate pieces' one-hots; image rows
  keep theirs (the projector's: what the lookup copies);
* the coordinate pieces hold 0 in every other dim too, except one *kind* dim (``kind_x``
  for the x pieces, ``kind_y`` for the y pieces, ``KIND_READ``): whether an x or a y comes
  next is the network's to say (it writes the kind dims, trained); which one, only the copy;
* the output norm's weights at the column and row dims stay at their start (a trained
  weight per column would be a prior again).

Apply it after ``grounding.design`` and before the word copy and the typed flag (which give
the x pieces a text flag of their own, kept by their masks).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.cell_vision import POS_SCALE, RowLayout
from runtime.train.grounding import first_head_of, residual_writers
from runtime.train.model import lookup_layer

__all__ = ["KIND_READ", "Readout", "design_readout", "frozen_readout"]

KIND_READ = POS_SCALE  # the coordinate pieces' kind dim: as large as their one-hot


@attrs.frozen(eq=False)
class Readout:
    """The design's inputs: the row layout and the x / y pieces' token ids."""

    layout: RowLayout
    x_ids: tuple[int, ...]
    y_ids: tuple[int, ...]
    #: the sub-cell pieces (``grounding.Grounding.x_sub_ids``), x ones and y ones
    x_sub_ids: tuple[int, ...] = ()
    y_sub_ids: tuple[int, ...] = ()

    @property
    def coordinate_dims(self) -> np.ndarray:
        """The column and row one-hots' dims, and the sub-cell dims (if any)."""
        lay = self.layout
        return np.r_[lay.column.start:lay.column.stop, lay.row.start:lay.row.stop,
                     lay.sub_x.start:lay.sub_x.stop, lay.sub_y.start:lay.sub_y.stop]

    @property
    def all_x(self) -> list[int]:
        return [*self.x_ids, *self.x_sub_ids]

    @property
    def all_y(self) -> list[int]:
        return [*self.y_ids, *self.y_sub_ids]

    @property
    def kind_x(self) -> int:
        # past the word codes, below the typed flag's two dims (typed_flag.TypedFlag)
        return self.layout.content.stop - 3

    @property
    def kind_y(self) -> int:
        return self.layout.content.stop - 4


def _lookup_columns(spec: TextSpec) -> np.ndarray:
    """The lookup layer's output columns of its two designed heads (``grounding.design``)."""
    h0, h1 = first_head_of(spec, 0), first_head_of(spec, 1)
    return np.r_[h0.out.start:h0.out.stop, h1.out.start:h1.out.stop]


def design_readout(params: Mapping[str, np.ndarray], spec: TextSpec, r: Readout,
                   ) -> dict[str, np.ndarray]:
    """``params`` (with ``grounding.design`` applied) with the pure read-out (module
    docstring)."""
    if "output.weight" in params:
        raise ValueError("the pure read-out needs the tied LM head (the agents' own)")
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    dims = r.coordinate_dims
    keep = _lookup_columns(spec)
    lookup_out = f"blk.{lookup_layer(spec)}.attn_output.weight"
    for name in residual_writers(spec):
        w = p[name]
        kept = w[np.ix_(dims, keep)].copy() if name == lookup_out else None
        w[dims, :] = 0.0
        if kept is not None:
            w[np.ix_(dims, keep)] = kept
    e = p["token_embd.weight"]
    lay = r.layout
    x_ids, y_ids = r.all_x, r.all_y
    # each piece keeps the design's values (grounding) in its own dims only: a cell centre
    # its one-hot, a sub-cell piece its one-hot and its sub-cell dim
    own = [(list(r.x_ids), lay.column), (list(r.y_ids), lay.row),
           (list(r.x_sub_ids), lay.column), (list(r.x_sub_ids), lay.sub_x),
           (list(r.y_sub_ids), lay.row), (list(r.y_sub_ids), lay.sub_y)]
    kept = [e[ids, part].copy() for ids, part in own]
    e[:, dims] = 0.0
    e[x_ids + y_ids, :] = 0.0
    for (ids, part), values in zip(own, kept, strict=True):
        e[ids, part] = values
    e[x_ids, r.kind_x] = KIND_READ
    e[y_ids, r.kind_y] = KIND_READ
    return p


def frozen_readout(params: Mapping[str, np.ndarray], spec: TextSpec, r: Readout,
                   ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed) of the designed slices: the writers' rows at the column / row
    dims, every piece's embedding there, the coordinate pieces' whole embeddings, the output
    norm's weights there."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    dims = r.coordinate_dims
    for name in residual_writers(spec):
        masks[name][dims, :] = 1.0
    e = masks["token_embd.weight"]
    e[:, dims] = 1.0
    e[r.all_x + r.all_y, :] = 1.0
    masks["output_norm.weight"][dims] = 1.0
    return masks

