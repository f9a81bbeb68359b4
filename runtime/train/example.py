"""Training examples: a list of segments → the rows, positions and loss targets of one sequence.

A data pipeline describes a prompt + response as segments, in order:

* ``TextPiece(tokens, train=False)`` — text tokens (``Engine.tokenize`` of the rendered chat
  text, so the tokens are exactly what the runtime prefills); ``train=True`` marks response
  tokens, the ones the loss is taken on (include the closing ``<|im_end|>`` so the model learns
  to stop);
* ``ImagePiece(png)`` — a screenshot; it becomes the projector's marker tokens (Qwen-VL:
  ``<|vision_start|>`` … ``<|vision_end|>``) around its embedding rows, as
  ``SegmentFactory.image`` lays an image out for the runtime.

``build_example(engine, pieces)`` walks them from position 0 (a new sequence), asking the
engine's vision encoder for image rows (``vision.image_rows``).  Row ``t``'s target is the
token of row ``t + 1`` and counts in the loss iff that token is a response token: the logits
of the row *before* each response token are trained.  ``collate(examples, n_rows)`` pads
to a fixed length (a bucket: one jit compilation per bucket) and stacks a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

import attrs
import jax
import jax.numpy as jnp
import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.images import EncodedImage
from runtime.train.model import Rows
from runtime.train.vision import rows_at


@attrs.frozen
class TextPiece:
    """Text tokens; ``train=True``: response tokens the loss is computed on."""

    tokens: tuple[int, ...] = attrs.field(converter=lambda t: tuple(int(x) for x in t))
    train: bool = False


@attrs.frozen
class ImagePiece:
    """A screenshot (PNG or another format ``decode_png`` reads)."""

    png: bytes = attrs.field(repr=lambda b: f"<{len(b)} bytes>")


Piece = TextPiece | ImagePiece


@attrs.frozen(eq=False)
class Example:
    """One sequence of rows, unpadded (numpy, host memory).

    ``tokens [T]`` (0 on image rows), ``embed_index [T]`` (-1 on text rows, else the row of
    ``image_embeds [N, n_embd]``), ``positions [T, P]``, ``targets [T]`` (the next row's token,
    0 where there is none) and ``loss_mask [T]`` (1.0 where ``targets`` is a response token).
    ``next_pos`` is the position a continuation would start at (what the engine's
    ``seq_info(seq).next_pos`` reads after prefilling the same pieces).
    """

    tokens: np.ndarray = attrs.field(repr=False)
    embed_index: np.ndarray = attrs.field(repr=False)
    image_embeds: np.ndarray = attrs.field(repr=False)
    positions: np.ndarray = attrs.field(repr=False)
    targets: np.ndarray = attrs.field(repr=False)
    loss_mask: np.ndarray = attrs.field(repr=False)
    next_pos: int

    @property
    def n_rows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_train_tokens(self) -> int:
        return int(self.loss_mask.sum())


class Batch(NamedTuple):
    """A padded batch: every array has a leading batch axis ``B`` (a pytree)."""

    rows: Rows
    targets: jax.Array  # int32 [B, T]
    loss_mask: jax.Array  # float32 [B, T]
    #: the query scaffold (``grounding``): per row the code the lookup layer's input should
    #: carry in its last ``key`` dims ``[B, T, key]`` and the scaffold's weight ``[B, T]``
    query_codes: jax.Array | None = None
    query_weight: jax.Array | None = None


class ImageSource(Protocol):
    """Where ``build_example`` gets image rows: an ``Engine`` (its vision encoder and embedding
    cache), or stored encodings (``runtime.train.fit.StoredImages``)."""

    @property
    def uses_mrope(self) -> bool: ...

    @property
    def n_embd(self) -> int: ...

    def encode_image(self, png: bytes) -> EncodedImage: ...


def build_example(engine: ImageSource | Engine, pieces: Sequence[Piece]) -> Example:
    """Rows of ``pieces`` laid out as the engine prefills them into a new sequence.

    ValueError if there are no rows or no piece at all; ``NoVisionError`` for an image on an
    engine without an mmproj."""
    tokens: list[int] = []
    embed_index: list[int] = []
    positions: list[np.ndarray] = []
    is_response: list[bool] = []
    embeds: list[np.ndarray] = []
    n_pos_cols = 4 if engine.uses_mrope else 1
    pos, n_embeds = 0, 0

    def add_text(toks: Sequence[int], train: bool) -> None:
        nonlocal pos
        for tok in toks:
            tokens.append(int(tok))
            embed_index.append(-1)
            # text rows: (p, p, p, 0) under M-RoPE, (p,) otherwise
            row = np.full(n_pos_cols, pos, dtype=np.int32)
            if n_pos_cols == 4:
                row[3] = 0
            positions.append(row)
            is_response.append(train)
            pos += 1

    for piece in pieces:
        if isinstance(piece, TextPiece):
            add_text(piece.tokens, piece.train)
            continue
        enc = engine.encode_image(piece.png)
        add_text(enc.prefix_tokens, False)
        img = rows_at(enc, pos)
        embeds.append(img.embeddings)
        for i in range(img.n_rows):
            tokens.append(0)
            embed_index.append(n_embeds + i)
            positions.append(img.positions[i])
            is_response.append(False)
        n_embeds += img.n_rows
        pos = img.next_pos
        add_text(img.suffix_tokens, False)
    if not tokens:
        raise ValueError("an example needs at least one row")
    toks = np.asarray(tokens, dtype=np.int32)
    resp = np.asarray(is_response, dtype=bool)
    targets = np.zeros_like(toks)
    targets[:-1] = toks[1:]
    mask = np.zeros(len(toks), dtype=np.float32)
    mask[:-1] = resp[1:]
    return Example(
        tokens=toks, embed_index=np.asarray(embed_index, dtype=np.int32),
        image_embeds=(np.concatenate(embeds) if embeds
                      else np.zeros((0, engine.n_embd), dtype=np.float32)),
        positions=np.stack(positions).astype(np.int32), targets=targets, loss_mask=mask,
        next_pos=pos)


def to_rows(example: Example, n_rows: int | None = None) -> Rows:
    """The example as forward input, padded with invalid rows to ``n_rows`` (numpy arrays;
    ValueError if the example is longer)."""
    n = example.n_rows
    total = n if n_rows is None else n_rows
    if total < n:
        raise ValueError(f"example of {n} rows does not fit a bucket of {total}")
    width = example.image_embeds.shape[1]
    tokens = np.zeros(total, dtype=np.int32)
    tokens[:n] = example.tokens
    is_embed = np.zeros(total, dtype=bool)
    is_embed[:n] = example.embed_index >= 0
    embeds = np.zeros((total, width), dtype=np.float32)
    embeds[:n][is_embed[:n]] = example.image_embeds[example.embed_index[is_embed[:n]]]
    positions = np.zeros((total, example.positions.shape[1]), dtype=np.int32)
    positions[:n] = example.positions
    # padding rows continue the positions so they sit after every real row
    positions[n:] = example.next_pos + np.arange(total - n, dtype=np.int32)[:, None]
    valid = np.zeros(total, dtype=bool)
    valid[:n] = True
    return Rows(tokens=tokens, embeds=embeds, is_embed=is_embed, positions=positions,
                valid=valid)


def collate(examples: Sequence[Example], n_rows: int,
            scaffold: Sequence[tuple[np.ndarray, np.ndarray]] | None = None) -> Batch:
    """Pad every example to ``n_rows`` and stack them (jax arrays, leading batch axis).
    ``scaffold``: per example its query codes and weights (``grounding.query_targets``)."""
    if not examples:
        raise ValueError("an empty batch")
    rows = [to_rows(ex, n_rows) for ex in examples]
    stacked = Rows(*(jnp.asarray(np.stack(col)) for col in zip(*rows)))
    targets = np.zeros((len(examples), n_rows), dtype=np.int32)
    mask = np.zeros((len(examples), n_rows), dtype=np.float32)
    for i, ex in enumerate(examples):
        targets[i, : ex.n_rows] = ex.targets
        mask[i, : ex.n_rows] = ex.loss_mask
    if scaffold is None:
        return Batch(stacked, jnp.asarray(targets), jnp.asarray(mask))
    codes = np.zeros((len(examples), n_rows, scaffold[0][0].shape[1]), dtype=np.float32)
    weight = np.zeros((len(examples), n_rows), dtype=np.float32)
    for i, (ex, (c, w)) in enumerate(zip(examples, scaffold)):
        codes[i, : ex.n_rows], weight[i, : ex.n_rows] = c, w
    return Batch(stacked, jnp.asarray(targets), jnp.asarray(mask), jnp.asarray(codes),
                 jnp.asarray(weight))


def bucket_for(n_rows: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds ``n_rows`` (ValueError if none does)."""
    fitting = [b for b in sorted(buckets) if b >= n_rows]
    if not fitting:
        raise ValueError(f"{n_rows} rows exceed the largest bucket {max(buckets)}")
    return fitting[0]
