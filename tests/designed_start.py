"""Test helpers: the agents' designed start on fresh weights, the residual stream a prompt
leaves entering a layer (what the design tests of label_copy and instruction_flags read), and
what the copy layer's attention adds to given rows (typed_flag's and menu_flag's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax.numpy as jnp
import numpy as np

from cachepolicy.forge import TextSpec
from runtime.train import attention, rope
from runtime.train.agents import TYPED_WORDS, X_PIECES, Y_PIECES, agent_shape, agent_vocab
from runtime.train.cell_vision import row_layout
from runtime.train.codes import spread_codes
from runtime.train.grounding import Grounding, design, piece_ids
from runtime.train.label_copy import LabelCopy, design_label, label_copy
from runtime.train.model import ForwardOptions, Rows, hidden_and_residual
from runtime.train.numerics import Numerics, rms_norm
from runtime.train.params import init_params
from runtime.train.readout import Readout, design_readout
from runtime.train.typed_flag import design_typed, typed_flag
from runtime.train.word_copy import ASK_PIECES, WordCopy, copy_layer, design_copy
from vmenv.simdesk.words import BUTTON_WORDS

VOCAB = agent_vocab()
LAYOUT = row_layout(192)
CLASSES = [f"dialog.{w.lower()}" for w in BUTTON_WORDS] + ["dialog.ok", "other"]
CODES = dict(zip(CLASSES, spread_codes(len(CLASSES), 36, seed=0)))


def designed_start(arch: str, *, labelled: bool = True, key_row: bool = False,
                   ) -> tuple[dict[str, np.ndarray], LabelCopy]:
    """Fresh weights of ``arch``'s agent with the lookup, read-out, word copy and typed flag
    (``key_row``: on the key row too) designed in, and the label copy too when ``labelled``;
    and the label copy's inputs."""
    spec = agent_shape(arch).spec
    g = Grounding(LAYOUT, CODES, piece_ids(VOCAB.tokens, X_PIECES),
                  piece_ids(VOCAB.tokens, Y_PIECES))
    words = WordCopy(LAYOUT, piece_ids(VOCAB.tokens, TYPED_WORDS),
                     piece_ids(VOCAB.tokens, ASK_PIECES))
    typed = typed_flag(VOCAB.tokens, words, key_row=key_row)
    p = design(init_params(spec, seed=0), spec, g)
    p = design_readout(p, spec, Readout(LAYOUT, g.x_ids, g.y_ids))
    p = design_typed(design_copy(p, spec, words), spec, typed)
    labels = label_copy(VOCAB.tokens, LAYOUT, CODES, typed.text_flag)
    return (design_label(p, spec, labels) if labelled else p), labels


def token_ids(pieces: Sequence[str]) -> list[int]:
    return [VOCAB.tokens.index(p) for p in pieces]


def _line_positions(spec: TextSpec, n: int) -> jnp.ndarray:
    """Rows 0..n-1 as the engine positions text: ``(p,)``, or ``(p, p, p, 0)`` under M-RoPE."""
    width = rope.n_position_components(spec)
    pos = np.repeat(np.arange(n, dtype=np.int32), width).reshape(n, width)
    if width == 4:
        pos[:, 3] = 0
    return jnp.asarray(pos)


def line_rows(spec: TextSpec, tokens: Sequence[int]) -> Rows:
    """A text prompt's rows at positions 0..T-1, as the engine lays a text prompt out."""
    toks = np.asarray(tokens, np.int32)
    n = len(toks)
    return Rows(jnp.asarray(toks), jnp.zeros((n, spec.n_embd)), jnp.zeros(n, bool),
                _line_positions(spec, n), jnp.ones(n, bool))


def last_residual(params: Mapping[str, np.ndarray], arch: str, tokens: Sequence[int],
                  layer: int) -> np.ndarray:
    """The residual stream entering ``layer`` at the prompt's last row (``line_rows``)."""
    spec = agent_shape(arch).spec
    p = {k: jnp.asarray(v) for k, v in params.items()}
    _, res = hidden_and_residual(p, spec, line_rows(spec, tokens), ForwardOptions(), layer)
    return np.asarray(res[-1])


def copy_layer_mix(params: Mapping[str, np.ndarray], arch: str, embeds: np.ndarray,
                   ) -> np.ndarray:
    """What the copy layer's attention adds to each row of ``embeds [T, n_embd]`` (rows at
    positions 0..T-1), read from the embeddings themselves: the layers below the copy
    layer are not the designs' (the typed and menu flags' tests)."""
    spec = agent_shape(arch).spec
    p = {k: jnp.asarray(v) for k, v in params.items()}
    pos = _line_positions(spec, len(embeds))
    cos, sin = rope.angles(pos, spec)
    visible = attention.visibility(pos, jnp.ones(len(embeds), bool))
    il = copy_layer(spec)
    x = rms_norm(jnp.asarray(embeds), p[f"blk.{il}.attn_norm.weight"], spec.rms_eps)
    mix = attention.gated_attention if spec.is_hybrid else attention.llama_attention
    return np.asarray(mix(p, f"blk.{il}", x, cos, sin, visible, spec, Numerics()))
