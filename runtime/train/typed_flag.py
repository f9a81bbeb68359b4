"""The designed *typed* flag: the rows that choose a verb or a coordinate know whether a history
line already typed.

What an agent does next after typing its word is a click (save-note's Save, switch-window's
next step), never typing again; trained alone, the agents did not learn that from the history
(docs/training.md: the verb after a typed step was wrong on every training example, whatever
the cue).  The history says it in one token: with the agents' vocabulary the system prompt's
own ``, type("`` is a piece of its own, so ``▁type("`` occurs only where a ``Step i:`` line
shows a typed step.  Its row carries the word copy's *ask* flag (``word_copy``).

Designed (ordinary weights, kept fixed in training, ``frozen_typed``):

* the pieces at the rows that choose an action's verb and coordinates (``QUERY_PIECES``:
  the newline, which ends the assistant header — and every other line —, ``click(``, the x
  pieces) carry a *text* flag (``text_flag`` dim; every other piece holds 0 there).
  Measured: the flag on *every* piece gave every text row a shared constant and the agents
  lost the single-step kinds (docs/training.md "The typed flag");
* the first attention layer's second KV head (its first query head): the query reads the
  text flag, the key the ask flag, in one position-free head dim, so those rows attend to
  the ``type("`` rows before them; the value reads the ask flag, the output writes it into
  the ``typed`` dim.  Rows without an ask flag hold little there (an untrained, O(1)
  value against the flag's ~12 after the norm), so the output is about the attention
  *mass* on typed rows: the full gain after a typed line, a fraction of it before (a
  presence detector, no sink needed; measured in ``tests/test_typed_flag.py``); the match
  is the word copy's (``word_copy.match_flags``);
* the verb pieces' embeddings at the ``typed`` dim start at ``click(`` positive, ``type("``
  negative, so the tied head reads the flag as "click, do not type again" — a start, not a
  rule: that column and the output norm are trained (a wrong word typed is retyped, and
  with the read-out fixed the agent could never type again after an early, lost ``type(``;
  measured in docs/training.md).

The response's own ``type("`` row sees itself, but that is after its verb was chosen.

With ``key_row`` the response's ``press("`` (``KEY_PIECES``: the row that chooses the key)
carries the text flag too, so it reads what the verb rows read — the typed flag and, through
the label head, the instruction flags (`` Enter`` asked).  Measured: with the flag there alone
the agents still pressed backspace after menu-launch's Terminal word; with the ``enter``
piece's read-out of the Enter flag beside it (``instruction_flags.KEY_READS``) they press
enter (docs/training.md, "The key row").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.agents import SUB_X_PIECES, X_PIECES
from runtime.train.cell_vision import POS_SCALE, RowLayout
from runtime.train.grounding import first_head_of, piece_ids
from runtime.train.word_copy import ASK_PIECES, WordCopy, copy_layer, match_flags

__all__ = ["CLICK_PIECES", "KEY_PIECES", "QUERY_PIECES", "TypedFlag", "design_typed",
           "frozen_typed", "typed_flag"]

#: the pieces the flag reads as "click next" (``ASK_PIECES``, ``type("``, as "not type")
CLICK_PIECES = ("click(", " click(")
#: the pieces whose rows ask whether a line typed: the assistant header's closing newline
#: (the verb's row), ``click(`` (x's row), the x pieces (y's row)
QUERY_PIECES = ("<0x0A>", *CLICK_PIECES, *X_PIECES)
#: the row that chooses a pressed key: the response's ``press("`` (a history line's is
#: `` press("``, another piece, left without the flag)
KEY_PIECES = ('press("',)

FLAG_GAIN = 1.0  # the text-flag query's scale (llama; qwen35's q/k norms set the sharpness)
TYPED_GAIN = 0.3  # value -> output: the flag's size in the residual (x2 under qwen35's gate)
VERB_READ = 1.5  # the verb pieces' embedding at the typed dim (+click, -type)


@attrs.frozen(eq=False)
class TypedFlag:
    """The design's inputs: the row layout (the last two content dims, past the word codes,
    hold the typed and text flags), the ask flag's dim (``WordCopy.ask_flag``), the pieces
    read as "click" and as "type" after a typed step, the pieces that carry the text flag."""

    layout: RowLayout
    ask_flag: int
    click_ids: tuple[int, ...]
    type_ids: tuple[int, ...]
    query_ids: tuple[int, ...]
    seed: int = 0

    @property
    def text_flag(self) -> int:
        return self.layout.content.stop - 1

    @property
    def typed(self) -> int:
        return self.layout.content.stop - 2


def typed_flag(tokens: Sequence[str], words: WordCopy, seed: int = 0, *,
               key_row: bool = False, sub_cell: bool = False) -> TypedFlag:
    """The agents' typed flag for a vocabulary's ``tokens`` and their word copy;
    ``key_row``: the key row carries the text flag too (module docstring); ``sub_cell``:
    the sub-cell x pieces are x pieces too (``agents.SUB_X_PIECES``)."""
    query = QUERY_PIECES + (SUB_X_PIECES if sub_cell else ()) + (KEY_PIECES if key_row else ())
    return TypedFlag(words.layout, words.ask_flag, piece_ids(tokens, CLICK_PIECES),
                     piece_ids(tokens, ASK_PIECES), piece_ids(tokens, query), seed=seed)


def design_typed(params: Mapping[str, np.ndarray], spec: TextSpec, t: TypedFlag,
                 ) -> dict[str, np.ndarray]:
    """``params`` with the designed typed flag (module docstring); ValueError for a model
    with one KV head."""
    if spec.n_head_kv < 2:
        raise ValueError("the typed flag needs a second KV head in the copy layer")
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    rng = np.random.default_rng(t.seed + 2)
    e = p["token_embd.weight"]
    e[:, t.text_flag] = 0.0
    e[list(t.query_ids), t.text_flag] = POS_SCALE
    e[:, t.typed] = 0.0
    e[list(t.click_ids), t.typed] = VERB_READ
    e[list(t.type_ids), t.typed] = -VERB_READ
    layer = copy_layer(spec)
    pre = f"blk.{layer}"
    q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
    v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
    head = first_head_of(spec, 1)  # the first query head of KV head 1
    qs, kv, out = head.q, head.kv, head.out
    q[qs], k[kv], v[kv], o[:, out] = 0.0, 0.0, 0.0, 0.0
    match_flags(p, spec, layer, qs.start, kv.start, t.text_flag, t.ask_flag, FLAG_GAIN, rng)
    v[kv.start, t.ask_flag] = 1.0
    o[t.typed, out.start] = (2.0 if spec.is_hybrid else 1.0) * TYPED_GAIN  # x2: gate's 0.5
    return p


def frozen_typed(params: Mapping[str, np.ndarray], spec: TextSpec, t: TypedFlag,
                 ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed) of the designed slices: the head's q (with qwen35's gate rows),
    its KV head's k and v, its output columns, the layer's q/k norms and its input norm at
    the two flags, and every piece's text flag (the typed column is the read-out: trained)."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    pre = f"blk.{copy_layer(spec)}"
    head = first_head_of(spec, 1)  # the first query head of KV head 1
    qs, kv, out = head.q, head.kv, head.out
    masks[f"{pre}.attn_q.weight"][qs] = 1.0
    masks[f"{pre}.attn_k.weight"][kv] = 1.0
    masks[f"{pre}.attn_v.weight"][kv] = 1.0
    masks[f"{pre}.attn_output.weight"][:, out] = 1.0
    for norm in ("attn_q_norm", "attn_k_norm"):
        if f"{pre}.{norm}.weight" in masks:
            masks[f"{pre}.{norm}.weight"][:] = 1.0
    masks[f"{pre}.attn_norm.weight"][[t.text_flag, t.ask_flag]] = 1.0
    masks["token_embd.weight"][:, t.text_flag] = 1.0
    return masks
