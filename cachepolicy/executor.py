"""Carry out a plan on one engine sequence: start point, edits, prefill, checkpoints, decode.

Synchronous (run it in the engine's worker thread).  It publishes nothing: it returns what it
made, and the transaction decides whether that becomes the episode's state.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import numpy as np

from cachepolicy.engine.checkpoint import holds_shift, is_approximate
from cachepolicy.errors import PolicyError, Preempted
from cachepolicy.pieces import Piece
from cachepolicy.plan import NamedCheckpoint, Plan, StartKind, StoredEntry
from cachepolicy.splice import Source
from cachepolicy.splice_exec import (SpliceClock, held_rows, store_held_units,
                                     write_units)
from cachepolicy.engine.drafts import Drafting
from cachepolicy.engine.sampling import SamplingParams

if TYPE_CHECKING:  # the engine's type only: a thin client's imports reach this module
    from cachepolicy.engine import Engine


@attrs.frozen
class Execution:
    new_checkpoints: tuple[NamedCheckpoint, ...]
    output_tokens: tuple[int, ...]
    prefill_tokens: int
    prefill_s: float  # restore, edits, prefill and checkpoints (the vision encoder excluded)
    decode_s: float
    logits: np.ndarray | None = attrs.field(eq=False, repr=False)  # the prompt's last logits
    drift_kl: float | None = None
    drift_top1_agree: bool | None = None
    stopped_at: int | None = None  # a prefetch stopped early: pieces[:stopped_at] are in
    encode_s: float = 0.0  # the vision encoder, for images the embedding cache did not hold
    #: the sequence's state after the prefill is approximate (the engine's own record: its
    #: history holds a rebase — this plan's tail replay or an earlier one — or a run a
    #: removal shifted — relocate's, a token evictor's); or this plan spliced KV (kamera)
    approximate: bool = False
    replay_tokens: int = 0  # rows of the matched prefix this plan's tail replay recomputed
    #: KV splicing (``cachepolicy.splice``): the store entries this plan made, the tokens
    #: their canonical forwards prefilled (on the spare sequence), the seconds of the KV
    #: edits (reads, re-rotation, patches, writes: inside ``prefill_s``) and of the store
    #: (canonical forwards and SVDs: inside ``prefill_s`` too)
    new_stored: tuple[StoredEntry, ...] = ()
    store_tokens: int = 0
    splice_s: float = 0.0
    store_s: float = 0.0


class _EncodeClock:
    """Seconds spent in the vision encoder (cache misses) while a plan runs."""

    def __init__(self) -> None:
        self.seconds = 0.0


def _prefill_piece(engine: Engine, seq: int, piece: Piece, logits: bool,
                   clock: _EncodeClock) -> np.ndarray | None:
    if piece.image is not None:
        seg = piece.image
        assert seg.png is not None, "a screenshot segment must carry its PNG"
        t0 = time.perf_counter()
        image = engine.encode_image(seg.png, image_id=seg.image_id)
        clock.seconds += time.perf_counter() - t0
        return engine.prefill_image(seq, image, logits=logits)
    # A 1-token piece is fine here: every policy that is compared with another prefills the
    # same pieces with the same boundaries, so both paths take the same kernel.
    return engine.prefill_tokens(seq, piece.tokens, logits=logits, allow_single=True)


def _apply_start(engine: Engine, seq: int, plan: Plan) -> None:
    start = plan.start
    if start.kind is StartKind.CLEAR:
        engine.clear(seq)
    elif start.kind is StartKind.TRIM:
        engine.truncate(seq, start.pos)
    elif start.kind is StartKind.TRUNCATE:
        engine.truncate(seq, start.pos, via=start.checkpoint)
    elif start.kind is StartKind.RESTORE:
        assert start.checkpoint is not None
        engine.restore(seq, start.checkpoint)
    elif start.kind is StartKind.REPLAY:  # approximate: only tail plans start this way
        assert plan.tail and plan.replay is not None, "a replay start outside a tail plan"
        engine.replay_cut(seq, start.pos, base=start.checkpoint)
    elif engine.seq_info(seq).next_pos != start.pos:  # KEEP
        raise PolicyError("the sequence changed since the plan was made")


def _stop_strings(engine: Engine, stops: tuple[str, ...]) -> Callable[[list[int]], bool] | None:
    """True once the decoded text holds a stop string (only the tail is detokenized: a stop
    string of c characters lies within the last c tokens plus one)."""
    if not stops:
        return None
    tail = max(len(s) for s in stops) + 1

    def hit(tokens: list[int]) -> bool:
        text = engine.detokenize(tokens[-tail:])
        return any(s in text for s in stops)

    return hit


def kl_divergence(ref_logits: np.ndarray, logits: np.ndarray) -> float:
    """KL(softmax(ref) || softmax(logits)) in nats."""
    a = ref_logits.astype(np.float64) - ref_logits.max()
    b = logits.astype(np.float64) - logits.max()
    log_p = a - np.log(np.exp(a).sum())
    log_q = b - np.log(np.exp(b).sum())
    return float(np.sum(np.exp(log_p) * (log_p - log_q)))


def prefill(engine: Engine, plan: Plan, seq: int, *, scratch_seq: int | None = None,
            should_stop: Callable[[], bool] | None = None) -> Execution:
    """Phase 1 of a plan on ``seq``: start point, edits, pieces, checkpoints (and relocate's
    drift measurement).  ``should_stop`` is polled between pieces: a prefill-only plan (a
    prefetch) then stops there and reports ``stopped_at`` (what it did is valid and may be
    published); a decoding plan raises ``Preempted``.  Between pieces, the generations of
    other sequences decoding then finish first (``DecodeBatcher.yield_round``)."""
    t0 = time.perf_counter()
    clock = _EncodeClock()
    edit_clock = SpliceClock()
    held = edit_clock.timed(held_rows, engine, seq, plan)
    stored = ({e.label: e.kv for e in plan.splice_from} if plan.splice is not None else {})
    # units the sequence holds from an earlier step are stored first, from those rows (a
    # prefetch's work under overlap; the trim below would drop them)
    t_store = time.perf_counter()
    early: tuple[StoredEntry, ...] = ()
    store_tokens = 0
    if plan.splice is not None:
        early, store_tokens = store_held_units(engine, seq, scratch_seq, plan, held)
        stored.update({e.label: e.kv for e in early})
    store_s = time.perf_counter() - t_store
    placed_at = ({u.first for u in plan.splice.place} if plan.splice is not None
                 else set())
    # ``Splice.hold_until_placed``: no stop before the last unit placed from ``held`` — the
    # start below cuts those rows out of the sequence and they live only in this call, so a
    # prefetch stopped in between would publish the sequence without them (window-replay's
    # kept screenshots: its next step re-prefilled the whole window, a third of the steps
    # behind ``kvagent serve`` at N = 4, issue 48).  What lies before them is short (the new
    # history line).
    stop_from = (max((u.first + 1 for u in plan.splice.place if u.source is Source.SEQUENCE),
                     default=0)
                 if plan.splice is not None and plan.splice.hold_until_placed else 0)
    placed_tokens = 0
    _apply_start(engine, seq, plan)
    replayed = plan.replay.rows if plan.replay is not None else 0
    for edit in plan.edits:  # relocate: descending positions, so earlier spans stay valid
        engine.remove_range(seq, edit.p0, edit.p1)
    takes = {t.after_piece: t for t in plan.checkpoints}
    made: list[NamedCheckpoint] = []
    logits = None
    last = len(plan.pieces) - 1
    i = plan.reused_pieces
    while i < len(plan.pieces):
        if i in takes:  # (before a placed unit too: window-replay's region checkpoint)
            made.append(NamedCheckpoint(takes[i].label, engine.checkpoint(seq, takes[i].kind)))
        if i in placed_at:  # KV splicing: these units are written, not prefilled
            if plan.decode and i == last:
                raise PolicyError("a placed unit cannot be the last piece")
            after = edit_clock.timed(write_units, engine, seq, plan, i, held, stored)
            if any(b in takes for b in range(i + 1, after)):
                raise PolicyError("a checkpoint between placed units")
            placed_tokens += sum(p.n_tokens for p in plan.pieces[i:after])
            i = after
            continue
        # Decode rounds first (up to ~1 s since b569eb1), then the stop check: a critical
        # step that queued during the wait stops the prefetch before this piece.
        engine.yield_decode_round()
        if should_stop is not None and i >= stop_from and should_stop():
            if plan.decode:
                raise Preempted(f"stopped before piece {i}")
            return Execution(new_checkpoints=tuple(made), output_tokens=(),
                             prefill_tokens=sum(p.n_tokens for p in plan.pieces[
                                 plan.reused_pieces:i]) - placed_tokens,
                             prefill_s=time.perf_counter() - t0 - clock.seconds, decode_s=0.0,
                             logits=None, stopped_at=i, encode_s=clock.seconds,
                             approximate=_approximate(engine, seq) or placed_tokens > 0,
                             replay_tokens=replayed,
                             new_stored=early, store_tokens=store_tokens,
                             splice_s=edit_clock.seconds, store_s=store_s)
        logits = _prefill_piece(engine, seq, plan.pieces[i], plan.decode and i == last, clock)
        i += 1
    if len(plan.pieces) in takes:
        t = takes[len(plan.pieces)]
        made.append(NamedCheckpoint(t.label, engine.checkpoint(seq, t.kind)))
    if plan.decode and logits is None:
        raise PolicyError("a decoding plan must prefill at least its last piece")
    t1 = time.perf_counter()
    kl = agree = None
    if plan.drift_reference and scratch_seq is not None and logits is not None:
        engine.clear(scratch_seq)
        ref = None
        for j, piece in enumerate(plan.drift_reference):
            ref = _prefill_piece(engine, scratch_seq, piece,
                                 j == len(plan.drift_reference) - 1, _EncodeClock())
        engine.clear(scratch_seq)
        assert ref is not None
        kl = kl_divergence(ref, logits)
        agree = bool(int(np.argmax(ref)) == int(np.argmax(logits)))
    return Execution(new_checkpoints=tuple(made), output_tokens=(),
                     prefill_tokens=plan.prefill_tokens - placed_tokens,
                     prefill_s=t1 - t0 - clock.seconds,
                     decode_s=0.0, logits=logits, drift_kl=kl, drift_top1_agree=agree,
                     encode_s=clock.seconds,
                     approximate=_approximate(engine, seq) or plan.splice is not None,
                     replay_tokens=replayed, new_stored=early, store_tokens=store_tokens,
                     splice_s=edit_clock.seconds, store_s=store_s)


def _approximate(engine: Engine, seq: int) -> bool:
    """The sequence holds an approximate state: a tail replay's rebase (hybrids) or KV a
    removal shifted (attention models: relocate, the token evictors)."""
    history = engine.seq_info(seq).history
    return ((engine.kind.has_recurrent_state and is_approximate(history))
            or holds_shift(history))


def decode(engine: Engine, plan: Plan, seq: int, prefilled: Execution, *,
           decode_tokens: int = 16, sampling: SamplingParams | None = None,
           stop_at_eog: bool = False, should_stop: Callable[[], bool] | None = None,
           stop: tuple[str, ...] = (),
           on_token: Callable[[int], None] | None = None,
           drafting: Drafting | None = None) -> Execution:
    """Phase 2: generate from the prompt's logits.  It needs no engine slot of its own: it
    decodes in one of the engine's lanes (``DecodeBatcher``).  Decoding ends early once the
    text holds one of the ``stop`` strings."""
    if not plan.decode or prefilled.logits is None:
        return prefilled
    t0 = time.perf_counter()
    output = engine.generate(seq, prefilled.logits, decode_tokens, sampling,
                             stop_at_eog=stop_at_eog, should_stop=should_stop,
                             stop_when=_stop_strings(engine, stop), on_token=on_token,
                             drafting=drafting)
    return attrs.evolve(prefilled, output_tokens=tuple(output),
                        decode_s=time.perf_counter() - t0)
