"""Many bench episodes at once through the scheduler, then the same ones back to back.

Each episode replays the bench trajectory on its own sequence; between steps it waits
``vm_seconds`` (the VM executing the action) without holding the engine, which is where
concurrency pays: one episode's VM time is another's engine time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs

from cachepolicy.base import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from runtime.bench.arms import rss_bytes, step_segments
from runtime.bench.trajectory import BenchStep
from scheduler.errors import SchedulerError
from scheduler.scheduler import Scheduler


@attrs.frozen
class EpisodeRun:
    episode: str
    status: str  # ok | degraded | failed
    steps: tuple[dict[str, Any], ...]


async def run_episode(scheduler: Scheduler, factory: SegmentFactory, traj: Sequence[BenchStep],
                      episode_id: str, *, policy: str, window: int, decode_tokens: int,
                      vm_seconds: float,
                      on_step: Callable[[str, dict[str, Any]], None] | None = None) -> EpisodeRun:
    """One episode's whole trajectory; a failed step is recorded and the episode goes on."""
    cache = scheduler.open_episode(episode_id, make_policy(
        policy, model_info(factory.engine), factory.kit, window=window,
        decode_tokens=decode_tokens))
    steps: list[dict[str, Any]] = []
    try:
        for i in range(len(traj)):
            t0 = time.perf_counter()
            try:
                rec = await scheduler.step(cache, lambda i=i: step_segments(factory, traj, i))
                row = rec.as_dict()
            except SchedulerError as exc:  # rung 4: an explained failure of this step only
                row = {"step": i, "status": "failed", "reason": str(exc)}
            critical = time.perf_counter() - t0
            if vm_seconds and i < len(traj) - 1:
                await anyio.sleep(vm_seconds)
            row.update(rss_bytes=rss_bytes(), vm_s=vm_seconds if i < len(traj) - 1 else 0.0,
                       critical_path_s=critical, step_wall_s=time.perf_counter() - t0)
            steps.append(row)
            if on_step is not None:
                on_step(episode_id, row)
    finally:
        await scheduler.close_episode(cache)
    statuses = {s["status"] for s in steps}
    status = "failed" if "failed" in statuses else "degraded" if "degraded" in statuses else "ok"
    return EpisodeRun(episode_id, status, tuple(steps))


async def run_concurrently(scheduler: Scheduler, factory: SegmentFactory,
                           traj: Sequence[BenchStep], n: int, **kw: Any) -> list[EpisodeRun]:
    runs: dict[int, EpisodeRun] = {}

    async def one(i: int) -> None:
        runs[i] = await run_episode(scheduler, factory, traj, f"ep{i}", **kw)

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return [runs[i] for i in range(n)]


async def run_sequentially(scheduler: Scheduler, factory: SegmentFactory,
                           traj: Sequence[BenchStep], n: int, **kw: Any) -> list[EpisodeRun]:
    return [await run_episode(scheduler, factory, traj, f"seq{i}", **kw) for i in range(n)]


async def measure_concurrency(engine: Any, factory: SegmentFactory, traj: Sequence[BenchStep],
                              n: int, *, budget: int, options: Any, wait_s: float,
                              progress: Callable[[str], None] | None = None,
                              summary_every_s: float = 1.0, **kw: Any) -> dict[str, Any]:
    """N episodes concurrently, then the same N back to back, each under ``budget``."""
    from scheduler.ledger import MemoryLedger

    phases: dict[str, Any] = {}
    for phase, runner in (("concurrent", run_concurrently), ("sequential", run_sequentially)):
        ledger = MemoryLedger(budget)
        async with Scheduler(engine, ledger, factory, options=options, wait_s=wait_s) as sched:
            async with anyio.create_task_group() as tg:
                if progress is not None:
                    async def report(sched: Scheduler = sched, phase: str = phase) -> None:
                        while True:
                            progress(f"[{phase}] {sched.summary()}")
                            await anyio.sleep(summary_every_s)
                    tg.start_soon(report)
                t0 = time.perf_counter()
                runs = await runner(sched, factory, traj, n, **kw)
                wall = time.perf_counter() - t0
                tg.cancel_scope.cancel()
            counters = dict(sched.counters)
        ledger.check_integrity()
        snap = ledger.snapshot()
        assert snap.held == 0 and snap.reserved == 0, f"ledger not back to zero: {snap}"
        phases[phase] = {"runs": runs, "wall_s": wall, "peak": snap.peak, "counters": counters}
    steps = n * len(traj)
    conc, seq = phases["concurrent"], phases["sequential"]
    return {
        "episodes": [{"episode": r.episode, "status": r.status, "steps": list(r.steps)}
                     for r in conc["runs"]],
        "sequential_episodes": [{"episode": r.episode, "status": r.status,
                                 "steps": list(r.steps)} for r in seq["runs"]],
        "ledger": {"budget_bytes": budget, "peak_bytes": conc["peak"],
                   "sequential_peak_bytes": seq["peak"]},
        "throughput": {"concurrent_steps_per_s": steps / conc["wall_s"],
                       "sequential_steps_per_s": steps / seq["wall_s"],
                       "ratio": seq["wall_s"] / conc["wall_s"]},
        "scheduler": {"concurrent": conc["counters"], "sequential": seq["counters"]},
    }
