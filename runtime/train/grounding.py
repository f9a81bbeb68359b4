"""The designed lookup: how a freshly initialised agent starts out able to copy a cell's
coordinates, and the query scaffold that teaches it which cell to ask for.

What the cell projector puts in every image row (``cell_vision.RowLayout``): the recognised
widget's *key* (matched against the class *codes*), the column and row one-hots, content.
Three pieces of the text model are then *initialised* (ordinary weights, trained like the
rest afterwards; measured in docs/training.md "Designed keys"):

* the coordinate pieces' embeddings (``agents.X_PIECES`` / ``Y_PIECES``) are the column /
  row one-hots (x3) in the same dims, so a copied one-hot is read by the tied LM head as
  that coordinate's logit;
* the last attention layer's first query head looks up and copies the column: its query
  reads the row's ``query`` dims, its key the ``key`` dims, both into the head's
  position-free dims (``static_dims``: qwen35's unrotated ones, llama's slowest pairs under
  its agent's huge RoPE base), so position does not enter the match; its value / output copy
  the column one-hot;
* the first query head of the second KV head looks up the *row*: its key is the class key
  projected to ``Y_CODE`` dims plus the cell's column one-hot, its query the class query
  projected the same way plus the column one-hot of the x token just written (an x piece's
  embedding holds it) — so y comes from a cell of the instance x came from when a class has
  two on screen (the Terminal's two launchers); its value / output copy the row one-hot.

With the sub-cell pieces (``agents.SUB_X_PIECES``; a layout with the sub-cell dims) each
head also copies its column's (row's) sub-cell dims, where the projector wrote each cell's
step only in its own column's (row's) dim (``cell_vision``): a piece 8 px before or after a
cell's centre holds the cell's one-hot a little smaller (``SUB_MARGIN``) and ``∓SUB_READ`` in
that dim, so it wins over the centre piece exactly where the copied step says so.

The **query scaffold** (training only, nothing of it is exported): at the rows whose next
token is a coordinate of a click, the lookup layer's input should carry the clicked
widget's code in the ``query`` dims — an auxiliary loss ``weight · (1 − cosine)``
(``query_targets`` builds its per-row targets; ``loss.loss_fn`` adds it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import numpy as np

from cachepolicy.forge import TextSpec
from cachepolicy.forge.tokenizer import SPACE
from runtime.train.agents import LLAMA_ROPE_BASE
from runtime.train.cell_labels import OTHER
from runtime.train.cell_vision import POS_SCALE, SUB_SCALE, RowLayout, width
from runtime.train.model import lookup_layer

__all__ = ["SUB_MARGIN", "SUB_READ", "Grounding", "HeadSlices", "design", "first_head_of",
           "frozen_lookup", "piece_ids", "query_targets", "residual_writers", "static_dims"]

Y_CODE = 16  # the class code's projection the row head matches (its other dims: the column)
#: a sub-cell piece's embedding: its cell's one-hot ``POS_SCALE − SUB_MARGIN`` and ``∓SUB_READ``
#: in its column's (row's) sub-cell dim, so it outscores its cell's centre piece exactly
#: where the copied sub-cell value, ``SUB_SCALE`` times the read-out's, is past ±½ of the
#: copied one-hot's weight: SUB_READ · SUB_SCALE · ½ = POS_SCALE · SUB_MARGIN
SUB_READ = 1.5
SUB_MARGIN = SUB_READ * SUB_SCALE * 0.5 / POS_SCALE
QK_NORM = 2.5  # the q/k norm weights of the lookup dims: how sharp the match starts
COPY_GAIN = 4.0  # value -> output: the copied one-hot's size (x2 under qwen35's gate)
LLAMA_Q_GAIN = 3.0  # llama: the query's scale (no q/k norm sets the match's sharpness)
LLAMA_FAST_DIMS = 12  # llama: the head dims that carry position (as qwen35's rope_dims)


@attrs.frozen(eq=False)
class Grounding:
    """Everything the design and the scaffold need: the row layout, the class codes by name
    (unit vectors of ``layout.key``'s width), the x and y pieces' token ids, the scaffold's
    weight."""

    layout: RowLayout
    codes: Mapping[str, np.ndarray]
    x_ids: tuple[int, ...]
    y_ids: tuple[int, ...]
    weight: float = 10.0
    #: the sub-cell pieces (``agents.SUB_X_PIECES``: per column its left, then right point;
    #: likewise per row), with a layout that has the sub-cell dims; empty without them
    x_sub_ids: tuple[int, ...] = ()
    y_sub_ids: tuple[int, ...] = ()

    @property
    def coordinate_ids(self) -> tuple[int, ...]:
        """Every coordinate piece's id: the cell centres' and the sub-cell points'."""
        return (*self.x_ids, *self.y_ids, *self.x_sub_ids, *self.y_sub_ids)


@attrs.frozen
class HeadSlices:
    """Where one query head lives in an attention layer's matrices (numpy order [out, in])."""

    q: slice  # its rows of attn_q (qwen35's per-head rows are [query | gate]: both)
    kv: slice  # its KV head's rows of attn_k and attn_v
    out: slice  # its columns of attn_output


def first_head_of(spec: TextSpec, kv_head: int) -> HeadSlices:
    """The first query head that reads KV head ``kv_head`` (grouped-query attention maps
    query head h to KV head ``h // (n_head / n_head_kv)``): the designed heads' slices."""
    hd = spec.head_dim
    q_rows = 2 * hd if spec.is_hybrid else hd
    head = kv_head * (spec.n_head // spec.n_head_kv)
    return HeadSlices(slice(q_rows * head, q_rows * (head + 1)),
                      slice(hd * kv_head, hd * (kv_head + 1)), slice(hd * head, hd * (head + 1)))


def static_dims(spec: TextSpec) -> int:
    """The first head dim position does not move: qwen35 rotates only ``rope_dims``; llama
    rotates every pair, so its agent's RoPE base is made so large (``LLAMA_ROPE_BASE``) that
    pairs from ``LLAMA_FAST_DIMS`` on turn by < 0.1 rad over 2000 positions."""
    if spec.is_hybrid:
        return spec.rope_dims
    slowest = spec.rope_freq_base ** (-LLAMA_FAST_DIMS / spec.head_dim)
    if slowest * 2000 > 0.1:
        raise ValueError(f"llama's RoPE base {spec.rope_freq_base:g} turns every head dim: "
                         f"the designed lookup needs a base >= {LLAMA_ROPE_BASE:g}")
    return LLAMA_FAST_DIMS


def design(params: Mapping[str, np.ndarray], spec: TextSpec, g: Grounding,
           seed: int = 0) -> dict[str, np.ndarray]:
    """``params`` with the designed pieces (see the module docstring); ValueError for a
    model whose heads have too few position-free dims or a single KV head."""
    lay = g.layout
    key_w = width(lay.key)
    hd, rot = spec.head_dim, static_dims(spec)
    if hd - rot < max(key_w, Y_CODE + lay.cols) or spec.n_head_kv < 2:
        raise ValueError(f"the designed lookup needs {key_w} position-free dims per head and "
                         f"two KV heads; {spec.arch} has {hd - rot} and {spec.n_head_kv}")
    if len(g.x_ids) != lay.cols or len(g.y_ids) != lay.rows:
        raise ValueError("one x piece per column and one y piece per row")
    sub = bool(g.x_sub_ids)
    if sub and (len(g.x_sub_ids) != 2 * lay.cols or len(g.y_sub_ids) != 2 * lay.rows
                or width(lay.sub_x) != lay.cols or width(lay.sub_y) != lay.rows):
        raise ValueError("two sub-cell pieces per column and row, on a layout with the "
                         "sub-cell dims")
    p = {k: np.array(v, np.float32) for k, v in params.items()}
    rng = np.random.default_rng(seed)
    e = p["token_embd.weight"]
    for pieces, dims in ((g.x_ids, lay.column), (g.y_ids, lay.row)):
        for i, tok in enumerate(pieces):
            e[tok] = 0.05 * rng.normal(size=spec.n_embd)
            e[tok, dims] = 0.0  # exactly the one-hot there: the dims the mask keeps fixed
            e[tok, dims.start + i] = POS_SCALE
    for pieces, dims, subs in ((g.x_sub_ids, lay.column, lay.sub_x),
                               (g.y_sub_ids, lay.row, lay.sub_y)):
        for i, tok in enumerate(pieces):
            cell, side = divmod(i, 2)  # side 0: the point before the centre, 1: after it
            e[tok] = 0.05 * rng.normal(size=spec.n_embd)
            e[tok, dims] = 0.0
            e[tok, subs] = 0.0
            e[tok, dims.start + cell] = POS_SCALE - SUB_MARGIN
            e[tok, subs.start + cell] = SUB_READ if side else -SUB_READ
    pre = f"blk.{lookup_layer(spec)}"
    q, k = p[f"{pre}.attn_q.weight"], p[f"{pre}.attn_k.weight"]
    v, o = p[f"{pre}.attn_v.weight"], p[f"{pre}.attn_output.weight"]
    gated = spec.is_hybrid
    gain = 1.0 if gated else LLAMA_Q_GAIN  # llama has no q/k norm to sharpen the match
    copy = 2.0 * COPY_GAIN if gated else COPY_GAIN  # x2: the gate's sigmoid(0) = 0.5
    # the first query head of KV head 0: the column
    h0 = first_head_of(spec, 0)
    q[h0.q], k[h0.kv], v[h0.kv], o[:, h0.out] = 0.0, 0.0, 0.0, 0.0
    q[h0.q.start + rot:h0.q.start + rot + key_w, lay.query] = gain * np.eye(key_w)
    k[h0.kv.start + rot:h0.kv.start + rot + key_w, lay.key] = np.eye(key_w)
    v[h0.kv.start:h0.kv.start + lay.cols, lay.column] = np.eye(lay.cols)
    o[lay.column, h0.out.start:h0.out.start + lay.cols] = copy * np.eye(lay.cols)
    if sub:  # the column's sub-cell dims ride along, in the value dims after the one-hot
        v[h0.kv.start + lay.cols:h0.kv.start + 2 * lay.cols, lay.sub_x] = np.eye(lay.cols)
        o[lay.sub_x, h0.out.start + lay.cols:h0.out.start + 2 * lay.cols] = (
            copy * np.eye(lay.cols))
    # the first query head of KV head 1: the row, keyed on class and column
    h1 = first_head_of(spec, 1)
    q[h1.q], k[h1.kv], v[h1.kv], o[:, h1.out] = 0.0, 0.0, 0.0, 0.0
    basis = np.linalg.qr(rng.normal(size=(key_w, key_w)))[0][:Y_CODE]
    project = basis * 1.5 * (key_w / Y_CODE) ** 0.5  # class half weighs 1.5, column 1
    q0, k0 = h1.q.start + rot, h1.kv.start + rot
    q[q0:q0 + Y_CODE, lay.query] = gain * project
    k[k0:k0 + Y_CODE, lay.key] = project
    q[q0 + Y_CODE:q0 + Y_CODE + lay.cols, lay.column] = gain * np.eye(lay.cols)
    k[k0 + Y_CODE:k0 + Y_CODE + lay.cols, lay.column] = np.eye(lay.cols)
    v[h1.kv.start:h1.kv.start + lay.rows, lay.row] = np.eye(lay.rows)
    o[lay.row, h1.out.start:h1.out.start + lay.rows] = copy * np.eye(lay.rows)
    if sub:
        v[h1.kv.start + lay.rows:h1.kv.start + 2 * lay.rows, lay.sub_y] = np.eye(lay.rows)
        o[lay.sub_y, h1.out.start + lay.rows:h1.out.start + 2 * lay.rows] = (
            copy * np.eye(lay.rows))
    if gated:
        p[f"{pre}.attn_q_norm.weight"][rot:] = QK_NORM
        p[f"{pre}.attn_k_norm.weight"][rot:] = QK_NORM
    return p


def residual_writers(spec: TextSpec) -> list[str]:
    """The matrices that write the residual stream (attention and Gated DeltaNet outputs,
    FFN down projections): their rows are residual dims (numpy order [out, in])."""
    names = []
    for il in range(spec.n_layer):
        names.append(f"blk.{il}.attn_output.weight" if spec.is_attention(il)
                     else f"blk.{il}.ssm_out.weight")
        names.append(f"blk.{il}.ffn_down.weight")
    return names


def frozen_lookup(params: Mapping[str, np.ndarray], spec: TextSpec, g: Grounding,
                  ) -> dict[str, np.ndarray]:
    """Masks (1 = kept fixed in training) of the designed slices: the two lookup heads'
    q (with qwen35's gate rows), both KV heads' k and v, the heads' output columns, the
    layer's q/k norms, its input norm at the key / column / row / query dims, and the
    coordinate pieces' one-hot dims.  Training then cannot re-wire the lookup (measured in
    docs/training.md: it did, when only initialised); the rest of the network must learn to
    *ask* for the right cell."""
    lay = g.layout
    masks = {name: np.zeros(np.shape(a), np.float32) for name, a in params.items()}
    pre = f"blk.{lookup_layer(spec)}"
    for head in (first_head_of(spec, 0), first_head_of(spec, 1)):
        masks[f"{pre}.attn_q.weight"][head.q] = 1.0
        masks[f"{pre}.attn_output.weight"][:, head.out] = 1.0
        masks[f"{pre}.attn_k.weight"][head.kv] = 1.0
        masks[f"{pre}.attn_v.weight"][head.kv] = 1.0
    for norm in ("attn_q_norm", "attn_k_norm"):
        if f"{pre}.{norm}.weight" in masks:
            masks[f"{pre}.{norm}.weight"][:] = 1.0
    norm_in = masks[f"{pre}.attn_norm.weight"]
    for part in (lay.key, lay.column, lay.row, lay.query, lay.sub_x, lay.sub_y):
        norm_in[part] = 1.0
    e = masks["token_embd.weight"]
    for pieces, dims in ((g.x_ids, lay.column), (g.y_ids, lay.row)):
        for tok in pieces:
            e[tok, dims] = 1.0
    for pieces, dims, subs in ((g.x_sub_ids, lay.column, lay.sub_x),
                               (g.y_sub_ids, lay.row, lay.sub_y)):
        for tok in pieces:
            e[tok, dims] = 1.0
            e[tok, subs] = 1.0
    return masks


def query_targets(targets: np.ndarray, loss_mask: np.ndarray, clicked: str,
                  g: Grounding) -> tuple[np.ndarray, np.ndarray]:
    """Per row of an example: the code its lookup-layer input should carry ``[T, key]`` and
    the scaffold's weight there ``[T]`` — ``g.weight`` at the response rows whose target is
    a coordinate piece, when the example's action clicks a widget of a known class
    (``clicked``; "" when it does not click), else 0."""
    n = len(targets)
    codes = np.zeros((n, width(g.layout.key)), np.float32)
    weight = np.zeros(n, np.float32)
    code = g.codes.get(clicked) if clicked and clicked != OTHER else None
    if code is None:
        return codes, weight
    coord = np.isin(targets, np.asarray(g.coordinate_ids))
    rows = coord & (loss_mask > 0)
    codes[rows] = code
    weight[rows] = g.weight
    return codes, weight


def piece_ids(tokens: Sequence[str], pieces: Sequence[str]) -> tuple[int, ...]:
    """The token ids of ``pieces`` in a vocabulary's ``tokens`` (spaces as "▁")."""
    index = {t: i for i, t in enumerate(tokens)}
    return tuple(index[p.replace(" ", SPACE)] for p in pieces)
