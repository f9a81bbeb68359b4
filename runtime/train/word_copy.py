"""The designed word copy: how a freshly initialised agent starts out able to type the word its
task quotes.

Every word a simdesk task can ask to type (``TYPED_WORDS``) is one piece of the agents'
vocabulary (``agents.AGENT_PIECES``), so ``type("hello")`` is ``type("`` ``hello`` ``"``
``)`` and typing a word is copying *one* token from the instruction. Three pieces of the text
model are initialised for that (and kept fixed in training, ``frozen``):

* each word piece's embedding carries a flag (``WORD_FLAG`` dim: "I am a word to type") and
  the word's own code (``CODE_DIMS``: unit vectors of low mutual coherence,
  ``codes.spread_codes``);
  the ``type("`` pieces carry an "ask" flag (``ASK_FLAG`` dim). Both flag dims are ``query``
  dims of the cell row layout: zero in every image row, so no cell can look like a word;
* the first attention layer's first query head (``copy_layer``): its query reads the ask
  flag, its key the word flag, in one position-free head dim, so the row of ``type("``
  attends to the quoted word wherever it is; its value / output copy the word's code into
  the same dims, where the tied LM head reads it as that word's logit. Under qwen35's q/k
  RMS norms a one-dim query or key would be scaled up to full size from noise, so its query
  also carries a fixed projection of the row in dims the key leaves zero (and the key one in
  dims the query leaves zero): the norms then measure the flags against the whole row while
  the two projections never meet in ``q·k``.

Held-out words (``EVAL_ONLY_WORDS``) are pieces too and are copied by the same head, never
having been typed in training; a word outside ``TYPED_WORDS`` is spelled out and the agents
cannot type it (docs/training.md says so).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train.agents import TYPED_WORDS
from runtime.train.cell_vision import POS_SCALE, RowLayout
from runtime.train.codes import spread_codes

__all__ = ["ASK_PIECES", "TYPED_WORDS", "WordCopy", "copy_layer", "design_copy",
           "frozen_copy", "match_dim", "match_flags"]

#: the pieces whose row asks for the word (the next token is the word)
ASK_PIECES = ('type("', ' type("')

CODE_WIDTH = 48  # a word code's dims (the first content dims of the row layout)
FLAG_GAIN = 1.0  # the ask query's scale (llama; qwen35's q/k norms set the sharpness)
NORM_GAIN = 2.0  # qwen35: the q/k norm weight of the flag dim
COPY_GAIN = 4.0  # value -> output


@attrs.frozen(eq=False)
class WordCopy:
    """The design's inputs: the word pieces' and ask pieces' token ids and the row layout
    (whose content dims hold the codes and whose query dims the two flags)."""

    layout: RowLayout
    word_ids: tuple[int, ...]
    ask_ids: tuple[int, ...]
    seed: int = 0

    @property
    def code_dims(self) -> slice:
        start = self.layout.content.start
        return slice(start, start + CODE_WIDTH)

    @property
    def word_flag(self) -> int:
        return self.layout.query.stop - 2

    @property
    def ask_flag(self) -> int:
        return self.layout.query.stop - 1


def copy_layer(spec: TextSpec) -> int:
    """The layer whose attention copies the word: the first attention layer."""
    return min(i for i in range(spec.n_layer) if spec.is_attention(i))


def match_dim(spec: TextSpec) -> int:
    """The head dim a flag-matching head (``match_flags``) matches its flags in: the last."""
    return spec.head_dim - 1


def _head_parts(spec: TextSpec) -> tuple[slice, slice, int]:
    """Head dims of a flag-matching head: the query's projection, the key's projection, the
    flag."""
    flag = match_dim(spec)
    half = flag // 2
    return slice(0, half), slice(half, flag), flag


def match_flags(p: dict[str, np.ndarray], spec: TextSpec, layer: int, q0: int, k0: int,
                query_flag: int, key_flag: int, gain: float, rng: np.random.Generator) -> None:
    """Make the (zeroed) head whose query rows start at ``q0`` and key rows at ``k0`` in
    ``layer`` match ``query_flag`` against ``key_flag`` in its last, position-free head dim
    (the copy head; ``typed_flag``'s head); on qwen35 with the fixed projections the module
    docstring explains (one draw of ``rng``)."""
    pre = f"blk.{layer}"
    q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
    q_proj, k_proj, flag = _head_parts(spec)
    if spec.is_hybrid:
        basis = np.linalg.qr(rng.normal(size=(spec.n_embd, spec.n_embd)))[0]
        n_q, n_k = q_proj.stop - q_proj.start, k_proj.stop - k_proj.start
        q[q0 + q_proj.start:q0 + q_proj.stop] = basis[:n_q]
        k[k0 + k_proj.start:k0 + k_proj.stop] = basis[n_q:n_q + n_k]
        p[f"{pre}.attn_q_norm.weight"][flag] = NORM_GAIN  # the norms are shared by the heads
        p[f"{pre}.attn_k_norm.weight"][flag] = NORM_GAIN
    q[q0 + flag, query_flag] = gain
    k[k0 + flag, key_flag] = 1.0


def design_copy(params: Mapping[str, np.ndarray], spec: TextSpec, w: WordCopy,
                ) -> dict[str, np.ndarray]:
    """``params`` with the designed word copy (see the module docstring); ValueError when
    the layout's content is narrower than a code."""
    lay = w.layout
    if lay.content.stop - lay.content.start < CODE_WIDTH or spec.head_dim < CODE_WIDTH:
        raise ValueError(f"the word copy needs {CODE_WIDTH} content dims and head dims")
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    rng = np.random.default_rng(w.seed + 1)
    e = p["token_embd.weight"]
    codes = spread_codes(len(w.word_ids), CODE_WIDTH, w.seed)
    for tok, code in zip(w.word_ids, codes):
        e[tok] = 0.05 * rng.normal(size=spec.n_embd)
        e[tok, w.code_dims] = POS_SCALE * code
        e[tok, w.word_flag] = POS_SCALE
    for tok in w.ask_ids:
        e[tok, w.ask_flag] = POS_SCALE
    layer = copy_layer(spec)
    pre = f"blk.{layer}"
    q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
    v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
    hd, gated = spec.head_dim, spec.is_hybrid
    q_rows = 2 * hd if gated else hd
    q[:q_rows], k[:hd], v[:hd], o[:, :hd] = 0.0, 0.0, 0.0, 0.0
    match_flags(p, spec, layer, 0, 0, w.ask_flag, w.word_flag, FLAG_GAIN, rng)
    v[:CODE_WIDTH, w.code_dims] = np.eye(CODE_WIDTH)
    copy = 2.0 * COPY_GAIN if gated else COPY_GAIN  # x2: the gate's sigmoid(0) = 0.5
    o[w.code_dims, :CODE_WIDTH] = copy * np.eye(CODE_WIDTH)
    return p


def frozen_copy(params: Mapping[str, np.ndarray], spec: TextSpec, w: WordCopy,
                ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed in training) of the designed slices: the copy head's q/k/v/o,
    the layer's q/k norms, its input norm at the flag and code dims, the word pieces' codes
    and flags, the ask pieces' flag."""
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    hd = spec.head_dim
    pre = f"blk.{copy_layer(spec)}"
    masks[f"{pre}.attn_q.weight"][:2 * hd if spec.is_hybrid else hd] = 1.0
    masks[f"{pre}.attn_k.weight"][:hd] = 1.0
    masks[f"{pre}.attn_v.weight"][:hd] = 1.0
    masks[f"{pre}.attn_output.weight"][:, :hd] = 1.0
    for norm in ("attn_q_norm", "attn_k_norm"):
        if f"{pre}.{norm}.weight" in masks:
            masks[f"{pre}.{norm}.weight"][:] = 1.0
    dims = [*range(w.code_dims.start, w.code_dims.stop), w.word_flag, w.ask_flag]
    masks[f"{pre}.attn_norm.weight"][dims] = 1.0
    e = masks["token_embd.weight"]
    for tok in w.word_ids:
        e[tok, w.code_dims] = 1.0
        e[tok, w.word_flag] = 1.0
    for tok in w.ask_ids:
        e[tok, w.ask_flag] = 1.0
    return masks
