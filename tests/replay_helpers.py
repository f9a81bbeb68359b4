"""Test helpers: whole transactions run synchronously, and bench-trajectory episodes replayed
through the shipping loop on a scheduler the test owns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.segments import SegmentFactory
from runtime.run.replay import replay_run_config, replay_specs, replay_teacher
from runtime.bench.trajectory import INSTRUCTION
from runtime.bench.agent_defaults import bench_agent_defaults
from runtime.config import AgentConfig
from runtime.metrics import EpisodeResult
from runtime.run.agents import run_on
from runtime.session import PromptText
from scheduler.ledger import MemoryLedger
from scheduler.records import StepRecord
from scheduler.scheduler import Scheduler
from scheduler.transaction import (
    EpisodeCache, PrefetchRecord, StepOptions, admit, begin, commit,
)
from vmenv.replay import ReplayEnv
from vmenv.trajectory import Trajectory

#: The bench's agent (fixed decode, greedy, no grammar) with 4 tokens per step.
AGENT = attrs.evolve(bench_agent_defaults(), decode_tokens=4)
#: The screenshots of the tests' synthetic trajectories (``trajectory(n, 96, 64)``).
SCREEN = (96, 64)
#: The scheduler's options for AGENT (its fixed decode does not depend on the screen).
OPTIONS = AGENT.step_options(SCREEN)


def run_step(engine: Engine, episode: EpisodeCache, segments: tuple[Segment, ...],
             ledger: MemoryLedger, options: StepOptions = StepOptions(), *,
             fault: Callable[[str], None] | None = None) -> StepRecord:
    """A whole step transaction, synchronously (begin, admit, commit)."""
    txn = begin(engine, episode, segments)
    admit(txn, ledger)
    record = commit(engine, txn, ledger, options, fault=fault)
    assert isinstance(record, StepRecord)
    return record


def run_prefetch(engine: Engine, episode: EpisodeCache, segments: tuple[Segment, ...],
                 ledger: MemoryLedger) -> PrefetchRecord:
    txn = begin(engine, episode, segments, prefetch=True)
    admit(txn, ledger)
    record = commit(engine, txn, ledger)
    assert isinstance(record, PrefetchRecord)
    return record


def past_step(factory: SegmentFactory, traj: Trajectory, i: int) -> Segment:
    """Recorded step ``i``'s action as the session renders it into the history."""
    prompt = PromptText(factory, AGENT, AGENT.make_profile())
    return prompt.past_step(i, traj.frames[i].action or "")


def step_segments(factory: SegmentFactory, traj: Trajectory, i: int) -> tuple[Segment, ...]:
    """Step i's new segments as the session renders them: the head on step 0, else the
    previous recorded action; then screenshot i."""
    segs: tuple[Segment, ...] = ()
    if i == 0:
        screen = (traj.frames[0].width, traj.frames[0].height)
        segs = PromptText(factory, AGENT, AGENT.make_profile()).head(screen, INSTRUCTION)
    else:
        segs = (past_step(factory, traj, i - 1),)
    return segs + (factory.screenshot(i, traj.frames[i].screenshot),)


async def replay(sched: Scheduler, traj: Trajectory, n: int, *,
                 agent: AgentConfig = AGENT, sequential: bool = False, prefix: str = "ep",
                 vm_seconds: float = 0.0,
                 on_event: Callable[[Any], None] | None = None) -> Sequence[EpisodeResult]:
    """``n`` teacher-forced episodes of ``traj`` on ``sched`` (the shipping loop)."""
    config = replay_run_config(agent, traj, episodes=n, vm_seconds=vm_seconds)
    results, _ = await run_on(sched, config, None, replay_specs(traj, n, prefix),
                              lambda spec: ReplayEnv(traj, vm_seconds=vm_seconds),
                              teacher=replay_teacher(traj), sequential=sequential,
                              on_event=on_event)
    return results


async def one_episode_peak(engine: Engine, factory: SegmentFactory, traj: Trajectory) -> int:
    """The ledger's peak while one episode of ``traj`` runs alone, unbounded: the budget
    on which every step must wait for another's release."""
    calib = MemoryLedger(1 << 30)
    async with Scheduler(engine, calib, factory, options=OPTIONS) as sched:
        await replay(sched, traj, 1)
    return calib.snapshot().peak


def outputs(result: EpisodeResult) -> list[tuple[int, ...]]:
    return [s.output_tokens for s in result.steps]


def check_accounts(engine: Engine, episode: EpisodeCache, ledger: MemoryLedger) -> None:
    """The ledger's holding for ``episode`` against the engine's own report of its sequence
    plus its checkpoints' bytes (two independent counts), and the ledger within budget."""
    ckpts = sum(len(c.checkpoint.data) for c in episode.state.checkpoints)
    assert ledger.held_by(episode.episode_id) == engine.held_bytes(episode.seq) + ckpts
    snap = ledger.snapshot()
    assert snap.reserved + snap.held <= snap.budget and snap.peak <= snap.budget
