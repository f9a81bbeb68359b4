"""The embedding cache under memory pressure while encoders fill it from other threads:
rung 1 shrinks its capacity in one atomic step (never counting an encoder's new entry as
freed, never below what it holds), the ledger's holding is always its capacity, and once
the pressure is gone the capacity comes back."""

from __future__ import annotations

import io
import threading
import time

import anyio
import anyio.to_thread
import numpy as np
from PIL import Image

from cachepolicy.segments import SegmentFactory
from scheduler.ledger import MemoryLedger
from scheduler.pressure import Shrink
from scheduler.scheduler import IMAGE_CACHE, Scheduler


def _png(k: int, i: int) -> bytes:
    pixels = np.random.default_rng(k * 100_003 + i).integers(0, 255, (48, 64, 3), np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


async def test_concurrent_encoders_against_a_shrinking_cache(engines) -> None:
    engine = engines("qwen35")
    engine.clear_image_cache()
    one = engine.encode_image(_png(99, 0)).nbytes
    ledger = MemoryLedger(16 * one * 4)  # the cache's target: a quarter, 16 embeddings
    async with Scheduler(engine, ledger, SegmentFactory(engine)) as sched:
        pressure = sched.pressure
        target = engine.image_cache_stats().max_bytes
        assert target == 16 * one and ledger.held_by(IMAGE_CACHE) == target
        stop = threading.Event()
        encoded = [0] * 4

        def encoder(k: int) -> None:  # fills the cache from its own thread, as encode-ahead
            i = 0
            while not stop.is_set():
                engine.encode_image(_png(k, i))
                encoded[k] += 1
                i += 1

        shrunk = 0
        deadline = time.monotonic() + 60
        async with anyio.create_task_group() as tg:
            for k in range(4):
                tg.start_soon(anyio.to_thread.run_sync, encoder, k)
            try:
                n = 0
                # 40 shrinks at least, and on until the encoders have raced them a few times
                # (their pace is the machine's load, not the test's)
                while n < 40 or sum(encoded) <= 10:
                    n += 1
                    before = engine.image_cache_stats().max_bytes
                    reason = await pressure.carry_out(Shrink(one + n % 3))
                    snap = engine.image_cache_stats()
                    shrunk += before - snap.max_bytes
                    # what was freed is exactly the capacity given up; it holds its entries
                    assert reason == "" or f"by {before - snap.max_bytes} bytes" in reason
                    assert snap.nbytes == snap.entry_bytes <= snap.max_bytes
                    assert ledger.held_by(IMAGE_CACHE) == snap.max_bytes
                    await anyio.sleep(0.002)
                    if n > 40 and deadline < time.monotonic():
                        break  # the assertion below says how many encodes there were
            finally:  # the encoder threads end only when told
                stop.set()
        assert sum(encoded) > 10 and shrunk == target  # the pressure took all of it...
        assert engine.image_cache_stats().max_bytes == 0 and engine.image_cache_stats().nbytes == 0
        # ...and, the pressure gone, releases give it back (half the free bytes each time)
        for _ in range(64):
            pressure.regrow_image_cache()
        snap = engine.image_cache_stats()
        assert snap.max_bytes == target and ledger.held_by(IMAGE_CACHE) == target
        engine.encode_image(_png(7, 7))
        assert engine.image_cache_stats().entries >= 1  # it caches again
        sched.check_integrity()
    assert ledger.snapshot().held == 0
