"""The designed *instruction flags*: the rows that choose a verb know what the instruction asks
for beyond its first action — a Save to click, a menu to open, an Enter to press.

Taught to say ``done()``, the agents ended episodes where the instruction still asked for more:
the position-free llama agent said ``done()`` right after typing where save-note and
switch-window must still click Save, the hybrid said it once menu-launch's menu was open
(docs/training.md, "The done stage").  In the agents' vocabulary three instruction words are
pieces of their own that occur in exactly the instructions that ask for that step
(``FLAG_PIECES``: `` Save`` in save-note, switch-window, remember-code and marked-launch;
`` menu`` in menu-launch; `` Enter`` in menu-launch's Terminal variant — a dialog label is
``Save"``, another piece), so the flag is one token to carry to the verb's row.

Designed on top of the label copy (``label_copy``; ordinary weights, kept fixed in training,
``frozen_flags``):

* each flag piece carries the label copy's *label* flag (so the label head's query, the text
  flag of the rows that choose a verb or a coordinate, attends to it as to a label piece) and
  its own flag dim (``InstructionFlags.dims``: three content dims below the read-out's kind
  dims); every other piece holds 0 in those dims and nothing writes them before the copy layer;
* the label head's value rows past the label code (``label_copy.CODE``) read the three flag
  dims and its output columns write them back into the same dims: a text row after an
  instruction with `` Save`` carries the save flag.  Label pieces and the read-out's x pieces
  (whose kind dim is the label flag) hold 0 there, so they dilute a flag but never forge one;
  without a flag piece the head writes 0 there.

Nothing reads the flags by design: the layers after the copy layer learn to (the done stage
trains them), as the verb after a flag depends on the history too (after Save is asked, the
step after typing clicks, the step after the Save click says ``done()``) — but for the key
read-outs (``KEY_READS``, with ``key_row``): the tied head cannot read a flag dim itself (the
whole column is kept fixed at 0 but for the flag pieces), so the ``enter`` piece's embedding
starts at ``KEY_READ`` in the ` Enter` flag's dim and is trained, as the typed flag's verb
read-out is: at the row that chooses a key (``typed_flag.KEY_PIECES``) ``press("enter")`` is
then favoured where Enter is asked and nowhere else.  Measured: with the flag at that row but
no read-out, after 2000 updates (27 Enter demonstrations) the ``enter`` logit stood only 0.4
higher with Enter asked than without, below ``backspace`` either way, and every Terminal word
was followed by backspace (docs/training.md, "The key row").

Applied by the done stage to a trained base agent (``DoneStage.instruction_flags``): the flag
dims' trained embedding columns and writers' rows are overwritten, which the stage's updates
absorb.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.cell_vision import POS_SCALE
from runtime.train.grounding import piece_ids
from runtime.train.label_copy import CODE, COPY_GAIN, LabelCopy, label_head, writers_before_copy
from runtime.train.word_copy import copy_layer

__all__ = ["FLAG_PIECES", "KEY_READS", "InstructionFlags", "design_flags", "frozen_flags",
           "instruction_flags"]

#: the instruction words flagged, each a piece of the agents' vocabulary, in flag-dim order
FLAG_PIECES = (" Save", " menu", " Enter")
FLAG_GAIN = 2.0  # value -> output, against the label copy's COPY_GAIN: a flag is one dim
#: (key piece, the flag it reads): the key read-outs ``key_row`` designs
KEY_READS = (("enter", " Enter"),)
KEY_READ = 1.5  # the key piece's embedding at its flag's dim (the typed flag's VERB_READ)


@attrs.frozen(eq=False)
class InstructionFlags:
    """The design's inputs: the label copy it extends, the flag pieces' token ids and the key
    read-outs, ``(key piece id, index of the flag it reads)`` (empty without ``key_row``)."""

    labels: LabelCopy
    flag_ids: tuple[int, ...]
    key_reads: tuple[tuple[int, int], ...] = ()

    @property
    def dims(self) -> tuple[int, ...]:
        """The flag dims: below the read-out's two kind dims (``readout.Readout``) and the
        typed flag's two (``typed_flag.TypedFlag``)."""
        stop = self.labels.layout.content.stop
        return tuple(stop - 5 - i for i in range(len(self.flag_ids)))

    def value_rows(self, spec: TextSpec) -> range:
        """The label head's KV-head rows that carry the flags (past the label code)."""
        start = label_head(spec).kv.start + 1 + CODE
        return range(start, start + len(self.flag_ids))

    def output_columns(self, spec: TextSpec) -> range:
        start = label_head(spec).out.start + 1 + CODE
        return range(start, start + len(self.flag_ids))


def instruction_flags(tokens: Sequence[str], labels: LabelCopy, *,
                      key_row: bool = False) -> InstructionFlags:
    """The agents' instruction flags for a vocabulary's ``tokens`` (``key_row``: with the key
    read-outs); ValueError if a flag word or a key is not one piece."""
    reads = tuple((piece_ids(tokens, [key])[0], FLAG_PIECES.index(flag))
                  for key, flag in KEY_READS) if key_row else ()
    return InstructionFlags(labels, piece_ids(tokens, FLAG_PIECES), reads)


def design_flags(params: Mapping[str, np.ndarray], spec: TextSpec, f: InstructionFlags,
                 ) -> dict[str, np.ndarray]:
    """``params`` (with the label copy designed) with the instruction flags (module
    docstring); ValueError if the label head's rows or columns they need are in use."""
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    pre = f"blk.{copy_layer(spec)}"
    v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
    rows, cols, dims = list(f.value_rows(spec)), list(f.output_columns(spec)), list(f.dims)
    if rows[-1] >= label_head(spec).kv.stop or np.any(v[rows]) or np.any(o[:, cols]):
        raise ValueError("the label head has no free value rows / output columns for the flags")
    e = p["token_embd.weight"]
    e[:, dims] = 0.0
    for tok, dim in zip(f.flag_ids, dims):
        e[tok, dim] = POS_SCALE
        e[tok, f.labels.label_flag] = POS_SCALE
    for tok, flag in f.key_reads:
        e[tok, dims[flag]] = KEY_READ
    for name in writers_before_copy(spec):
        p[name][dims] = 0.0
    p[f"{pre}.attn_norm.weight"][dims] = 1.0
    gain = (2.0 if spec.is_hybrid else 1.0) * COPY_GAIN * FLAG_GAIN  # x2: the gate's 0.5
    for row, col, dim in zip(rows, cols, dims):
        v[row, dim] = 1.0
        o[dim, col] = gain
    return p


def frozen_flags(params: Mapping[str, np.ndarray], spec: TextSpec, f: InstructionFlags,
                 ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed) of the designed slices: every piece's flag dims (and the flag
    pieces' label flag, which ``frozen_label`` keeps for every piece), the earlier layers'
    writes there, the copy layer's input norm there; the label head's value rows and output
    columns are ``frozen_label``'s.  The key read-outs are trained (a start, not a rule)."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    dims = list(f.dims)
    masks["token_embd.weight"][:, dims] = 1.0
    for tok, flag in f.key_reads:
        masks["token_embd.weight"][tok, dims[flag]] = 0.0
    for name in writers_before_copy(spec):
        masks[name][dims] = 1.0
    masks[f"blk.{copy_layer(spec)}.attn_norm.weight"][dims] = 1.0
    return masks
