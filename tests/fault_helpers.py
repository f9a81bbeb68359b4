"""Shared pieces of the fault-injection suite (tests/test_faults_*.py): a module engine, an
env wrapper that misbehaves at one step, and the run of three recorded episodes with the
checks every fault must pass — the other episodes unaffected, the ledger back to zero, every
completed step on disk."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from PIL import Image

from cachepolicy.segments import SegmentFactory
from replay_helpers import AGENT, SCREEN
from runtime.run.replay import replay_run_config, replay_specs, replay_teacher
from runtime.bench.trajectory import trajectory
from runtime.config import AgentConfig
from runtime.metrics import EpisodeResult
from runtime.run.recording import METRICS_FILE, RESULT_FILE, ResultLayout
from runtime.run.agents import run_on
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from vmenv.base import Env, StepOutcome
from vmenv.replay import ReplayEnv
from vmenv.trajectory_writer import TRAJ_FILE

STEPS = 4
TRAJ = trajectory(STEPS, 96, 64)
FAULT_AT = 1  # the faulty episode's second env step misbehaves


@pytest.fixture(scope="module")
def engine(forged):
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=4, n_batch=32, n_threads=1)) as e:
        yield e


@attrs.define
class FaultyEnv:
    """A real env whose step number ``at`` misbehaves: ``fault(outcome)`` replaces (or
    raises instead of) the outcome; ``hang=True`` never returns from the step at all."""

    inner: Env
    fault: Callable[[StepOutcome], Awaitable[StepOutcome]] | None = None
    hang: bool = False
    at: int = FAULT_AT
    taken: int = 0

    async def reset(self, task: str | None = None) -> Any:
        return await self.inner.reset(task)

    async def step(self, action: Any) -> StepOutcome:
        i, self.taken = self.taken, self.taken + 1
        if i == self.at and self.hang:
            await anyio.sleep_forever()
        out = await self.inner.step(action)
        return await self.fault(out) if i == self.at and self.fault is not None else out

    async def close(self) -> None:
        await self.inner.close()


def shot(out: StepOutcome, screenshot: Any) -> StepOutcome:
    return attrs.evolve(out, observation=attrs.evolve(out.observation, screenshot=screenshot))


async def run_three(engine, tmp_path: Path, faulty: Callable[[Env], Env] | None, *,
                    agent: AgentConfig = AGENT, env_timeout_s: float = 30.0,
                    budget: int = 1 << 30, fault: Callable[[str], None] | None = None,
                    ) -> tuple[list[EpisodeResult], dict[str, Path]]:
    """Episode ep0 (with ``faulty`` wrapped around its env) and two healthy ones, recorded;
    checks what must hold whatever the fault (see the module docstring)."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(budget)
    config = attrs.evolve(replay_run_config(agent, TRAJ, episodes=3), env_timeout_s=env_timeout_s)
    layout = ResultLayout(tmp_path, "forged", "faults")

    def make_env(spec):
        env = ReplayEnv(TRAJ)
        return faulty(env) if spec.index == 0 and faulty is not None else env

    async with Scheduler(engine, ledger, factory, options=agent.step_options(SCREEN),
                         fault=fault) as sched:
        results, dirs = await run_on(sched, config, layout, replay_specs(TRAJ, 3, "ep"),
                                     make_env, teacher=replay_teacher(TRAJ))
        sched.check_integrity()
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0 and snap.peak <= budget
    for r in results[1:] if faulty is not None else ():  # the others are unaffected
        assert r.status == "done" and r.n_steps == STEPS and r.admission == "ok", r
    for r in results:
        assert_on_disk(r, dirs[r.episode_id])
    return list(results), dirs


def assert_on_disk(result: EpisodeResult, directory: Path) -> None:
    """Every completed step has its traj line and a whole PNG; every PNG is named by a line;
    every step (failed ones too) has its metrics line; result.txt iff no error."""
    lines = [json.loads(x) for x in (directory / TRAJ_FILE).read_text().splitlines()]
    steps = [x for x in lines if "Error" not in x]
    errors = [x["Error"] for x in lines if "Error" in x]
    completed = [s for s in result.steps if s.status != "failed"]
    assert [x["step_num"] for x in steps] == list(range(1, len(completed) + 1))
    for x in steps:
        with Image.open(directory / x["screenshot_file"]) as img:
            img.verify()
    assert sorted(p.name for p in directory.glob("step_*.png")) == sorted(
        x["screenshot_file"] for x in steps)
    assert not list(directory.glob(".*.tmp"))
    metrics = (directory / METRICS_FILE).read_text().splitlines()
    assert len(metrics) == result.n_steps
    if result.status == "error":
        assert not (directory / RESULT_FILE).exists()
        assert errors and result.error and result.error in errors[-1]
    else:
        assert float((directory / RESULT_FILE).read_text()) == result.reward and not errors


def failed_at(result: EpisodeResult, step: int, *reason: str) -> None:
    assert result.status == "error" and result.n_steps == step + 1
    last = result.steps[-1]
    assert last.status == "failed" and result.error == last.reason
    for part in reason:
        assert part in last.reason, last.reason


