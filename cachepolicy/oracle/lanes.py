"""The decode-lanes check: is a generation's every decode step bitwise the same alone as
while other generations share its llama_decode calls?  (``DecodeBatcher`` in the LANES
shape: a call's row count varies with the generations in it, padded to the smallest count
of one measured row class, so a lone generation and a crowded one take the same kernels;
on a mixture-of-experts model the lanes are capped.)  The oracle runs it in the LANES shape
whichever shape the engine decodes in.

Teacher-forced: both generations feed fixed tokens, so the comparison does not depend on
sampling — every step's full logits are compared, not only the sampled tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import anyio
import anyio.to_thread
import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.oracle.sweeps import SweepResult

#: Seconds a generation may wait for the other to take its lane.
JOIN_TIMEOUT_S = 120.0


def decode_lanes(engine: Engine, prompts: tuple[Sequence[int], Sequence[int]],
                 feeds: tuple[Sequence[int], Sequence[int]]) -> SweepResult:
    """Sequence 0 decodes ``feeds[0]`` after ``prompts[0]`` alone, then again while every
    other lane holds a generation of sequence 1 (after ``prompts[1]``, each feeding
    ``feeds[1]`` rotated differently: other tokens in every row); compares sequence 0's
    logits step by step."""
    for seq, prompt in enumerate(prompts):
        engine.clear(seq)
        engine.prefill_tokens(seq, tuple(prompt), logits=False)
    alone = _decode(engine, 0, feeds[0], None)
    rows = engine.decode_shape.lanes  # generations that can decode at once
    others = max(1, rows - 1)
    work = [(0, list(feeds[0]))] + [(1, list(feeds[1][k:]) + list(feeds[1][:k]))
                                    for k in range(others)]
    together: dict[int, list[np.ndarray]] = {}
    calls_before = engine.decode_stats().calls

    async def all_lanes() -> None:
        # with enough lanes every generation holds one before any decodes, so they share
        # every call; with one lane they take turns
        joined = _Rendezvous(len(work)) if rows >= len(work) else None
        async with anyio.create_task_group() as tg:
            for i, (seq, feed) in enumerate(work):
                tg.start_soon(_in_thread, engine, i, seq, feed, joined, together)

    anyio.run(all_lanes)
    shared = (engine.decode_stats().calls - calls_before) < sum(len(f) for _, f in work)
    for seq in (0, 1):
        engine.clear(seq)
    worst, first_bad = 0.0, None
    for step, (a, b) in enumerate(zip(alone, together[0], strict=True)):
        diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
        worst = max(worst, diff)
        if first_bad is None and not np.array_equal(a, b):
            first_bad = step
    how = (f"{rows} lanes, {len(work)} generations shared calls" if shared else
           f"{rows} lane(s), {len(work)} generations took turns")
    detail = how if first_bad is None else f"{how}; first differing step {first_bad}"
    return SweepResult(first_bad is None, worst, detail)


async def _in_thread(engine: Engine, key: int, seq: int, feed: Sequence[int],
                     joined: _Rendezvous | None, out: dict[int, list[np.ndarray]]) -> None:
    out[key] = await anyio.to_thread.run_sync(_decode, engine, seq, feed, joined)


def _decode(engine: Engine, seq: int, feed: Sequence[int],
            joined: _Rendezvous | None) -> list[np.ndarray]:
    out = []
    with engine.generating(seq) as lane:
        if joined is not None:
            joined.arrive()
        for token in feed:
            out.append(np.array(lane.decode(token), copy=True))
    return out


class _Rendezvous:
    """Blocks each of ``n`` worker threads until all have arrived (bounded wait)."""

    def __init__(self, n: int) -> None:
        self._barrier = threading.Barrier(n)

    def arrive(self) -> None:
        self._barrier.wait(timeout=JOIN_TIMEOUT_S)
