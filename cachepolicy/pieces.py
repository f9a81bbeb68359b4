"""A rendered prompt: an ordered tuple of pieces, each prefilled by one engine call.

A piece's digest is chained exactly as the engine chains the runs it feeds (same function,
same content ids), so "does this sequence already hold the first k pieces?" is a comparison
of digests, with no token-by-token walk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
import numpy as np

from cachepolicy.engine.checkpoint import GENESIS, RunKind, chain_digest
from cachepolicy.context_log import Segment


@attrs.frozen
class Piece:
    """Text tokens, or one screenshot's image rows."""

    key: str  # stable name, e.g. "head", "action@3", "screenshot@5", "gen"
    tokens: tuple[int, ...] = ()
    image: Segment | None = attrs.field(default=None, eq=False)
    image_id: str | None = None  # identity of the image (eq uses this, not the segment)
    sources: tuple[str, ...] = attrs.field(default=(), eq=False)  # keys of segments shown

    @property
    def is_image(self) -> bool:
        return self.image is not None

    @property
    def n_tokens(self) -> int:
        return self.image.n_image_tokens if self.image is not None else len(self.tokens)

    @property
    def n_pos(self) -> int:
        return self.image.n_image_pos if self.image is not None else len(self.tokens)

    def chain(self, previous: bytes) -> bytes:
        if self.image is not None:
            assert self.image_id is not None
            return chain_digest(previous, RunKind.EMBEDDINGS, self.image_id.encode())
        return chain_digest(previous, RunKind.TEXT,
                            np.asarray(self.tokens, dtype=np.int32).tobytes())


def text_piece(key: str, tokens: Sequence[int], sources: Sequence[str] = ()) -> Piece:
    return Piece(key=key, tokens=tuple(tokens), sources=tuple(sources))


def image_piece(segment: Segment) -> Piece:
    return Piece(key=segment.key, image=segment, image_id=segment.image_id,
                 sources=(segment.key,))


def shown_keys(pieces: Iterable[Piece]) -> tuple[str, ...]:
    """The keys of the segments the pieces show, in prompt order, each once."""
    return tuple(dict.fromkeys(k for p in pieces for k in p.sources))


def digests(pieces: Iterable[Piece]) -> list[bytes]:
    """Chained digest after each piece (index i: the history holding pieces[:i+1])."""
    out, prev = [], GENESIS
    for p in pieces:
        prev = p.chain(prev)
        out.append(prev)
    return out


def merge_text(pieces: Sequence[Piece], *, keep_before: frozenset[int] = frozenset()) -> tuple[Piece, ...]:
    """Join adjacent text pieces into one (fewer, larger prefill batches).

    ``keep_before`` lists indices (into ``pieces``) that must start a new piece, e.g. where a
    checkpoint is taken.  Empty text pieces are dropped.
    """
    out: list[Piece] = []
    for i, p in enumerate(pieces):
        if not p.is_image and not p.tokens:
            continue
        if (out and not p.is_image and not out[-1].is_image and i not in keep_before):
            last = out[-1]
            out[-1] = Piece(key=f"{last.key}+{p.key}", tokens=last.tokens + p.tokens,
                            sources=last.sources + p.sources)
        else:
            out.append(p)
    return tuple(out)


def n_tokens(pieces: Iterable[Piece]) -> int:
    return sum(p.n_tokens for p in pieces)
