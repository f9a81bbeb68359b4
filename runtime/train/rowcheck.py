"""What a sequence holds, row by row: the check that training prompts are the runtime's.

The engine records a sequence's history as runs (one per prefill call), each with a digest
chained over everything before it — so two sequences holding the same rows cut into
different calls have different digests.  ``history_rows`` flattens a history into rows that
do not depend on the cut: one ``Row`` per text token (its id and position) and one per image
(its pixel identity, start position, positions advanced and rows taken), recovering each
image's identity from the chained digest (``chain_digest(previous, EMBEDDINGS, id)``, so
an image is named only when the digest proves it).

``prefill_pieces`` feeds trainer pieces (``TextPiece`` / ``ImagePiece``) into a sequence the
way the trainer lays them out (an image's marker tokens around its rows); ``piece_rows``
gives the rows that leaves without computing it.  Comparing either with ``history_rows`` of
the runtime's sequence, step by step, is the proof that a training prompt is what the
runtime prefilled (tests/test_train_prompts.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import attrs
import numpy as np

from cachepolicy.engine.checkpoint import GENESIS, Run, RunKind, chain_digest
from runtime.train.prompts import ImagePiece, TextPiece, TrainPiece

if TYPE_CHECKING:
    from cachepolicy.engine import Engine


@attrs.frozen
class Row:
    """A text token (``content`` = its id, one position) or an image (``content`` = its
    pixel hash, ``n_pos`` positions from ``pos``, ``n_rows`` KV rows)."""

    kind: RunKind
    content: int | str
    pos: int
    n_pos: int = 1
    n_rows: int = 1


class UnknownImageError(ValueError):
    """An image run whose digest none of the candidate image ids explains."""


def history_rows(history: Sequence[Run], image_ids: Iterable[str]) -> tuple[Row, ...]:
    """The rows of a sequence history; ``image_ids`` are the candidates for its images
    (``UnknownImageError`` if a run is none of them).  Text digests are re-derived too, so
    a history whose digests do not chain raises ``ValueError``."""
    candidates = tuple(image_ids)
    rows: list[Row] = []
    prev = GENESIS
    for run in history:
        if run.kind is RunKind.TEXT:
            toks = np.asarray(run.tokens, dtype=np.int32).tobytes()
            if chain_digest(prev, RunKind.TEXT, toks) != run.digest:
                raise ValueError(f"text run at {run.pos0}: digest does not chain")
            rows += [Row(RunKind.TEXT, t, run.pos0 + k) for k, t in enumerate(run.tokens)]
        else:
            found = [i for i in candidates
                     if chain_digest(prev, RunKind.EMBEDDINGS, i.encode()) == run.digest]
            if not found:
                raise UnknownImageError(f"image run at {run.pos0}: not one of "
                                        f"{len(candidates)} candidate images")
            rows.append(Row(RunKind.EMBEDDINGS, found[0], run.pos0, run.n_pos, run.n_tokens))
        prev = run.digest
    return tuple(rows)


def prefill_pieces(engine: Engine, seq: int, pieces: Sequence[TrainPiece]) -> None:
    """Feed ``pieces`` into the empty sequence ``seq`` as the trainer lays them out: text
    tokens, and for each image its prefix markers, its embedding rows, its suffix markers
    (no logits; ``ValueError`` if ``seq`` is not empty)."""
    if engine.seq_info(seq).n_tokens:
        raise ValueError(f"sequence {seq} is not empty")
    for p in pieces:
        if isinstance(p, TextPiece):
            _text(engine, seq, p.tokens)
        else:
            assert isinstance(p, ImagePiece)
            enc = engine.encode_image(p.png)
            _text(engine, seq, enc.prefix_tokens)
            engine.prefill_image(seq, enc, logits=False)
            _text(engine, seq, enc.suffix_tokens)


def piece_rows(engine: Engine, pieces: Sequence[TrainPiece]) -> tuple[Row, ...]:
    """The rows ``pieces`` take in an empty sequence, by the trainer's rule (text: one
    position per token; an image: its marker tokens around rows starting at the next
    position and advancing it by the encoder's ``n_pos``) — what ``prefill_pieces`` makes
    the engine hold, without the compute."""
    rows: list[Row] = []
    pos = 0

    def text(tokens: Sequence[int]) -> None:
        nonlocal pos
        rows.extend(Row(RunKind.TEXT, int(t), pos + k) for k, t in enumerate(tokens))
        pos += len(tokens)

    for p in pieces:
        if isinstance(p, TextPiece):
            text(p.tokens)
            continue
        enc = engine.encode_image(p.png)
        text(enc.prefix_tokens)
        rows.append(Row(RunKind.EMBEDDINGS, enc.image_id, pos, enc.n_pos, enc.n_tokens))
        pos += enc.n_pos
        text(enc.suffix_tokens)
    return tuple(rows)


def first_difference(expected: Sequence[Row], actual: Sequence[Row]) -> str | None:
    """None when the two row lists are equal, else where and how they first differ."""
    for i, (a, b) in enumerate(zip(expected, actual)):
        if a != b:
            return f"row {i}: expected {a}, got {b}"
    if len(expected) != len(actual):
        return f"{len(expected)} rows expected, got {len(actual)}"
    return None


def _text(engine: Engine, seq: int, tokens: Sequence[int]) -> None:
    if tokens:
        engine.prefill_tokens(seq, tokens, logits=False, allow_single=True)
