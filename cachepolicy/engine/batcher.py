"""Decode steps of concurrent generations, gathered into llama_decode calls of ONE shape.

llama.cpp picks its kernels by the number of rows a computation has, and with one KV stream
per sequence it splits a call into one computation per run of *consecutive* stream ids.  So
the rows of arbitrary sequences (ids 0, 3, 5 …) are computed one by one, while rows of
consecutive streams share one computation.  To make a sequence's tokens independent of who
else is decoding, every generation decodes in a **lane**: one of ``rows`` consecutive spare
sequences.  At the start of a generation the sequence is copied into a free lane
(``llama_memory_seq_cp``: KV cells and recurrent state, cell for cell); every call feeds all
``rows`` lanes at once — a lane without a generation gets a pad row (a fixed token at
position 0 of the empty lane, removed after the call) — so every call is one computation of
exactly ``rows`` rows.  Measured: at a fixed row count a row's logits do not depend on the
other rows' tokens, context lengths or order.  The generated tokens live in the lane, which
is cleared when the generation ends: the episode's own sequence keeps its prompt.

Continuous batching without a background task (a combining lock): a generation puts its row
in ``pending`` and waits; a call runs when every lane with a generation in progress has its
row in (a generation between tokens only samples, so this is a short wait), run by whichever
of them finds no call running (the leader), under the engine lock.  A generation joins by
taking a lane and leaves by giving it back: between tokens.  With more generations than
lanes, the extra ones wait for a lane.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import attrs
import numpy as np

from cachepolicy.engine.errors import ContextFullError

#: (lane, token, position) rows of one call, every lane once, in lane order → the real rows'
#: logits (None for pads) and the seconds llama_decode took
RunLanes = Callable[[Sequence[tuple[int, int | None, int]]],
                    tuple[list[np.ndarray | None], float]]
CopyIn = Callable[[int, int], int]  # (sequence, lane) → the lane's next position
Clear = Callable[[int], None]


@attrs.frozen
class DecodeStats:
    calls: int
    rows: int  # real rows (generated tokens fed back)
    seconds: float  # inside the llama_decode calls

    def __sub__(self, other: DecodeStats) -> DecodeStats:
        return DecodeStats(self.calls - other.calls, self.rows - other.rows,
                           self.seconds - other.seconds)

    def as_dict(self) -> dict[str, float]:
        return {"calls": self.calls, "rows": self.rows, "seconds": self.seconds,
                "rows_per_call": self.rows / self.calls if self.calls else 0.0,
                "tokens_per_s": self.rows / self.seconds if self.seconds else 0.0}


@attrs.define(eq=False)
class Lane:
    """A generation in progress: its lane and the lane's next position."""

    lane: int
    pos: int
    batcher: DecodeBatcher

    def decode(self, token: int) -> np.ndarray:
        """Feed ``token``; returns its logits (blocks until its call has run)."""
        return self.batcher.decode(self, token)


class DecodeBatcher:
    def __init__(self, *, lanes: Sequence[int], n_ctx: int, run_lanes: RunLanes,
                 copy_in: CopyIn, clear: Clear) -> None:
        lanes = tuple(lanes)
        if not lanes or list(lanes) != list(range(lanes[0], lanes[0] + len(lanes))):
            raise ValueError("decode lanes must be consecutive sequence ids")
        self.lanes, self.rows, self.n_ctx = lanes, len(lanes), n_ctx
        self._run_lanes, self._copy_in, self._clear = run_lanes, copy_in, clear
        self._cv = threading.Condition()
        self._busy: dict[int, Lane] = {}  # lane id → the generation holding it
        self._pending: dict[int, int] = {}  # lane id → token waiting for a call
        self._results: dict[int, np.ndarray | BaseException] = {}
        self._running = False
        self.calls = 0  # llama_decode calls made (for measurements)
        self.real_rows = 0  # rows that were not padding
        self.call_s = 0.0  # seconds inside those calls

    def stats(self) -> DecodeStats:
        """Counters so far (take two and subtract for one run)."""
        with self._cv:
            return DecodeStats(self.calls, self.real_rows, self.call_s)

    @property
    def waiting(self) -> int:
        """Rows waiting for a call."""
        return len(self._pending)

    @contextmanager
    def generating(self, seq: int) -> Iterator[Lane]:
        """A lane holding a copy of ``seq`` for one generation (waits for a free lane)."""
        with self._cv:
            # no call may be between choosing its pad lanes and running while we copy
            self._cv.wait_for(lambda: len(self._busy) < self.rows and not self._running)
            lane_id = next(lane for lane in self.lanes if lane not in self._busy)
            lane = self._busy[lane_id] = Lane(lane_id, 0, self)
        try:
            lane.pos = self._copy_in(seq, lane_id)
            yield lane
        finally:
            try:
                self._clear(lane_id)
            finally:
                with self._cv:
                    del self._busy[lane_id]
                    self._pending.pop(lane_id, None)
                    self._cv.notify_all()  # a call may have been waiting for this row

    def decode(self, lane: Lane, token: int) -> np.ndarray:
        if lane.pos >= self.n_ctx:
            raise ContextFullError(f"decode lane {lane.lane} is at position {lane.pos}; "
                                   f"n_ctx_per_seq={self.n_ctx}")
        with self._cv:
            self._pending[lane.lane] = token
            self._cv.notify_all()
            while lane.lane not in self._results:
                if self._running or set(self._busy) - set(self._pending):
                    self._cv.wait()  # a call is running, or a generation is sampling
                    continue
                rows = [(lid, self._pending.pop(lid), self._busy[lid].pos)
                        if lid in self._busy else (lid, None, 0) for lid in self.lanes]
                self._running = True
                break
            else:
                return self._take(lane)
        elapsed = 0.0
        try:  # the leader runs the call outside the condition (the engine lock is inside)
            logits, elapsed = self._run_lanes(rows)
            results: list[np.ndarray | BaseException | None] = list(logits)
        except BaseException as exc:  # every row of the call gets the failure (re-raised)
            results = [exc] * len(rows)
        with self._cv:
            self.call_s += elapsed
            for (lid, token, _), result in zip(rows, results):
                if token is not None:
                    self._results[lid] = result  # type: ignore[assignment]
                    self._busy[lid].pos += 1
                    self.real_rows += 1
            self._running = False
            self.calls += 1
            self._cv.notify_all()
            return self._take(lane)

    def yield_round(self, timeout: float = 1.0) -> None:
        """Called by a prefill between pieces: when decode rows are waiting or running, wait
        until one more call has completed (decoding is the end of some agent's critical path:
        its next token goes before the next piece of anyone's prefill).  Bounded."""
        with self._cv:
            if not (self._pending or self._running):
                return
            start = self.calls
            self._cv.wait_for(lambda: self.calls > start, timeout)

    def _take(self, lane: Lane) -> np.ndarray:
        result = self._results.pop(lane.lane)
        if isinstance(result, BaseException):
            raise result
        return result
