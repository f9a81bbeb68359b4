"""Carrying out a plan's ``Splice`` on the engine (attention-only models): the executor's
part that writes screenshots' KV rows into a sequence and fills the episode's store.

Synchronous, like the executor.  What it costs, per step (``Execution.splice_s``): one read
of the sequence's state (``llama_state_seq_get_data``: the whole sequence copied out), the
re-rotation of the placed units' keys and the patch's rank-m product in numpy (float64), and
one write of the composed state (``llama_state_seq_set_data``: the whole sequence copied in
— llama.cpp's supported way to put cells at chosen positions; ``seq_add`` cannot insert a
unit before cells the sequence holds).  Storing a unit costs a forward of the canonical
context and the unit on the spare sequence (``store_tokens``) and the patch's SVD; a unit
is stored at the plan's start, from the rows the sequence holds for it from an earlier step
(``store_held_units``).
"""

from __future__ import annotations

import time

import numpy as np

from cachepolicy.engine.checkpoint import Run, RunKind, chain_digest, history_digest
from cachepolicy.engine.kv_blob import KvRows
from cachepolicy.engine.kv_patch import StoredKv, make_patch, place, relocate
from cachepolicy.engine.kv_rope import TEXT_STEP
from cachepolicy.errors import PolicyError
from cachepolicy.pieces import Piece
from cachepolicy.plan import Plan, StoredEntry
from cachepolicy.splice import Drop, PlaceUnit, Source, StoreUnit, image_identity

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cachepolicy.engine import Engine

#: a placed run's digest tag: no exact history's digest can equal it
_PLACED = b"placed:"


def held_rows(engine: Engine, seq: int, plan: Plan) -> KvRows | None:
    """The sequence's rows before the step's start, if a unit is placed or stored from
    them."""
    if plan.splice is None or not (
            any(u.source is Source.SEQUENCE for u in plan.splice.place)
            or plan.splice.store):
        return None
    if engine.seq_info(seq).n_tokens == 0:
        raise PolicyError("a unit is placed from the sequence, which holds nothing")
    return engine.kv_read_attention(seq)


def _image_span(pieces: tuple[Piece, ...], pos0: int) -> tuple[int, int]:
    """Positions of the unit's image piece when the unit starts at ``pos0``."""
    p = pos0
    for piece in pieces:
        if piece.is_image:
            return p, p + piece.n_pos
        p += piece.n_pos
    return p, p


def _thin(rows: KvRows, span: tuple[int, int], unit: PlaceUnit) -> KvRows:
    """``rows`` with the image cells beyond ``unit.keep`` dropped (randomly or oldest first)."""
    in_image = np.nonzero((rows.pos >= span[0]) & (rows.pos < span[1]))[0]
    if unit.keep is None or unit.keep >= len(in_image):
        return rows
    if unit.drop is Drop.OLDEST:
        order = in_image[np.argsort(rows.pos[in_image], kind="stable")]
        dropped = order[: len(in_image) - unit.keep]
    else:
        rng = np.random.default_rng(unit.seed)
        dropped = rng.choice(in_image, size=len(in_image) - unit.keep, replace=False)
    mask = np.ones(rows.n_cells, dtype=bool)
    mask[dropped] = False
    return rows.take(mask)


def _unit_rows(engine: Engine, unit: PlaceUnit, pieces: tuple[Piece, ...], pos0: int,
               held: KvRows | None, stored: dict[str, StoredKv]) -> KvRows:
    n_pos = sum(p.n_pos for p in pieces)
    if unit.source is Source.STORE:
        entry = stored.get(unit.entry_label)
        if entry is None:
            raise PolicyError(f"no store entry for {unit.entry_label}")
        if unit.part is not None:
            entry = entry.part(*unit.part)
        rows = place(engine.rope, entry, pos0)
    else:
        assert held is not None
        old = held.between(unit.held_pos0, unit.held_pos0 + n_pos)
        if old.n_cells == 0:
            raise PolicyError(f"the sequence holds no cell of {unit.label}")
        rows = _thin(relocate(engine.rope, old, pos0 - unit.held_pos0,
                              _steps(engine, pieces, unit.held_pos0, old)),
                     _image_span(pieces, pos0), unit)
    if rows.n_cells and (rows.pos.min() < pos0 or rows.pos.max() >= pos0 + n_pos):
        raise PolicyError(f"{unit.label}'s rows do not fit its {n_pos} positions")
    return rows


def _steps(engine: Engine, pieces: tuple[Piece, ...], pos0: int,
           rows: KvRows) -> np.ndarray | None:
    """How each cell's M-RoPE components follow its unit's start (None: one position per
    row): a text cell's ``TEXT_STEP``, an image's cells mtmd's step for that image."""
    if not engine.rope.multi_section:
        return None
    steps = np.tile(np.asarray(TEXT_STEP, dtype=np.int64), (rows.n_cells, 1))
    p = pos0
    for piece in pieces:
        if piece.image is not None and piece.image.png is not None:
            image = engine.encode_image(piece.image.png, image_id=piece.image.image_id)
            steps[(rows.pos >= p) & (rows.pos < p + piece.n_pos)] = image.pos_step
        p += piece.n_pos
    return steps


def _runs(history: list[Run], pieces: tuple[Piece, ...], rows: KvRows, pos0: int,
          source: Source) -> list[Run]:
    """One run per placed piece (cells it holds, positions it spans), digests tagged."""
    out, prev, p = [], history_digest(tuple(history)), pos0
    for piece in pieces:
        cells = int(np.count_nonzero((rows.pos >= p) & (rows.pos < p + piece.n_pos)))
        kind = RunKind.EMBEDDINGS if piece.is_image else RunKind.TEXT
        content = (piece.image_id or "").encode() if piece.is_image else \
            np.asarray(piece.tokens, dtype=np.int32).tobytes()
        prev = chain_digest(prev, kind, _PLACED + source.value.encode() + content)
        out.append(Run(kind, p, piece.n_pos, cells, prev,
                       () if piece.is_image else tuple(piece.tokens)))
        p += piece.n_pos
    return out


def write_units(engine: Engine, seq: int, plan: Plan, at: int, held: KvRows | None,
                stored: dict[str, StoredKv]) -> int:
    """Place the plan's units that start at piece ``at`` and follow each other; returns
    the index of the first piece after them."""
    assert plan.splice is not None
    by_first = {u.first: u for u in plan.splice.place}
    info = engine.seq_info(seq)
    history, pos = list(info.history), info.next_pos
    parts = [engine.kv_read_attention(seq)] if info.n_tokens else []
    i = at
    while i in by_first:
        unit = by_first[i]
        pieces = plan.pieces[i: i + unit.n_pieces]
        rows = _unit_rows(engine, unit, pieces, pos, held, stored)
        runs = _runs(history, pieces, rows, pos, unit.source)
        history += runs
        parts.append(rows)
        pos = runs[-1].end_pos
        i += unit.n_pieces
    engine.kv_write_attention(seq, KvRows.concat([p for p in parts if p.n_cells]), history)
    return i


def store_held_units(engine: Engine, seq: int, scratch: int | None, plan: Plan,
                     held: KvRows | None) -> tuple[tuple[StoredEntry, ...], int]:
    """At the plan's start (before the trim): the store entries of the units the sequence
    holds from an earlier step (``StoreUnit.held_pos0``), from ``held``, its rows then."""
    assert plan.splice is not None
    units = plan.splice.store
    if not units:
        return (), 0
    assert held is not None
    jobs = []
    for unit in units:
        n_pos = sum(p.n_pos for p in plan.pieces[unit.first: unit.first + unit.n_pieces])
        jobs.append((unit, held.between(unit.held_pos0, unit.held_pos0 + n_pos)))
    return _store(engine, seq, scratch, plan, held, jobs)


def _store(engine: Engine, seq: int, scratch: int | None, plan: Plan, rows: KvRows,
           jobs: list[tuple[StoreUnit, KvRows]]) -> tuple[tuple[StoredEntry, ...], int]:
    """Canonical KV on ``scratch`` + the patch to each unit's own rows; ``rows`` hold the
    sequence's head (the canonical context) as the sequence's history describes it."""
    assert plan.splice is not None
    if scratch is None:
        raise PolicyError("storing screenshots needs the scheduler's spare sequence")
    history = engine.seq_info(seq).history
    # The canonical context is the episode's head, which the sequence holds exactly as a
    # forward of it would compute it (a state written back continues bitwise): its rows are
    # written into the spare sequence instead of prefilled again.
    n_prefix = plan.splice.canonical_prefix
    head_end = history[n_prefix - 1].end_pos
    engine.clear(scratch)
    engine.kv_write(scratch, rows.between(0, head_end), history[:n_prefix])
    tokens = 0
    base = engine.seq_info(scratch).next_pos
    out = []
    try:
        for unit, own in jobs:
            engine.truncate(scratch, base)
            for piece in plan.pieces[unit.first: unit.first + unit.n_pieces]:
                _prefill(engine, scratch, piece)
                tokens += piece.n_tokens
            canon = engine.kv_read(scratch).between(base, engine.seq_info(scratch).next_pos)
            patch = make_patch(engine.rope, own, canon, plan.splice.rank)
            image_id, part = image_identity(plan.pieces[unit.first: unit.first + unit.n_pieces])
            out.append(StoredEntry(unit.label, engine.kv_keep(canon, patch),
                                   image_id=image_id, image_part=part))
    finally:
        engine.clear(scratch)
    return tuple(out), tokens


def _prefill(engine: Engine, seq: int, piece: Piece) -> None:
    if piece.image is not None:
        assert piece.image.png is not None
        image = engine.encode_image(piece.image.png, image_id=piece.image.image_id)
        engine.prefill_image(seq, image, logits=False)
    else:
        engine.prefill_tokens(seq, piece.tokens, logits=False, allow_single=True)


class SpliceClock:
    """Seconds spent editing KV (reads, re-rotation, patches, writes) during a plan."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn, *args):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0
