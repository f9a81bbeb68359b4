"""The agents' designed parts as one object: the lookup (``grounding``), the read-out
(``readout``), the word copy (``word_copy``), the typed flag (``typed_flag``), the label
copy (``label_copy``), the instruction flags (``instruction_flags``) and, when the recipe
asks for it, the menu flag (``menu_flag``), built from the recogniser's classes and the
recipe's seed.

One home for what the recipe designs into a fresh agent and keeps fixed in training, so the
base training and the done stage (``done_stage``) design and freeze the same slices.
Invariant: the class codes are ``codes.spread_codes(len(classes), KEY_DIMS, seed)`` — the
recogniser's own (``recogniser.train_recogniser`` draws them so, from the same seed) — so an
agent's designs can be rebuilt from the class names its ``recipe.json`` records, without
training the recogniser again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.agents import SUB_X_PIECES, SUB_Y_PIECES, TYPED_WORDS, X_PIECES, Y_PIECES
from runtime.train.cell_vision import KEY_DIMS, row_layout
from runtime.train.codes import spread_codes
from runtime.train.grounding import Grounding, design, frozen_lookup, piece_ids
from runtime.train.instruction_flags import (
    InstructionFlags, design_flags, frozen_flags, instruction_flags,
)
from runtime.train.label_copy import LabelCopy, design_label, frozen_label, label_copy
from runtime.train.menu_flag import MenuFlag, design_menu_flag, frozen_menu_flag
from runtime.train.optim import merge_masks
from runtime.train.readout import Readout, design_readout, frozen_readout
from runtime.train.typed_flag import TypedFlag, design_typed, frozen_typed, typed_flag
from runtime.train.word_copy import ASK_PIECES, WordCopy, design_copy, frozen_copy

__all__ = ["Designs", "agent_designs"]


@attrs.frozen(eq=False)
class Designs:
    """The designed parts of an agent of one vocabulary (module docstring)."""

    grounding: Grounding
    readout: Readout
    words: WordCopy
    typed: TypedFlag
    labels: LabelCopy
    seed: int
    #: the instruction flags (``instruction_flags``): designed into a trained base agent by
    #: the done stage when it asks for them, or by ``apply`` when ``flags_in_base``
    flags: InstructionFlags
    #: the menu flag (``menu_flag``; its projector must carry the menu read-out), or None
    menu: MenuFlag | None = None
    #: ``apply`` designs the instruction flags into the fresh agent and ``frozen`` keeps them
    #: (the base training learns to read them; the done stage then finds them designed)
    flags_in_base: bool = False

    def apply_flags(self, params: Mapping[str, np.ndarray], spec: TextSpec,
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``params`` (an agent with ``apply``'s designs) with the instruction flags, and
        the masks of what they add to keep fixed."""
        return design_flags(params, spec, self.flags), frozen_flags(params, spec, self.flags)

    def apply(self, params: Mapping[str, np.ndarray], spec: TextSpec) -> dict[str, np.ndarray]:
        """``params`` (a fresh agent's) with every design written in, in the order each
        needs: the read-out before the flags (x pieces get theirs), the label copy and the
        menu flag after the typed flag (they share that KV head)."""
        start = design(params, spec, self.grounding, seed=self.seed)
        start = design_readout(start, spec, self.readout)
        start = design_typed(design_copy(start, spec, self.words), spec, self.typed)
        start = design_label(start, spec, self.labels)
        if self.menu is not None:
            start = design_menu_flag(start, spec, self.menu)
        return design_flags(start, spec, self.flags) if self.flags_in_base else start

    def frozen(self, params: Mapping[str, np.ndarray], spec: TextSpec) -> dict[str, np.ndarray]:
        """Masks (1 = kept fixed in training) of every designed slice."""
        menu = [] if self.menu is None else [frozen_menu_flag(params, spec, self.menu)]
        flags = [frozen_flags(params, spec, self.flags)] if self.flags_in_base else []
        return merge_masks(frozen_lookup(params, spec, self.grounding),
                           frozen_copy(params, spec, self.words),
                           frozen_typed(params, spec, self.typed),
                           frozen_label(params, spec, self.labels),
                           frozen_readout(params, spec, self.readout), *menu, *flags)


def agent_designs(tokens: Sequence[str], classes: Sequence[str], n_embd: int, *, seed: int,
                  scaffold_weight: float, menu_flag: bool = False,
                  flags_in_base: bool = False, key_row: bool = False,
                  sub_cell: bool = False) -> Designs:
    """The designs for a vocabulary's ``tokens`` and the recogniser's ``classes`` (in its
    order), for agents ``n_embd`` wide; ``menu_flag``: with the menu flag; ``flags_in_base``:
    ``apply`` designs the instruction flags too; ``key_row``: the key row carries the text
    flag (``typed_flag.KEY_PIECES``) and the key pieces read the flags
    (``instruction_flags.KEY_READS``); ``sub_cell``: the sub-cell pieces are coordinates too
    (a vocabulary and projector made with them: ``agent_vocab(sub_cell=True)``)."""
    codes = spread_codes(len(classes), KEY_DIMS, seed)
    sub_x = piece_ids(tokens, SUB_X_PIECES) if sub_cell else ()
    sub_y = piece_ids(tokens, SUB_Y_PIECES) if sub_cell else ()
    grounding = Grounding(row_layout(n_embd, sub_cell=sub_cell),
                          {c: codes[i] for i, c in enumerate(classes)},
                          piece_ids(tokens, X_PIECES), piece_ids(tokens, Y_PIECES),
                          weight=scaffold_weight, x_sub_ids=sub_x, y_sub_ids=sub_y)
    words = WordCopy(grounding.layout, piece_ids(tokens, TYPED_WORDS),
                     piece_ids(tokens, ASK_PIECES), seed=seed)
    typed = typed_flag(tokens, words, seed=seed, key_row=key_row, sub_cell=sub_cell)
    labels = label_copy(tokens, grounding.layout, grounding.codes, typed.text_flag, seed=seed)
    menu = MenuFlag(grounding.layout) if menu_flag else None
    flags = instruction_flags(tokens, labels, key_row=key_row)
    readout = Readout(grounding.layout, grounding.x_ids, grounding.y_ids, sub_x, sub_y)
    taken = {*flags.dims, typed.typed, typed.text_flag, labels.label_flag, readout.kind_x,
             readout.kind_y, *range(words.code_dims.start, words.code_dims.stop)}
    if menu is not None and menu.dim in taken:  # RowLayout.menu's offset is fixed by hand
        raise ValueError(f"the menu dim {menu.dim} is one another design writes")
    return Designs(grounding, readout, words, typed, labels, seed, flags, menu, flags_in_base)
