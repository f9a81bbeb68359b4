"""Tail replay, the planning side: where a step can start when it may rebuild the recurrent
state approximately (the approximate policies, and exact ones hit by the memory ladder's
replay rung).

The exact planner (``reuse.best_start``) compares chained digests: it reuses a prefix only
where the sequence holds exactly that history, and on a hybrid only at a recurrent checkpoint.
Here the comparison is by content, token by token: the match runs to the TRUE point of
divergence ``p`` (inside a text piece if need be; images whole), ignoring the engine's
``REBASE`` marks (an approximate history is still content).  Then, best first:

* KEEP — the sequence holds exactly the matched content and its recurrent state is at its
  end: continue from there (nothing recomputed);
* TRUNCATE — a recurrent checkpoint of this history between the replay cut and ``p``:
  restore it, trim the attention KV (exact relative to the state it was taken on);
* REPLAY — cut at ``c = p - r`` (``r`` the replay budget, in rows; an image straddling the
  cut is replayed whole), keep the attention KV of ``[0, c)``, recurrent state from the
  nearest older checkpoint of this history or zero (``ReplayBudget.base``), then prefill
  ``[c, p)`` again and go on (``Engine.replay_cut``: approximate);
* CLEAR — nothing matched, or the cut reaches position 0 (a full prefill: exact).

A start inside a text piece splits that piece in two (the plan's pieces then differ from the
layout's by that one split; the piece indices of anchors move with it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from cachepolicy.engine.checkpoint import (
    GENESIS, Checkpoint, CheckpointKind, Run, RunKind, chain_digest,
)
from cachepolicy.pieces import Piece
from cachepolicy.plan import CacheView, Replay, Start, StartKind

#: Where a replay's recurrent state starts: the nearest older checkpoint of the sequence's
#: history when there is one, else zero — or always zero.
BASES = ("checkpoint", "zero")


@attrs.frozen
class ReplayBudget:
    """How many rows of the matched prefix a replay recomputes: ``tokens``, or ``fraction``
    of the matched rows (rounded up); at least what a straddling image needs."""

    tokens: int | None = None
    fraction: float | None = None
    base: str = attrs.field(default="checkpoint", validator=attrs.validators.in_(BASES))

    def __attrs_post_init__(self) -> None:
        if (self.tokens is None) == (self.fraction is None):
            raise ValueError("a replay budget is a number of tokens or a fraction, not both")
        if self.tokens is not None and self.tokens < 0:
            raise ValueError(f"replay budget {self.tokens} tokens: must be >= 0")
        if self.fraction is not None and not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"replay budget {self.fraction:g}: a fraction must be 0..1")

    @classmethod
    def parse(cls, text: str, base: str = "checkpoint") -> ReplayBudget:
        """``64`` (tokens) or ``10%`` (of the matched prefix); ValueError otherwise."""
        value = text.strip()
        try:
            if value.endswith("%"):
                return cls(fraction=float(value[:-1]) / 100.0, base=base)
            return cls(tokens=int(value), base=base)
        except ValueError as exc:
            raise ValueError(f"replay budget {text!r}: tokens (64) or a percentage of the "
                             f"matched prefix (10%): {exc}") from None

    def rows(self, matched: int) -> int:
        if self.tokens is not None:
            return self.tokens
        assert self.fraction is not None
        return math.ceil(self.fraction * matched)

    def __str__(self) -> str:
        return (str(self.tokens) if self.tokens is not None
                else f"{self.fraction * 100:g}%")  # type: ignore[operator]


#: The budget the approximate policies use when none is given (the Tail-Replay paper's
#: 5-10 % kept 92.8-99.9 % of full-prefill quality; measured here: docs/benchmarks.md).
DEFAULT_BUDGET = ReplayBudget(fraction=0.10)


@attrs.frozen
class Point:
    """A place in a prompt: ``offset`` tokens into ``pieces[piece]`` (0 for an image), at
    position ``pos`` after ``rows`` rows."""

    piece: int
    offset: int
    pos: int
    rows: int


@attrs.frozen
class Match:
    """The prompt's longest content prefix the sequence holds, up to ``end``."""

    end: Point
    #: the sequence holds nothing beyond ``end`` and its recurrent state is at ``end``
    whole: bool


def content_match(pieces: Sequence[Piece], history: Sequence[Run], limit: int) -> Match:
    """Walk the history's runs against the prompt's content (never into ``pieces[limit:]``):
    text token by token, images by identity (a run's digest is recomputed from its
    predecessor's, so an image matches only the same pixels), ``REBASE`` runs skipped."""
    i = o = pos = rows = 0
    prev = GENESIS
    complete = True
    for run in history:
        if run.kind is RunKind.REBASE:
            prev = run.digest
            continue
        if run.kind is RunKind.EMBEDDINGS:
            piece = pieces[i] if i < limit else None
            if (piece is None or o or not piece.is_image
                    or chain_digest(prev, RunKind.EMBEDDINGS,
                                    (piece.image_id or "").encode()) != run.digest):
                complete = False
                break
            i, pos, rows = i + 1, pos + piece.n_pos, rows + piece.n_tokens
        else:
            j = 0
            while j < len(run.tokens) and i < limit and not pieces[i].is_image:
                toks = pieces[i].tokens
                while j < len(run.tokens) and o < len(toks) and run.tokens[j] == toks[o]:
                    j, o, pos, rows = j + 1, o + 1, pos + 1, rows + 1
                if o == len(toks):
                    i, o = i + 1, 0
                    continue
                break  # a token differs
            if j < len(run.tokens):
                complete = False
                break
        prev = run.digest
    whole = complete and bool(history) and history[-1].kind is not RunKind.REBASE
    return Match(Point(i, o, pos, rows), whole)


def point_at(pieces: Sequence[Piece], pos: int) -> Point | None:
    """The prompt's point at position ``pos`` (None inside an image or past the end)."""
    at = rows = 0
    for i, p in enumerate(pieces):
        if at == pos:
            return Point(i, 0, pos, rows)
        if at + p.n_pos > pos:
            return None if p.is_image else Point(i, pos - at, pos, rows + pos - at)
        at, rows = at + p.n_pos, rows + p.n_tokens
    return Point(len(pieces), 0, pos, rows) if at == pos else None


def cut_back(pieces: Sequence[Piece], end: Point, budget: int) -> Point:
    """The point ``budget`` rows before ``end`` (an image straddling it: before the image)."""
    i, o, pos, rows = end.piece, end.offset, end.pos, end.rows
    left = budget
    while left > 0 and (o > 0 or i > 0):
        if o == 0:
            i -= 1
            p = pieces[i]
            if p.is_image:
                left, pos, rows = left - p.n_tokens, pos - p.n_pos, rows - p.n_tokens
                continue
            o = len(p.tokens)
        take = min(o, left)
        o, left, pos, rows = o - take, left - take, pos - take, rows - take
    if i < len(pieces) and not pieces[i].is_image and o == len(pieces[i].tokens) and o:
        i, o = i + 1, 0
    return Point(i, o, pos, rows)


def on_history(ckpt: Checkpoint, history: Sequence[Run]) -> bool:
    """The checkpoint was taken on this sequence's history (chained digests: the whole
    prefix is the same)."""
    n = len(ckpt.history)
    return n <= len(history) and (n == 0 or history[n - 1].digest == ckpt.digest)


@attrs.frozen
class TailStart:
    """Where a tail plan starts: the (possibly split) pieces, the start, how many of the
    pieces are reused, the replay if any, and where the split is (None: no split)."""

    pieces: tuple[Piece, ...]
    start: Start
    reused: int
    replay: Replay | None
    split_at: int | None

    def moved(self, boundary: int) -> int:
        """A piece boundary of the layout's pieces, in the plan's pieces."""
        return boundary + 1 if self.split_at is not None and boundary > self.split_at else boundary


def split(pieces: tuple[Piece, ...], at: Point) -> tuple[tuple[Piece, ...], int, int | None]:
    """Cut ``pieces[at.piece]`` at ``at.offset``: (pieces, index of the first piece after the
    point, index of the split piece or None)."""
    if at.offset == 0:
        return pieces, at.piece, None
    p = pieces[at.piece]
    head = Piece(key=f"{p.key}[:{at.offset}]", tokens=p.tokens[: at.offset], sources=p.sources)
    tail = Piece(key=f"{p.key}[{at.offset}:]", tokens=p.tokens[at.offset:], sources=p.sources)
    return pieces[: at.piece] + (head, tail) + pieces[at.piece + 1:], at.piece + 1, at.piece


def tail_start(pieces: tuple[Piece, ...], view: CacheView, budget: ReplayBudget, *,
               limit: int) -> TailStart:
    """The start of a tail plan (see the module docstring); ``limit``: pieces[limit:] are
    prefilled whatever the sequence holds (a decoding plan's last piece)."""
    history = view.seq.history
    match = content_match(pieces, history, limit)
    end = match.end
    if end.rows == 0:
        return TailStart(pieces, Start(StartKind.CLEAR), 0, None, None)
    if match.whole and end.pos == view.seq.next_pos:
        out, reused, at = split(pieces, end)
        return TailStart(out, Start(StartKind.KEEP, pos=end.pos), reused, None, at)
    cut = cut_back(pieces, end, budget.rows(end.rows))
    ckpts = [c.checkpoint for c in view.state.checkpoints
             if c.checkpoint.kind is CheckpointKind.PARTIAL_ONLY and c.checkpoint.pos <= end.pos
             and on_history(c.checkpoint, history)]
    within = [c for c in ckpts if c.pos >= cut.pos and point_at(pieces, c.pos) is not None]
    if within:  # a restore point inside the budget: no new approximation
        ckpt = max(within, key=lambda c: c.pos)
        at = point_at(pieces, ckpt.pos)
        assert at is not None
        out, reused, split_at = split(pieces, at)
        return TailStart(out, Start(StartKind.TRUNCATE, pos=ckpt.pos, checkpoint=ckpt),
                         reused, None, split_at)
    if cut.pos == 0:
        return TailStart(pieces, Start(StartKind.CLEAR), 0, None, None)
    older = [c for c in ckpts if c.pos <= cut.pos] if budget.base == "checkpoint" else []
    base = max(older, key=lambda c: c.pos) if older else None
    out, reused, split_at = split(pieces, cut)
    replay = Replay(cut=cut.pos, base=base.pos if base is not None else 0,
                    rows=end.rows - cut.rows, matched=end.rows)
    return TailStart(out, Start(StartKind.REPLAY, pos=cut.pos, checkpoint=base), reused,
                     replay, split_at)


def position_after(pieces: Sequence[Piece], n: int) -> int:
    """The position after ``pieces[:n]`` (prompts start at position 0)."""
    return sum(p.n_pos for p in pieces[:n])
