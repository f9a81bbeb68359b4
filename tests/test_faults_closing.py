"""Faults while an episode closes (its env, its recorder, the disk at the end) are that
episode's error, recorded with the cause; the other episodes go on; a cancellation mid-step
with several episodes running unwinds without a false integrity report and the ledger back
to zero."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import anyio
import attrs
import pytest

from cachepolicy.segments import SegmentFactory
from fault_helpers import STEPS, TRAJ, FaultyEnv, assert_on_disk, engine, run_three  # noqa: F401
from replay_helpers import AGENT, SCREEN
from runtime.run.agents import run_on
from runtime.run.recording import RESULT_FILE, EpisodeRecorder, ResultLayout
from runtime.run.replay import replay_run_config, replay_specs, replay_teacher
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from vmenv.replay import ReplayEnv
from vmenv.trajectory_writer import TRAJ_FILE


class _CloseFails(FaultyEnv):
    async def close(self) -> None:
        await self.inner.close()
        raise OSError(errno.EIO, "the VM connection broke while closing")


async def test_an_env_that_fails_to_close_fails_only_its_episode(engine, tmp_path) -> None:  # noqa: F811
    results, dirs = await run_three(engine, tmp_path, lambda env: _CloseFails(env, at=-1))
    bad = results[0]
    assert bad.status == "error" and "while closing the episode" in bad.error
    assert "the VM connection broke while closing" in bad.error
    assert not (dirs[bad.episode_id] / RESULT_FILE).exists()  # a rerun retries it
    lines = (dirs[bad.episode_id] / TRAJ_FILE).read_text().splitlines()
    assert "while closing the episode" in json.loads(lines[-1])["Error"]
    for ok in results[1:]:
        assert (dirs[ok.episode_id] / RESULT_FILE).is_file()


async def test_a_full_disk_at_close_or_at_the_result_is_the_episodes_error(
        engine, tmp_path, monkeypatch) -> None:  # noqa: F811
    real_close, real_finish = EpisodeRecorder.close, EpisodeRecorder.finish

    def close(self: EpisodeRecorder) -> None:
        real_close(self)
        if self.directory.name == "ep0":
            raise OSError(errno.ENOSPC, "No space left on device")

    def finish(self: EpisodeRecorder, reward: float) -> Path:
        if self.directory.name == "ep1":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_finish(self, reward)

    monkeypatch.setattr(EpisodeRecorder, "close", close)
    monkeypatch.setattr(EpisodeRecorder, "finish", finish)
    factory, ledger = SegmentFactory(engine), MemoryLedger(1 << 30)
    config = replay_run_config(AGENT, TRAJ, episodes=3)
    layout = ResultLayout(tmp_path, "forged", "faults")
    async with Scheduler(engine, ledger, factory, options=AGENT.step_options(SCREEN)) as sched:
        results, dirs = await run_on(sched, config, layout, replay_specs(TRAJ, 3, "ep"),
                                     lambda spec: ReplayEnv(TRAJ), teacher=replay_teacher(TRAJ))
        sched.check_integrity()
    assert [r.status for r in results] == ["error", "error", "done"]
    assert "while closing the episode" in results[0].error and "No space" in results[0].error
    assert "while writing its result" in results[1].error
    assert [(dirs[r.episode_id] / RESULT_FILE).exists() for r in results] == [False, False, True]
    assert ledger.snapshot().held == 0


async def test_cancelled_mid_step_with_several_episodes_unwinds_cleanly(
        engine, tmp_path) -> None:  # noqa: F811
    """Cancel the whole run while three episodes are mid-step (every scheduler idle check
    runs on the way: KVAGENT_DEBUG=1 in the suite): no IntegrityError, the ledger at zero."""
    factory, ledger = SegmentFactory(engine), MemoryLedger(1 << 30)
    agent = attrs.evolve(AGENT, overlap=True)
    config = replay_run_config(agent, TRAJ, episodes=3, vm_seconds=0.05)
    layout = ResultLayout(tmp_path, "forged", "faults")
    seen = 0

    def on_event(event) -> None:
        nonlocal seen
        if event.kind == "step":
            seen += 1
            if seen == 4:  # mid-run: the episodes are in their second step
                scope.cancel()

    async with Scheduler(engine, ledger, factory, options=agent.step_options(SCREEN)) as sched:
        with anyio.CancelScope() as scope:
            await run_on(sched, config, layout, replay_specs(TRAJ, 3, "ep"),
                         lambda spec: ReplayEnv(TRAJ, vm_seconds=0.05),
                         teacher=replay_teacher(TRAJ), on_event=on_event)
        assert scope.cancelled_caught and seen >= 4
        sched.check_integrity()
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0
    for d in (tmp_path / "pyautogui").rglob("ep*"):
        assert not (d / RESULT_FILE).exists()  # cancelled: nothing claims to be finished
    for s in range(engine.config.n_seq_max):
        assert engine.seq_info(s).n_tokens == 0
    assert STEPS > 2
