"""Fault injection on the real engine (forged tiny qwen35): each fault class has its defined
outcome (docs/reliability.md), and in every case the other concurrent episodes are
unaffected, the ledger returns to zero and every completed step is on disk.

The faults enter where they happen in production: an env (wrapped around the real replay
env, or OSWorld's adapter over a DesktopEnv that hangs) that raises, hangs or returns bad
screenshots; the scheduler's fault hook for llama.cpp failures; a checkpoint that cannot be
restored; a context too small; a budget too small; cancellation.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest
from PIL import Image
from structlog.testing import capture_logs

from bad_images import bomb_png, corrupt_png, header_only_png, jpeg_of, png_of_size
from cachepolicy.errors import DecodeError
from cachepolicy.segments import SegmentFactory
from replay_helpers import AGENT
from runtime.bench.arms import replay_run_config, replay_specs, replay_teacher
from runtime.bench.trajectory import trajectory
from runtime.config import AgentConfig
from runtime.driver import EpisodeDriver
from runtime.episode import run_episode
from runtime.errors import describe_error
from runtime.metrics import EpisodeResult
from runtime.recording import METRICS_FILE, RESULT_FILE, ResultLayout
from runtime.progress import summary_table
from runtime.run_agents import RunResult, run_on
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler
from vmenv.base import Env, StepOutcome
from vmenv.osworld import OSWorldEnv
from vmenv.osworld_fake import FakeDesktopEnv
from vmenv.osworld_vm.protocol import simdesk_example
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

    async with Scheduler(engine, ledger, factory, options=agent.step_options(),
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


# ----------------------------------------------------------------------------- the VM


async def test_vm_step_raises(engine, tmp_path) -> None:
    async def reset_connection(out):
        raise ConnectionError("VM connection reset")

    (ep0, *_), dirs = await run_three(engine, tmp_path,
                                      lambda env: FaultyEnv(env, reset_connection))
    failed_at(ep0, FAULT_AT, "ConnectionError: VM connection reset")
    assert ep0.steps[-1].output_tokens  # the decided step is kept with its measurements
    assert "ConnectionError: VM connection reset" in (dirs["ep0"] / TRAJ_FILE).read_text()
    assert "ConnectionError: VM connection reset" in (dirs["ep0"] / METRICS_FILE).read_text()
    table = summary_table(RunResult((ep0, *_), 0.0, 0, {}, ""))  # what `kvagent run` prints
    assert "ep0: ConnectionError: VM connection reset" in table


def test_describe_error_unwraps_groups_to_the_cause() -> None:
    try:
        try:
            raise OSError("disk gone")
        except OSError as low:
            raise RuntimeError() from low
    except RuntimeError as exc:
        caused = exc
    group = ExceptionGroup("unhandled errors in a TaskGroup", [
        ExceptionGroup("inner", [ConnectionError("VM connection reset")]), caused])
    assert describe_error(group) == ("ConnectionError: VM connection reset; "
                                     "RuntimeError: OSError: disk gone")
    assert describe_error(ValueError("x")) == "ValueError: x"
    assert describe_error(KeyError()) == "KeyError"


async def test_vm_step_hangs_async(engine, tmp_path) -> None:
    with anyio.fail_after(20):
        (ep0, *_), _ = await run_three(engine, tmp_path, lambda env: FaultyEnv(env, hang=True),
                                       env_timeout_s=0.5)
    failed_at(ep0, FAULT_AT, "EnvTimeoutError", "did not return within 0.5 s")
    assert ep0.steps[-1].vm_s >= 0.5


class HangingDesktop(FakeDesktopEnv):
    """A DesktopEnv whose ``step`` number ``at`` blocks its thread like an HTTP call to a
    dead VM, until ``close`` (stopping the VM) ends it."""

    def __init__(self, at: int) -> None:
        super().__init__(width=320, height=240)
        self.at, self.steps = at, 0
        self.release, self.returned = threading.Event(), threading.Event()

    def step(self, action: Any, pause: float = 2) -> Any:
        self.steps += 1
        if self.steps - 1 == self.at:
            try:
                self.release.wait(30)
            finally:
                self.returned.set()
        return super().step(action, pause)

    def close(self) -> None:
        self.release.set()
        super().close()


async def test_vm_step_hangs_in_a_thread(engine, tmp_path) -> None:
    desktop = HangingDesktop(FAULT_AT)
    envs: list[OSWorldEnv] = []

    def osworld(_replay: Env) -> Env:
        envs.append(OSWorldEnv(desktop, pause=0.0, settle_s=0.0, close_timeout_s=5.0,
                               tasks={"replay": simdesk_example("open-terminal")}))
        return envs[0]

    try:
        with anyio.fail_after(20):
            (ep0, *_), _ = await run_three(engine, tmp_path, osworld, env_timeout_s=0.5)
        failed_at(ep0, FAULT_AT, "EnvTimeoutError")
        assert envs[0].broken  # the abandoned call left the VM in an unknown state
        # closing the env stopped the VM, which ended the abandoned thread's call
        assert await anyio.to_thread.run_sync(desktop.returned.wait, 10)
    finally:
        desktop.release.set()


# ----------------------------------------------------------------------------- screenshots


@pytest.mark.parametrize("name, bad, reason", [
    ("none", None, "MissingScreenshotError"),
    ("zero-byte", b"", "MissingScreenshotError"),
    ("corrupt", corrupt_png(TRAJ.frames[2].screenshot), "corrupt PNG"),
    ("bomb", bomb_png(), "exceeds limit"),
    ("huge", header_only_png(20000, 10), "outside 1..16384"),
    ("not-an-image", b"GIF89a" + bytes(64), "not a readable screenshot"),
])
async def test_bad_screenshot_after_a_step(engine, tmp_path, name, bad, reason) -> None:
    async def replace(out):
        return shot(out, bad)

    (ep0, *_), dirs = await run_three(engine, tmp_path, lambda env: FaultyEnv(env, replace))
    failed_at(ep0, FAULT_AT, "ScreenshotError", reason)
    assert all(p.stat().st_size > 0 for p in dirs["ep0"].iterdir())  # no 0-byte PNG


async def test_other_format_screenshot_is_converted(engine, tmp_path) -> None:
    async def as_jpeg(out):
        return shot(out, jpeg_of(out.observation.screenshot))

    (ep0, *_), dirs = await run_three(engine, tmp_path, lambda env: FaultyEnv(env, as_jpeg))
    assert ep0.status == "done" and ep0.n_steps == STEPS
    line = json.loads((dirs["ep0"] / TRAJ_FILE).read_text().splitlines()[FAULT_AT])
    with Image.open(dirs["ep0"] / line["screenshot_file"]) as img:
        assert img.format == "PNG"  # recorded as what it is named


async def test_screenshot_size_change_mid_episode(engine, tmp_path) -> None:
    async def bigger(out):
        return shot(out, png_of_size(160, 100))

    with capture_logs() as logs:
        (ep0, *_), _ = await run_three(engine, tmp_path, lambda env: FaultyEnv(env, bigger))
    assert ep0.status == "done" and ep0.n_steps == STEPS and ep0.admission == "ok"
    changes = [(e["old"], e["new"]) for e in logs if e["event"] == "screen_size_changed"]
    assert changes == [((96, 64), (160, 100)), ((160, 100), (96, 64))]


# ----------------------------------------------------------------------------- the model


async def test_output_that_never_stops_and_does_not_parse(engine, tmp_path) -> None:
    """No grammar, end-of-generation ignored (random weights babble): a step decodes exactly
    its bound; text that does not parse becomes a recorded NoOp — 'WAIT' sent to the VM, the
    model's text kept as the response, counted as unparsable — and the episode goes on."""
    babble = AgentConfig(grammar=False, decode_tokens=7, stop_at_eog=False)
    results, dirs = await run_three(engine, tmp_path, None, agent=babble)
    for r in results:
        assert r.status == "done" and all(s.decode_tokens == 7 for s in r.steps)
        assert r.unparsable == sum(not s.parsed for s in r.steps)
    assert sum(r.unparsable for r in results) > 0
    lines = [json.loads(x) for x in (dirs["ep0"] / TRAJ_FILE).read_text().splitlines()]
    metrics = [json.loads(x) for x in (dirs["ep0"] / METRICS_FILE).read_text().splitlines()]
    for line, m in zip(lines, metrics, strict=True):
        assert isinstance(line["response"], str)
        if not m["parsed"]:
            assert line["action"] == "WAIT" and m["action"] is None


async def test_llama_decode_failure_mid_prefill(engine, tmp_path) -> None:
    calls: list[int] = []

    def fault(point: str) -> None:  # fails the third piece boundary of the run, once
        if point == "between_pieces":
            calls.append(1)
            if len(calls) == 3:
                raise DecodeError("injected: llama_decode returned -3", -3)

    results, _ = await run_three(engine, tmp_path, None, fault=fault)
    degraded = [s for r in results for s in r.steps if s.status == "degraded"]
    assert len(degraded) == 1 and "decode failure" in degraded[0].reason
    assert all(r.status == "done" and r.n_steps == STEPS for r in results)


async def test_checkpoint_restore_failure(engine, tmp_path) -> None:
    """ep0's checkpoints become unrestorable (as if taken on another model): its next step
    falls back to a plan from scratch, recorded degraded with the cause; it goes on."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    agent = attrs.evolve(AGENT, overlap=False)
    config = replay_run_config(agent, TRAJ, episodes=2)
    spoiled: list[int] = []
    async with Scheduler(engine, ledger, factory, options=agent.step_options()) as sched:
        def spoil(event) -> None:
            if event.kind == "step" and event.spec.index == 0 and event.step == 1:
                for c in sched._slots["ep0"].cache.state.checkpoints:  # noqa: SLF001
                    # the same object (the engine tracks it), now from "another model"
                    object.__setattr__(c.checkpoint, "model_id", "another-model")
                    spoiled.append(1)

        results, dirs = await run_on(sched, config, ResultLayout(tmp_path, "forged", "faults"),
                                     replay_specs(TRAJ, 2, "ep"), lambda s: ReplayEnv(TRAJ),
                                     teacher=replay_teacher(TRAJ), on_event=spoil)
        sched.check_integrity()
    assert spoiled
    ep0, ep1 = results
    assert ep0.status == "done" and ep0.n_steps == STEPS
    assert ep0.steps[1].status == "degraded" and "restore failure" in ep0.steps[1].reason
    assert ep1.admission == "ok"
    assert ledger.snapshot().held == 0
    for r in results:
        assert_on_disk(r, dirs[r.episode_id])


async def test_context_full(forged) -> None:
    """An episode whose prompt grows past its context (noevict keeps every screenshot) is
    downgraded to smaller windows (recorded degraded, "context full"), then fails with that
    reason when even one screenshot and the text history do not fit; an episode beside it
    runs on undisturbed."""
    from cachepolicy.engine import Engine, EngineConfig

    m = forged("qwen35")
    long = trajectory(16, 192, 128)
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=32, n_threads=1)) as e:
        factory = SegmentFactory(e)
        ledger = MemoryLedger(1 << 30)
        async with Scheduler(e, ledger, factory, options=AGENT.step_options()) as sched:
            async def episode(name: str, policy: str, steps: int) -> EpisodeResult:
                agent = attrs.evolve(AGENT, policy=policy, window=2)
                driver = EpisodeDriver.open(sched, factory, agent, name, "go", (192, 128))
                try:
                    return await run_episode(driver, ReplayEnv(long), max_steps=steps)
                finally:
                    await driver.aclose()

            out: dict[str, EpisodeResult] = {}
            async with anyio.create_task_group() as tg:
                for name, policy, steps in (("grows", "noevict", 16),
                                            ("steady", "terminal-slot", 6)):
                    tg.start_soon(lambda n=name, p=policy, k=steps: _store(out, n,
                                                                           episode(n, p, k)))
            sched.check_integrity()
        assert ledger.snapshot().held == 0
    grows, steady = out["grows"], out["steady"]
    statuses = [s.status for s in grows.steps]
    assert statuses[0] == "ok" and "degraded" in statuses and statuses[-1] == "failed"
    assert all("context full" in s.reason for s in grows.steps if s.status != "ok")
    assert grows.status == "error" and "context full" in grows.error
    assert steady.admission == "ok" and steady.n_steps == 6


async def _store(out: dict, key: str, coro: Awaitable[Any]) -> None:
    out[key] = await coro


# ----------------------------------------------------------------------------- the scheduler


async def test_budget_too_small_for_one_step(engine, tmp_path) -> None:
    results, _ = await run_three(engine, tmp_path, None, budget=64 << 10)
    for r in results:
        failed_at(r, 0, "AdmissionError", "step needs")


# ----------------------------------------------------------------------------- cancellation


@pytest.mark.parametrize("where", ["prefill_image", "generate"])
async def test_cancel_one_episode_mid_step(engine, monkeypatch, where) -> None:
    """Cancel one episode while its critical step is inside the engine — mid-prefill (its
    screenshot) or mid-decode: the cancellation arrives as cancellation (the scope reports
    it caught, no AssertionError), the step rolls back, the ledger returns to zero and the
    episodes beside it finish every step."""
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)
    victim_agent = attrs.evolve(AGENT, overlap=False)  # its engine work is its critical steps
    entered, proceed = threading.Event(), threading.Event()
    armed: list[int] = []  # the victim's sequence, once its first step is recorded
    original = getattr(engine, where)

    def instrumented(seq: int, *args: Any, **kwargs: Any) -> Any:
        if armed and seq == armed[0] and not entered.is_set():
            entered.set()  # the victim's second step is inside the engine: cancel it now
            proceed.wait(20)
        return original(seq, *args, **kwargs)

    monkeypatch.setattr(engine, where, instrumented)
    scope = anyio.CancelScope()
    victim: list[EpisodeResult] = []
    others: list[EpisodeResult] = []
    async with Scheduler(engine, ledger, factory, options=AGENT.step_options()) as sched:
        async def run_victim() -> None:
            driver = EpisodeDriver.open(sched, factory, victim_agent, "victim", "go", (96, 64))
            try:
                with scope:
                    victim.append(await run_episode(
                        driver, ReplayEnv(TRAJ), max_steps=STEPS,
                        on_step=lambda *_: armed.append(driver.session.episode.seq)))
            finally:
                await driver.aclose()

        async def run_others() -> None:
            from replay_helpers import replay
            others.extend(await replay(sched, TRAJ, 2, prefix="other"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                tg.start_soon(run_victim)
                tg.start_soon(run_others)
                assert await anyio.to_thread.run_sync(entered.wait, 30)
                scope.cancel()
                proceed.set()
        assert scope.cancelled_caught and not victim
        assert ledger.held_by("victim") == 0
        sched.check_integrity()
    assert [r.n_steps for r in others] == [STEPS, STEPS]
    assert all(r.status == "done" and r.admission == "ok" for r in others)
    snap = ledger.snapshot()
    assert snap.held == 0 and snap.reserved == 0


async def test_squeeze_serializes_instead_of_failing(forged) -> None:
    """8 episodes on a budget of ONE episode's peak: the work fits only one at a time, so
    the scheduler serializes it — every step recorded ok or degraded (none failed), the
    ledger's peak within the budget, back to zero at the end."""
    from cachepolicy.engine import Engine, EngineConfig
    from replay_helpers import replay

    m = forged("qwen35")
    traj = trajectory(6, 96, 64)
    with Engine(m.model_path, m.mmproj_path,
                EngineConfig(n_ctx_per_seq=2048, n_seq_max=8, n_batch=32, n_threads=1,
                             image_cache_bytes=64_000)) as e:
        factory = SegmentFactory(e)
        calib = MemoryLedger(1 << 30)
        async with Scheduler(e, calib, factory, options=AGENT.step_options()) as sched:
            await replay(sched, traj, 1)
        budget = calib.snapshot().peak  # 1.0x
        ledger = MemoryLedger(budget)
        async with Scheduler(e, ledger, factory, options=AGENT.step_options(),
                             wait_s=10.0) as sched:
            with anyio.fail_after(120):
                runs = await replay(sched, traj, 8)
            sched.check_integrity()
    assert [r.n_steps for r in runs] == [6] * 8
    assert all(s.status in ("ok", "degraded") for r in runs for s in r.steps)
    snap = ledger.snapshot()
    assert snap.peak <= budget and snap.held == 0 and snap.reserved == 0
