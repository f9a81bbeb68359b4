"""Stopping a prefetch with critical work, deterministically: the scheduler's fault hook
holds the prefetch at its first piece boundary until a critical step is queued behind it
(the scheduler then tells the prefetch to stop there)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio


class PreemptHook:
    """``Scheduler(fault=hook)``; ``armed`` False lets every piece boundary through (the
    warm-up steps), ``preempt`` arms it for one prefetch."""

    def __init__(self) -> None:
        self.running, self.queued = threading.Event(), threading.Event()
        self.running.set()  # not armed

    def __call__(self, point: str) -> None:  # runs in the worker thread between pieces
        if point == "between_pieces" and not self.running.is_set():
            self.running.set()
            self.queued.wait(timeout=10)

    async def preempt(self, sched: Any, prefetch: Callable[[], Awaitable[Any]],
                      critical: Callable[[], Awaitable[Any]]) -> tuple[Any, Any]:
        """Run ``prefetch`` and, once it is at a piece boundary, ``critical``; their
        results."""
        self.running.clear()
        self.queued.clear()
        results: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            async def pre() -> None:
                results["prefetch"] = await prefetch()

            async def crit() -> None:
                results["critical"] = await critical()
            tg.start_soon(pre)
            await anyio.to_thread.run_sync(self.running.wait, 10)
            tg.start_soon(crit)
            while sched.gate.critical_waiting == 0:
                await anyio.sleep(0.001)
            self.queued.set()
        return results["prefetch"], results["critical"]
