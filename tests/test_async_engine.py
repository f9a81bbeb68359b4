"""The async facade: llama.cpp calls run off the event loop, serialised, same results."""

from __future__ import annotations

import threading

import anyio
import numpy as np

from cachepolicy.async_engine import AsyncEngine
from cachepolicy.checkpoint import CheckpointKind

TEXT = "the agent opens the settings dialog and toggles dark mode"


async def test_async_calls_match_sync_and_run_in_a_worker_thread(engines) -> None:
    e = engines("qwen35")
    toks = e.tokenize(TEXT)
    sync_logits = e.prefill_tokens(0, toks)
    e.clear(0)
    ae = AsyncEngine(e)
    loop_thread = threading.get_ident()
    seen: list[int] = []
    got = await ae.call(lambda: (seen.append(threading.get_ident()), e.prefill_tokens(1, toks))[1])
    assert seen and seen[0] != loop_thread
    assert np.array_equal(sync_logits, got)
    await ae.clear(1)


async def test_concurrent_episodes_are_serialised_and_exact(engines) -> None:
    e = engines("qwen35")
    ae = AsyncEngine(e)
    toks = e.tokenize(TEXT)
    ref = e.prefill_tokens(0, toks)
    e.clear(0)
    results: dict[int, np.ndarray] = {}

    async def episode(seq: int) -> None:
        half = len(toks) // 2
        await ae.prefill_tokens(seq, toks[:half], logits=False)
        ckpt = await ae.checkpoint(seq, CheckpointKind.PARTIAL_ONLY)
        await ae.prefill_tokens(seq, toks[half:], logits=False)
        await ae.truncate(seq, half, via=ckpt)
        results[seq] = await ae.prefill_tokens(seq, toks[half:])

    async with anyio.create_task_group() as tg:
        for seq in range(3):
            tg.start_soon(episode, seq)
    assert all(np.array_equal(ref, results[s]) for s in range(3))
    for s in range(3):
        await ae.clear(s)


async def test_cancellation_is_not_swallowed(engines) -> None:
    e = engines("llama")
    ae = AsyncEngine(e)
    with anyio.move_on_after(0) as scope:
        await ae.prefill_tokens(0, e.tokenize(TEXT))
    assert scope.cancelled_caught
    # the engine is still consistent: whatever ran, the sequence can be cleared and reused
    await ae.clear(0)
    assert (await ae.prefill_tokens(0, e.tokenize(TEXT))) is not None
    await ae.clear(0)
