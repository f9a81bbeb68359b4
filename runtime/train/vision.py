"""Image rows for the trainer, from llama.cpp's own vision encoder (the frozen mmproj).

The vision tower and projector stay frozen: the trainer never runs them.  It asks the
engine (``Engine.encode_image``: mtmd, the same call the runtime makes) for an image's
embedding rows and decoder positions, and feeds them to the JAX forward exactly as
``Engine.prefill_image`` feeds them to llama.cpp.

Positions: under multi-section RoPE (qwen35 + ``qwen3vl_merger``) mtmd gives every row of an
image the image's start position as t, and ``start + row`` / ``start + col`` (of the merged
patch grid) as y / x; the next text position is ``start + n_pos`` where ``n_pos`` is the
longer side of the grid — fewer positions than rows.  Without it (llama + ``mlp``) the rows
sit at ``start, start + 1, …`` and advance the position by their count.
"""

from __future__ import annotations

import attrs
import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.images import DecodedImage, EncodedImage


@attrs.frozen(eq=False)
class ImageRows:
    """One image as decoder input rows at a given start position.

    ``embeddings [n, n_embd]`` f32 (bitwise what llama.cpp is fed), ``positions [n, P]`` int32
    (P = 4, columns t, y, x, z, under M-RoPE; else P = 1), ``next_pos`` the position of the
    row after the image, ``prefix_tokens`` / ``suffix_tokens`` the marker tokens the
    projector expects around it (``<|vision_start|>`` / ``<|vision_end|>`` for Qwen-VL; none
    for LLaVA), ``image_id`` the pixel hash.
    """

    image_id: str
    embeddings: np.ndarray = attrs.field(repr=False)
    positions: np.ndarray = attrs.field(repr=False)
    start_pos: int
    next_pos: int
    prefix_tokens: tuple[int, ...]
    suffix_tokens: tuple[int, ...]

    @property
    def n_rows(self) -> int:
        return int(self.embeddings.shape[0])


def image_rows(engine: Engine, png: bytes | DecodedImage, start_pos: int) -> ImageRows:
    """``png``'s rows as the engine would prefill them into a sequence whose next position is
    ``start_pos`` (encoded by the engine's vision encoder; its embedding cache serves repeats).

    Raises ``NoVisionError`` if the engine has no mmproj, ``ImageError`` for a bad image, and
    ValueError for a projector whose rows attend non-causally (not modelled by the trainer).
    """
    return rows_at(engine.encode_image(png), start_pos)


def rows_at(enc: EncodedImage, start_pos: int) -> ImageRows:
    """An encoded image's rows at ``start_pos`` (see ``image_rows``)."""
    if start_pos < 0:
        raise ValueError(f"start_pos must be >= 0, got {start_pos}")
    if enc.non_causal:
        raise ValueError("this projector's image rows attend non-causally; the trainer's "
                         "forward only models causal rows")
    positions = enc.positions_at(start_pos).T  # (n_pos_per_embd, n) -> (n, P)
    return ImageRows(
        image_id=enc.image_id,
        embeddings=np.ascontiguousarray(enc.embeddings, dtype=np.float32),
        positions=np.ascontiguousarray(positions, dtype=np.int32),
        start_pos=start_pos, next_pos=start_pos + enc.n_pos,
        prefix_tokens=enc.prefix_tokens, suffix_tokens=enc.suffix_tokens)
