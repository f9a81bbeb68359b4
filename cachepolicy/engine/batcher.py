"""Decode calls of concurrent generations, each in a shape of one measured row class.

Every generation decodes in a **lane**: a spare sequence holding a copy of the episode's
sequence (``llama_memory_seq_cp``: KV cells and recurrent state, cell for cell), so the
episode's own sequence keeps its prompt; the lane is cleared when the generation ends.  How
calls are formed is the engine's ``DecodeShape`` (``row_classes``):

* **LANES** — generations share calls, one token each.  llama.cpp computes a call's rows in
  one computation only when their sequence ids are consecutive, so a call spans the lanes
  from the lowest to the highest generation holding one; lanes without a generation inside
  that span, and lanes added until the row count reaches the smallest of the shape's class
  (``DecodeShape.pad_to``), feed a pad row (a fixed token at position 0 of the empty lane,
  removed after the call).  Every call's row count lies in one class, so a generation's
  tokens are the same alone or beside others.  Continuous batching without a background
  task (a combining lock): a generation puts its row in ``pending`` and waits; a call runs
  when every lane holding a generation has its row in, run by whichever of them finds no
  call running (the leader), under the engine lock.
* **RUNS** — a call holds one generation's run of ``min_run``..``max_run`` tokens
  (``Lane.feed``): the tokens it knows (the last sampled one, tokens the grammar forces) and
  tokens it guesses (drafts), the guesses rolled back by ``Lane.keep`` when sampling rejects
  them.  A recurrent lane cannot drop tokens from its state: the lane snapshots its
  recurrent state before a call with guesses, and a rollback restores it and trims the
  attention part, the kept tokens of that call re-fed at the head of the next one
  (``Lane.pending``).  A run shorter than ``min_run`` is padded with pad tokens, rolled back
  the same way.  Calls of different generations take turns.  A generation without a
  grammar in a shape with ``DecodeShape.free_text_alone`` (the default runs shape;
  ``generating(free_text=True)``) decodes **alone**: one token per call — one-row calls,
  their own class, taking turns with the runs.

A generation joins by taking a lane and leaves by giving it back: between calls.  With more
generations than lanes, the extra ones wait for a lane.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

import attrs
import numpy as np

from cachepolicy.engine.errors import ContextFullError
from cachepolicy.engine.records import PAD_TOKEN
from cachepolicy.engine.row_classes import DecodeMode, DecodeShape, feed_chunks


class LaneDecoder(Protocol):
    """The decoder's lane calls (``cachepolicy.engine.decoder.Decoder``)."""

    def run_lanes(self, rows: Sequence[tuple[int, int | None, int]],
                  ) -> tuple[list[np.ndarray | None], float]: ...

    def run_tokens(self, lane: int, tokens: Sequence[int], pos0: int,
                   ) -> tuple[list[np.ndarray], float]: ...

    def copy_to_lane(self, seq: int, lane: int) -> int: ...

    def clear_lane(self, lane: int) -> None: ...

    def snapshot_lane(self, lane: int) -> bytes: ...

    def rewind_lane(self, lane: int, pos: int, snapshot: bytes | None) -> None: ...


@attrs.frozen
class DecodeStats:
    calls: int = 0
    rows: int = 0  # real rows fed (generated tokens, re-fed ones and guesses included)
    seconds: float = 0.0  # inside the llama_decode calls
    pad_rows: int = 0  # rows fed only to keep a call in its class
    tokens: int = 0  # tokens the generations emitted after their first
    forced: int = 0  # of them: taken because the grammar admitted nothing else
    drafted: int = 0  # guessed tokens fed for verification
    accepted: int = 0  # drafted tokens that sampling confirmed
    rewinds: int = 0  # rollbacks of rejected guesses

    def __sub__(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(*(a - b for a, b in zip(attrs.astuple(self),
                                                   attrs.astuple(other), strict=True)))

    def __add__(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(*(a + b for a, b in zip(attrs.astuple(self),
                                                   attrs.astuple(other), strict=True)))

    def as_dict(self) -> dict[str, float]:
        return {**attrs.asdict(self),
                "rows_per_call": self.rows / self.calls if self.calls else 0.0,
                "tokens_per_call": self.tokens / self.calls if self.calls else 0.0,
                "tokens_per_s": self.tokens / self.seconds if self.seconds else 0.0,
                "acceptance": self.accepted / self.drafted if self.drafted else 0.0}


@attrs.define(eq=False)
class _Speculation:
    """What ``Lane.keep`` needs after a feed whose last call held guesses."""

    fed: list[int]  # every token of the feed (re-fed pending ones first, pads last)
    n_pending: int  # how many of ``fed`` were re-fed pending tokens
    chunk_start: int  # index in ``fed`` where the last call began
    chunk_pos: int  # the lane's position where the last call began
    snapshot: bytes | None  # the recurrent state at ``chunk_pos`` (recurrent lanes)


@attrs.define(eq=False)
class Lane:
    """A generation in progress: its lane, the lane's next position and (RUNS, recurrent
    models) tokens that follow but are not in the lane's state yet."""

    lane: int
    pos: int
    batcher: DecodeBatcher
    pending: list[int] = attrs.Factory(list)
    _spec: _Speculation | None = None
    alone: bool = False  # RUNS shape: one-row calls of this generation's tokens instead

    @property
    def runs(self) -> bool:
        """Whether this lane decodes in runs (several tokens per call)."""
        return self.batcher.shape.mode is DecodeMode.RUNS and not self.alone

    @property
    def max_guesses(self) -> int:
        """The most guesses one feed may carry (0: lane calls take no guesses)."""
        shape = self.batcher.shape
        return shape.max_run - shape.min_run if self.runs else 0

    def decode(self, token: int) -> np.ndarray:
        """Feed one token; returns its logits (blocks until its call has run)."""
        return self.feed([token], certain=1)[0]

    def feed(self, tokens: Sequence[int], *, certain: int) -> list[np.ndarray]:
        """Feed ``tokens`` (the first ``certain`` of them known, the rest guesses) and return
        each one's logits.  With guesses, ``keep`` must follow before the next feed."""
        if self._spec is not None:
            raise RuntimeError("keep() the last feed's tokens before feeding more")
        if not 1 <= certain <= len(tokens):
            raise ValueError("a feed starts with at least one known token")
        return self.batcher.feed(self, list(tokens), certain)

    def keep(self, n: int) -> None:
        """After a feed with guesses: the lane keeps the feed's first ``n`` tokens."""
        self.batcher.keep(self, n)


class DecodeBatcher:
    def __init__(self, *, lanes: Sequence[int], n_ctx: int, shape: DecodeShape,
                 decoder: LaneDecoder, recurrent: bool) -> None:
        lanes = tuple(lanes)
        if not lanes or list(lanes) != list(range(lanes[0], lanes[0] + len(lanes))):
            raise ValueError("decode lanes must be consecutive sequence ids")
        self.all_lanes, self.n_ctx, self.recurrent = lanes, n_ctx, recurrent
        self._decoder = decoder
        self._cv = threading.Condition()
        self._busy: dict[int, Lane] = {}  # lane id → the generation holding it
        self._pending: dict[int, int] = {}  # LANES: lane id → token waiting for a call
        self._results: dict[int, np.ndarray | BaseException] = {}
        self._waiting = 0  # RUNS: calls waiting for their turn
        #: generations waiting for a lane: a lane call waits for them to join while a lane
        #: is free (between two calls, else a busy engine's next call always wins the race
        #: and a newcomer waits for every running generation to end)
        self._lane_waiters = 0
        self._running = False
        self._exclusive = False  # a caller feeds every lane itself (``exclusive``)
        self._stats = DecodeStats()
        self.shape = shape
        self.set_shape(shape)

    def set_shape(self, shape: DecodeShape) -> None:
        """Change how calls are formed (only while no generation holds a lane)."""
        with self._cv:
            if self._busy:
                raise RuntimeError("the decode shape changes only between generations")
            if shape.lanes > len(self.all_lanes):
                raise ValueError(f"{shape.lanes} lanes asked, {len(self.all_lanes)} allocated")
            self.shape = shape
            self.lanes = self.all_lanes[:shape.lanes]

    @property
    def rows(self) -> int:
        """Generations that can decode at once."""
        return len(self.lanes)

    @property
    def calls(self) -> int:
        return self._stats.calls

    @property
    def real_rows(self) -> int:
        return self._stats.rows

    def stats(self) -> DecodeStats:
        """Counters so far (take two and subtract for one run)."""
        with self._cv:
            return self._stats

    def note(self, stats: DecodeStats) -> None:
        """Add a generation's own counts (tokens, forced, drafted, accepted)."""
        with self._cv:
            self._stats = self._stats + stats

    @property
    def waiting(self) -> int:
        """Rows or runs waiting for a call."""
        return len(self._pending) + self._waiting

    @contextmanager
    def generating(self, seq: int, *, free_text: bool = False) -> Iterator[Lane]:
        """A lane holding a copy of ``seq`` for one generation (waits for a free lane).
        ``free_text``: no grammar constrains it — in a shape with ``free_text_alone`` (read
        with the lane taken, so a shape change cannot slip in between) its tokens go one
        per call (one-row calls)."""
        with self._cv:
            # no call may be between choosing its pad lanes and running while we copy
            self._lane_waiters += 1
            try:
                self._cv.wait_for(lambda: len(self._busy) < self.rows and not self._running
                                  and not self._exclusive)
            finally:
                self._lane_waiters -= 1
            lane_id = next(lane for lane in self.lanes if lane not in self._busy)
            # free_text_alone is set on runs shapes only (``choose_shape``)
            alone = free_text and self.shape.free_text_alone
            lane = self._busy[lane_id] = Lane(lane_id, 0, self, alone=alone)
            self._cv.notify_all()  # a lane call may be waiting for this generation to join
        try:
            lane.pos = self._decoder.copy_to_lane(seq, lane_id)
            yield lane
        finally:
            try:
                self._decoder.clear_lane(lane_id)
            finally:
                with self._cv:
                    del self._busy[lane_id]
                    self._pending.pop(lane_id, None)
                    self._cv.notify_all()  # a call may have been waiting for this row

    @contextmanager
    def exclusive(self) -> Iterator[tuple[int, ...]]:
        """Every lane, for a caller that feeds them itself (the engine's ``raw_decode``):
        waits until no generation holds a lane; generations wait until it is done."""
        with self._cv:
            self._cv.wait_for(lambda: not (self._busy or self._running or self._exclusive))
            self._exclusive = True
        try:
            yield self.all_lanes
        finally:
            with self._cv:
                self._exclusive = False
                self._cv.notify_all()

    # ------------------------------------------------------------------ feeding

    def feed(self, lane: Lane, tokens: list[int], certain: int) -> list[np.ndarray]:
        shape = self.shape
        if shape.mode is DecodeMode.LANES:
            if len(tokens) != 1 or lane.pending:
                raise ValueError("lane calls feed one token per generation")
            self._check_room(lane, 1)
            return [self._shared(lane, tokens[0])]
        if lane.alone:
            if len(tokens) != 1 or certain != 1:
                raise ValueError("a generation decoding alone feeds one known token per call")
            self._check_room(lane, 1)
            rows = self._solo(lane, tokens, 0)
            lane.pos += 1
            return rows
        fed = lane.pending + tokens
        n_pending, n_known = len(lane.pending), len(lane.pending) + certain
        pads = max(0, shape.min_run - len(fed))
        fed += [PAD_TOKEN] * pads
        sizes = feed_chunks(n_known, len(fed) - n_known, shape.min_run, shape.max_run)
        self._check_room(lane, len(fed))
        rows: list[np.ndarray] = []
        start = 0
        for i, size in enumerate(sizes):
            guessing = i == len(sizes) - 1 and start + size > n_known
            snapshot = (self._decoder.snapshot_lane(lane.lane)
                        if guessing and self.recurrent else None)
            if guessing:
                lane._spec = _Speculation(fed, n_pending, start, lane.pos, snapshot)
            rows += self._solo(lane, fed[start:start + size], pads if i == len(sizes) - 1 else 0)
            lane.pos += size
            start += size
        lane.pending = []
        if lane._spec is not None and n_known == len(fed) - pads:
            self.keep(lane, len(tokens))  # only pads were guesses: roll them back now
        return rows[n_pending:n_pending + len(tokens)]

    def keep(self, lane: Lane, n: int) -> None:
        spec = lane._spec
        if spec is None:
            return
        lane._spec = None
        kept = spec.n_pending + n  # tokens of ``fed`` that stay
        if not spec.chunk_start <= kept <= len(spec.fed):
            raise ValueError(f"keep({n}) would drop tokens before the last call")
        if kept == len(spec.fed):
            return
        with self._cv:
            self._stats = attrs.evolve(self._stats, rewinds=self._stats.rewinds + 1)
        if self.recurrent:  # back to the call's start; its kept tokens are re-fed next time
            self._decoder.rewind_lane(lane.lane, spec.chunk_pos, spec.snapshot)
            lane.pos = spec.chunk_pos
            lane.pending = spec.fed[spec.chunk_start:kept]
        else:
            lane.pos = spec.chunk_pos + kept - spec.chunk_start
            self._decoder.rewind_lane(lane.lane, lane.pos, None)

    def _check_room(self, lane: Lane, n: int) -> None:
        if lane.pos + n > self.n_ctx:
            raise ContextFullError(f"decode lane {lane.lane} is at position {lane.pos}; "
                                   f"{n} more exceed n_ctx_per_seq={self.n_ctx}")

    # ------------------------------------------------------------------ RUNS: one call each

    def _solo(self, lane: Lane, tokens: list[int], pads: int) -> list[np.ndarray]:
        with self._cv:
            self._waiting += 1
            self._cv.notify_all()
            self._cv.wait_for(lambda: not self._running)
            self._waiting -= 1
            self._running = True
        elapsed = 0.0
        try:
            rows, elapsed = self._decoder.run_tokens(lane.lane, tokens, lane.pos)
        finally:
            with self._cv:
                self._running = False
                self._stats = attrs.evolve(
                    self._stats, calls=self._stats.calls + 1,
                    rows=self._stats.rows + len(tokens) - pads,
                    pad_rows=self._stats.pad_rows + pads, seconds=self._stats.seconds + elapsed)
                self._cv.notify_all()
        return rows

    # ------------------------------------------------------------------ LANES: shared calls

    def _shared(self, lane: Lane, token: int) -> np.ndarray:
        with self._cv:
            self._pending[lane.lane] = token
            self._cv.notify_all()
            while lane.lane not in self._results:
                if (self._running or set(self._busy) - set(self._pending)
                        or (self._lane_waiters and len(self._busy) < self.rows)):
                    # a call is running, a generation is sampling, or one is taking a lane
                    self._cv.wait()
                    continue
                rows = self._lane_rows()
                self._running = True
                break
            else:
                return self._take(lane)
        elapsed = 0.0
        try:  # the leader runs the call outside the condition (the engine lock is inside)
            logits, elapsed = self._decoder.run_lanes(rows)
            results: list[np.ndarray | BaseException | None] = list(logits)
        except BaseException as exc:  # every row of the call gets the failure (re-raised)
            results = [exc] * len(rows)
        with self._cv:
            real = 0
            for (lid, tok, _), result in zip(rows, results):
                if tok is not None:
                    self._results[lid] = result  # type: ignore[assignment]
                    self._busy[lid].pos += 1
                    real += 1
            self._stats = attrs.evolve(
                self._stats, calls=self._stats.calls + 1, rows=self._stats.rows + real,
                pad_rows=self._stats.pad_rows + len(rows) - real,
                seconds=self._stats.seconds + elapsed)
            self._running = False
            self._cv.notify_all()
            return self._take(lane)

    def _lane_rows(self) -> list[tuple[int, int | None, int]]:
        """The call's rows (under the condition): the consecutive lanes from the lowest to
        the highest waiting generation, grown with empty lanes to the class's row count."""
        ids = sorted(self._pending)
        lo, hi = ids[0], ids[-1]
        want = self.shape.pad_to(hi - lo + 1)
        first, last = self.lanes[0], self.lanes[-1]
        while hi - lo + 1 < want:  # every lane outside [lo, hi] is empty: all are waiting
            if hi < last:
                hi += 1
            else:
                lo -= 1
        assert first <= lo, "the class fits the lanes"
        return [(lid, self._pending.pop(lid), self._busy[lid].pos) if lid in self._pending
                else (lid, None, 0) for lid in range(lo, hi + 1)]

    def yield_round(self, timeout: float = 1.0) -> None:
        """Called by a prefill between pieces: while generations hold lanes, wait until every
        one holding a lane now has ended (at most ``timeout`` s).  A generation is the end of
        some agent's critical path, so its remaining tokens go before the next piece of
        anyone's prefill.  Waiting for one call only (one token per piece, as before) let
        the next step's prefill run between a generation's tokens: on one thread an answer
        then came out only once the step admitted after it had prefilled, the two answers
        together — behind ``kvagent serve`` at N = 4 the clients' VM pauses lined up and
        the server idled (docs/benchmarks.md §10, "The attention model at N = 4: kamera@own
        beside relocate, and why the server idled").  A generation
        longer than ``timeout`` lets one piece through per ``timeout``."""
        with self._cv:
            now = set(self._busy.values())
            if not now:
                return
            self._cv.wait_for(lambda: not now.intersection(self._busy.values()), timeout)

    def _take(self, lane: Lane) -> np.ndarray:
        result = self._results.pop(lane.lane)
        if isinstance(result, BaseException):
            raise result
        return result
