"""The designed *label copy*: dialog-button's instruction names a button by its label, and the
rows that ask the lookup for a cell start out asking for that button's class.

Trained alone, the agents learnt the label -> button map from ~16 examples per label and got
it wrong (asked for "Apply" they clicked Open, Close or Save) while the lookup itself found
the named button on 20 of 20 clicks (docs/training.md "Chains and the dialog labels").  The
map is a table, so it is designed (ordinary weights, kept fixed in training,
``frozen_label``):

* each label piece (``agents.LABEL_PIECES``: ``Apply"``, the label with its closing quote,
  which only an instruction naming a button holds) carries its button's class code
  (``dialog.apply``: the recogniser's code, the one the lookup matches against a cell's key)
  in the first ``CODE`` query dims, and a *label* flag (``label_flag``: a content dim no
  other piece holds).  No other piece holds anything in those query dims, and nothing
  writes them before the copy layer (qwen35's first Gated DeltaNet layer and FFN leave them
  0), so at the copy layer's input a label row is the only row with a value there: image
  rows hold 0 in every query dim (``cell_vision``);
* the first attention layer's fourth query head (the second one of the typed flag's KV
  head): its query reads the typed flag's *text* flag (the rows that choose a verb and a
  coordinate), its key the label flag, in one position-free head dim the typed head's query
  leaves zero, so a text row attends to the label piece when the instruction quotes one;
  the value reads the ``CODE`` query dims and the output writes them back into the same
  dims, so the asking rows start out carrying the named button's code.  Without a label
  the attention spreads over rows whose value is 0: the head writes 0, no sink needed (a
  sink piece failed: RMSNorm scales a lone flag up to a label's size).
  On qwen35 the query also carries a fixed projection of the row in the head dims the key
  leaves zero, as ``word_copy.match_flags`` explains (the q/k norms).

The two query dims past ``CODE`` are the word copy's flags (``WordCopy.word_flag`` /
``ask_flag``): a label piece holds 0 there, so it never looks like a word to type or an ask;
the copied code lacks those two of its 36 components (94 % of its length on average).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.agents import LABEL_PIECES
from runtime.train.cell_vision import POS_SCALE, RowLayout
from runtime.train.grounding import HeadSlices, first_head_of, piece_ids, residual_writers
from runtime.train.word_copy import copy_layer
from vmenv.simdesk.words import BUTTON_WORDS

__all__ = ["LabelCopy", "design_label", "frozen_label", "label_copy", "label_head",
           "writers_before_copy"]

CODE = 34  # the query dims copied (the last two are the word copy's flags)
FLAG_GAIN = 1.0  # llama: the text-flag query's scale (qwen35's q/k norms set the sharpness)
NORM_GAIN = 2.0  # qwen35: the q/k norm weight of the flag dim
COPY_GAIN = 0.3  # value -> output (x2 under qwen35's gate)


@attrs.frozen(eq=False)
class LabelCopy:
    """The design's inputs: the row layout, the label pieces' ids and their classes' codes
    (``[labels, key dims]``), the typed flag's text-flag dim."""

    layout: RowLayout
    label_ids: tuple[int, ...]
    codes: np.ndarray = attrs.field(repr=False)
    text_flag: int
    seed: int = 0

    @property
    def label_flag(self) -> int:
        return self.layout.content.stop - 3  # past the typed flag's two dims

    @property
    def code_dims(self) -> slice:
        return slice(self.layout.query.start, self.layout.query.start + CODE)


def label_copy(tokens: Sequence[str], layout: RowLayout, codes: Mapping[str, np.ndarray],
               text_flag: int, seed: int = 0) -> LabelCopy:
    """The agents' label copy for a vocabulary's ``tokens`` and the recogniser's class
    ``codes``.  A label whose button the recogniser has no class for (it never saw one: a
    toy budget) is left out: its piece is then an ordinary piece."""
    known = [(w, p) for w, p in zip(BUTTON_WORDS, LABEL_PIECES)
             if f"dialog.{w.lower()}" in codes]
    width = len(next(iter(codes.values())))
    stacked = np.zeros((len(known), width), np.float32)
    for i, (w, _) in enumerate(known):
        stacked[i] = codes[f"dialog.{w.lower()}"]
    return LabelCopy(layout, piece_ids(tokens, [p for _, p in known]), stacked, text_flag,
                     seed=seed)


def label_head(spec: TextSpec) -> HeadSlices:
    """The second query head of KV head 1 in the copy layer (the typed flag's KV head)."""
    if spec.n_head // spec.n_head_kv < 2:
        raise ValueError("the label copy needs two query heads per KV head")
    first = first_head_of(spec, 1)
    q_rows, hd = first.q.stop - first.q.start, spec.head_dim
    return HeadSlices(slice(first.q.stop, first.q.stop + q_rows), first.kv,
                      slice(first.out.stop, first.out.stop + hd))


def _flag_dim(spec: TextSpec) -> int:
    """The head dim the label flag is matched in: the last of the key's fixed projection on
    qwen35 (``word_copy._head_parts``), where the typed head's query is zero."""
    return spec.head_dim - 2


def writers_before_copy(spec: TextSpec) -> list[str]:
    """The matrices that write the residual before the copy layer reads it (what a design
    keeps at 0 in the dims only its own pieces may hold there)."""
    return [n for n in residual_writers(spec) if int(n.split(".")[1]) < copy_layer(spec)]


def design_label(params: Mapping[str, np.ndarray], spec: TextSpec, c: LabelCopy,
                 ) -> dict[str, np.ndarray]:
    """``params`` with the designed label copy (module docstring); apply it after the typed
    flag (it adds to that KV head's key and value)."""
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    rng = np.random.default_rng(c.seed + 3)
    e = p["token_embd.weight"]
    e[:, c.label_flag] = 0.0
    e[:, c.code_dims] = 0.0
    for tok, code in zip(c.label_ids, c.codes):
        e[tok, c.code_dims] = POS_SCALE * code[:CODE]
        e[tok, c.label_flag] = POS_SCALE
    for name in writers_before_copy(spec):
        p[name][c.code_dims] = 0.0
    pre = f"blk.{copy_layer(spec)}"
    q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
    v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
    head, hd, d = label_head(spec), spec.head_dim, _flag_dim(spec)
    q[head.q], o[:, head.out] = 0.0, 0.0
    k[head.kv.start + d] = 0.0
    k[head.kv.start + d, c.label_flag] = 1.0
    if spec.is_hybrid:  # the query's fixed projection, where the KV head's key is zero
        half = (hd - 1) // 2
        basis = np.linalg.qr(rng.normal(size=(spec.n_embd, spec.n_embd)))[0]
        q[head.q.start:head.q.start + half] = basis[:half]
        p[f"{pre}.attn_q_norm.weight"][d] = NORM_GAIN
        p[f"{pre}.attn_k_norm.weight"][d] = NORM_GAIN
    q[head.q.start + d, c.text_flag] = 1.0 if spec.is_hybrid else FLAG_GAIN
    if np.any(v[head.kv.start + 1:head.kv.start + 1 + CODE]):
        raise ValueError("the typed flag's value rows past its first are not free")
    v[head.kv.start + 1:head.kv.start + 1 + CODE, c.code_dims] = np.eye(CODE)
    gain = 2.0 * COPY_GAIN if spec.is_hybrid else COPY_GAIN  # x2: the gate's sigmoid(0)
    o[c.code_dims, head.out.start + 1:head.out.start + 1 + CODE] = gain * np.eye(CODE)
    return p


def frozen_label(params: Mapping[str, np.ndarray], spec: TextSpec, c: LabelCopy,
                 ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed) of the designed slices: the head's q (with qwen35's gate rows)
    and output columns, its KV head's k and v, the layer's q/k norms and its input norm at
    the label flag and code dims, every piece's label flag and code dims, the earlier
    layers' writes to the code dims."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    pre = f"blk.{copy_layer(spec)}"
    head = label_head(spec)
    masks[f"{pre}.attn_q.weight"][head.q] = 1.0
    masks[f"{pre}.attn_k.weight"][head.kv] = 1.0
    masks[f"{pre}.attn_v.weight"][head.kv] = 1.0
    masks[f"{pre}.attn_output.weight"][:, head.out] = 1.0
    for norm in ("attn_q_norm", "attn_k_norm"):
        if f"{pre}.{norm}.weight" in masks:
            masks[f"{pre}.{norm}.weight"][:] = 1.0
    masks[f"{pre}.attn_norm.weight"][[c.label_flag, *range(c.code_dims.start,
                                                           c.code_dims.stop)]] = 1.0
    e = masks["token_embd.weight"]
    e[:, c.label_flag] = 1.0
    e[:, c.code_dims] = 1.0
    for name in writers_before_copy(spec):
        masks[name][c.code_dims] = 1.0
    return masks
