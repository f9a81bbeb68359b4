"""Stopping a prefetch with critical work, deterministically: the scheduler's fault hook
holds the prefetch at its first piece boundary until a critical step is queued behind it
(the scheduler then tells the prefetch to stop there)."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from replay_helpers import past_step, step_segments


class PreemptHook:
    """``Scheduler(fault=hook)``; ``armed`` False lets every piece boundary through (the
    warm-up steps), ``preempt`` arms it for one prefetch.  ``points``: the scheduler's fault
    points the armed hook holds at, the first one reached — a piece boundary by default;
    with ``"before_publish"`` also a prefetch that polls no boundary (``Splice.
    hold_until_placed`` with nothing after its placed units) is held, at its end."""

    def __init__(self, points: tuple[str, ...] = ("between_pieces",)) -> None:
        self.points = points
        self.running, self.queued = threading.Event(), threading.Event()
        self.running.set()  # not armed

    def __call__(self, point: str) -> None:  # runs in the prefetch's worker thread
        if point in self.points and not self.running.is_set():
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
            if not await anyio.to_thread.run_sync(self.running.wait, 10):
                raise AssertionError("the prefetch reached no piece boundary in 10 s")
            tg.start_soon(crit)
            # bounded: a critical step with nothing to queue behind never counts as waiting
            with anyio.fail_after(10):
                while sched.gate.critical_waiting == 0 and "critical" not in results:
                    await anyio.sleep(0.001)
            self.queued.set()
        return results["prefetch"], results["critical"]

    async def stop_prefetch(self, sched: Any, factory: Any, traj: Any, a: Any,
                            b: Any) -> tuple[Any, Any]:
        """``a``'s prefetch of its third action stopped by ``b``'s second step (the pair
        ``warmed_pair`` opens); their results."""
        return await self.preempt(
            sched, lambda: sched.prefetch(a, lambda: (past_step(factory, traj, 2),)),
            lambda: sched.step(b, lambda: step_segments(factory, traj, 1)))


async def warmed_pair(sched: Any, factory: Any, traj: Any,
                      policy: Callable[[], Any]) -> tuple[Any, Any]:
    """Episodes "a" (three steps of ``traj``: a window to prefetch into) and "b" (one step:
    critical work to queue next), each with ``policy()``."""
    a, b = sched.open_episode("a", policy()), sched.open_episode("b", policy())
    for i in range(3):
        await sched.step(a, lambda i=i: step_segments(factory, traj, i))
    await sched.step(b, lambda: step_segments(factory, traj, 0))
    return a, b


async def step_after_prefetch(sched: Any, engine: Any, factory: Any, traj: Any,
                              ep: Any) -> tuple[Any, dict[str, int]]:
    """``ep``'s step on ``traj``'s fourth screenshot after its prefetch, with the ledger
    checked against the engine before and after: its record, and the tokens of each piece of
    its prompt as the policy lays it out (keyed, in prompt order; read before the step)."""
    new = factory.screenshot(3, traj.frames[3].screenshot)
    tokens = {p.key: p.n_tokens for p in ep.policy.select(ep.log.append(new),
                                                          ep.view(engine)).pieces}
    sched.check_integrity()
    rec = await sched.step(ep, lambda: (new,))
    sched.check_integrity()
    return rec, tokens


def tokens_from(tokens: dict[str, int], key: str) -> int:
    """The tokens of the prompt's pieces from ``key`` to its end."""
    keys = list(tokens)
    return sum(tokens[k] for k in keys[keys.index(key):])
