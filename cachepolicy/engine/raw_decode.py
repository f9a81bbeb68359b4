"""Decode calls straight to llama.cpp on copies of one sequence in the decode lanes — no
batcher, no sampling, no counters: the reference rows of the oracle's decode-shape checks
and the per-call costs ``kvagent bench-decode`` measures (``Engine.raw_decode``).

While a ``RawLanes`` is open it holds every decode lane (``DecodeBatcher.exclusive``):
generations wait for it, so its calls are the only ones in the lanes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from cachepolicy.engine.batcher import DecodeBatcher, LaneDecoder


class RawLanes:
    """Copies of one sequence in ``n`` decode lanes, each at its own next position; every
    call advances the positions of the lanes it fed (mutates the lanes only)."""

    def __init__(self, decoder: LaneDecoder, lanes: tuple[int, ...], pos: list[int]) -> None:
        self._decoder = decoder
        self.lanes = lanes  # the lanes' sequence ids, lowest first
        self._pos = pos

    def run_tokens(self, tokens: Sequence[int]) -> list[np.ndarray]:
        """One llama_decode of ``tokens`` in the first lane (a run); every row's logits.
        A run longer than a call's rows is a ``ValueError`` (before llama.cpp sees it)."""
        rows, _ = self._decoder.run_tokens(self.lanes[0], list(tokens), self._pos[0])
        self._pos[0] += len(tokens)
        return rows

    def run_lanes(self, token: int, rows: int) -> list[np.ndarray]:
        """One llama_decode of ``token`` in each of the first ``rows`` lanes (a lane call of
        ``rows`` rows, no padding); each row's logits."""
        if not 1 <= rows <= len(self.lanes):
            raise ValueError(f"a lane call of {rows} rows on {len(self.lanes)} lane(s)")
        logits, _ = self._decoder.run_lanes(
            [(self.lanes[i], token, self._pos[i]) for i in range(rows)])
        for i in range(rows):
            self._pos[i] += 1
        return [row for row in logits if row is not None]


@contextmanager
def raw_lanes(decoder: LaneDecoder, batcher: DecodeBatcher, seq: int,
              n: int) -> Iterator[RawLanes]:
    """``n`` decode lanes holding copies of ``seq`` (every lane held while open; the copies
    cleared on exit)."""
    with batcher.exclusive() as lanes:
        if not 1 <= n <= len(lanes):
            raise ValueError(f"{n} raw lanes asked, {len(lanes)} allocated")
        used: list[int] = []
        try:
            pos = []
            for lane in lanes[:n]:
                used.append(lane)
                pos.append(decoder.copy_to_lane(seq, lane))
            yield RawLanes(decoder, lanes[:n], pos)
        finally:
            for lane in used:
                decoder.clear_lane(lane)
