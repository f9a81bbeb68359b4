"""Fault injection on the real engine (forged tiny qwen35), the environment's side: a VM
step that raises or hangs (async, or blocked in a worker thread), and screenshots that are
missing, empty, corrupt, bombs, huge, not images, in another format, or of another size.

Each fault has its defined outcome (docs/reliability.md); ``run_three`` checks for every one
that the other concurrent episodes are unaffected, the ledger returns to zero and every
completed step is on disk.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import anyio
from PIL import Image
import pytest
from structlog.testing import capture_logs

from bad_images import bomb_png, corrupt_png, header_only_png, jpeg_of, png_of_size
from fault_helpers import FAULT_AT, STEPS, TRAJ, FaultyEnv, engine, failed_at, run_three, shot  # noqa: F401
from runtime.errors import describe_error
from runtime.run.progress import summary_table
from runtime.run.recording import METRICS_FILE
from runtime.run.agents import RunResult
from vmenv.base import Env
from vmenv.osworld import OSWorldEnv
from vmenv.osworld_fake import FakeDesktopEnv
from vmenv.osworld_vm.protocol import simdesk_example
from vmenv.trajectory_writer import TRAJ_FILE


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


