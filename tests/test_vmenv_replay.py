"""Replay env and trajectory files: recorded screens in order, typed errors for corrupt input."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest
from PIL import Image

from runtime.actions import Click, NoOp, TypeText, Wait
from vmenv import (
    Env, EpisodeOverError, NotResetError, ReplayEnv, ScreenshotError, SimDesk, TrajectoryError,
    TrajectoryPathError, load_trajectory, png_size, record_trajectory,
)
from vmenv.trajectory import TRAJ_FILE


def _png(color: tuple[int, int, int], size: tuple[int, int] = (32, 24)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture
async def recorded(tmp_path: Path) -> tuple[Path, list[bytes]]:
    """save-note solved on the simulated desktop and recorded; plus the screens it showed."""
    desk = SimDesk()
    await desk.reset("save-note")
    script = desk.solution()
    out = await record_trajectory(desk, script, tmp_path / "traj", task="save-note")
    # the screens a fresh desktop shows for that script, for comparison
    again = SimDesk()
    shots = [(await again.reset("save-note")).screenshot]
    shots += [(await again.step(a)).observation.screenshot for a in script]
    return out, shots


async def test_replay_returns_recorded_screens_in_order_and_ends(recorded) -> None:
    path, shots = recorded
    env = ReplayEnv.from_dir(path)
    assert isinstance(env, Env) and len(env) == len(shots) == 5
    obs = await env.reset()
    assert obs.screenshot == shots[0] and obs.step == 0 and obs.size == (1280, 720)
    assert "Save" in obs.instruction
    seen = [obs.screenshot]
    outs = []
    for _ in range(len(shots) - 1):  # whatever the agent does, the recording plays on
        outs.append(await env.step(NoOp("ignored", "garbage")))
        seen.append(outs[-1].observation.screenshot)
    assert seen == shots
    assert [o.done for o in outs] == [False, False, False, True]
    assert [o.reward for o in outs] == [0.0, 0.0, 0.0, 1.0]
    assert outs[0].info["recorded_action"] == env.recorded_actions[0]
    assert env.recorded_actions[2] == 'type("hello")' and env.recorded_actions[-1] is None
    with pytest.raises(EpisodeOverError):
        await env.step(Wait(1.0))
    again = await env.reset()  # and it replays again from the start
    assert again.screenshot == shots[0]


async def test_recorded_files_follow_osworld_layout(recorded) -> None:
    path, _ = recorded
    lines = [json.loads(s) for s in (path / TRAJ_FILE).read_text().splitlines()]
    assert [e["step_num"] for e in lines] == [0, 1, 2, 3, 4]
    assert lines[0]["action"] is None
    assert lines[1]["action"].startswith("pyautogui.click(")
    assert lines[3]["action"].startswith("pyautogui.typewrite('hello'")
    assert all((path / e["screenshot_file"]).is_file() for e in lines)
    with pytest.raises(TrajectoryError, match="already holds"):
        await record_trajectory(SimDesk(), [], path)


async def test_in_memory_pairs_and_vm_seconds() -> None:
    shots = [_png((i * 40, 0, 0)) for i in range(3)]
    requested: list[float] = []

    async def fake_sleep(s: float) -> None:
        requested.append(s)

    env = ReplayEnv.from_pairs(zip(shots, ["click(1, 2)", "done()", None]), instruction="go",
                               vm_seconds=3.0, sleep=fake_sleep)
    obs = await env.reset()
    assert (obs.screenshot, obs.instruction, obs.size) == (shots[0], "go", (32, 24))
    o1 = await env.step(Click(5, 5))
    o2 = await env.step(TypeText("x"))
    assert [o1.observation.screenshot, o2.observation.screenshot] == shots[1:]
    assert (o1.done, o2.done) == (False, True) and requested == [3.0, 3.0]
    assert o2.info["recorded_action"] == "done()" and o2.info["action"] == 'type("x")'

    real = ReplayEnv.from_pairs([(shots[0], "wait(1)"), (shots[1], None)], vm_seconds=0.05)
    await real.reset()
    t0 = time.monotonic()
    await real.step(Wait(1.0))
    assert time.monotonic() - t0 >= 0.05


async def test_step_before_reset_and_closed() -> None:
    env = ReplayEnv.from_pairs([(_png((1, 2, 3)), None)])
    with pytest.raises(NotResetError):
        await env.step(Wait(1.0))
    await env.reset()
    with pytest.raises(EpisodeOverError):  # a one-screen recording has no steps
        await env.step(Wait(1.0))
    await env.close()
    with pytest.raises(Exception, match="closed"):
        await env.reset()
    with pytest.raises(ValueError):
        ReplayEnv(env.trajectory, vm_seconds=-1)


def test_osworld_directory_without_a_first_screen(tmp_path: Path) -> None:
    """OSWorld saves only post-action screens: the first one stands in for the reset screen."""
    for i in (1, 2, 3):
        (tmp_path / f"step_{i}_2024.png").write_bytes(_png((i, i, i)))
    lines = [{"step_num": i, "action": f"pyautogui.press('tab')  # {i}", "reward": 0,
              "done": i == 3, "screenshot_file": f"step_{i}_2024.png"} for i in (1, 2, 3)]
    (tmp_path / TRAJ_FILE).write_text("\n".join(json.dumps(e) for e in lines) + "\n\n")
    traj = load_trajectory(tmp_path)
    assert [f.screenshot for f in traj.frames] == [_png((i, i, i)) for i in (1, 2, 3)]
    assert traj.actions == ("pyautogui.press('tab')  # 2", "pyautogui.press('tab')  # 3", None)


def _write(tmp_path: Path, entries: list, files: dict[str, bytes] | None = None) -> Path:
    d = tmp_path / "t"
    d.mkdir(exist_ok=True)
    for name, data in (files or {"a.png": _png((9, 9, 9))}).items():
        (d / name).write_bytes(data)
    (d / TRAJ_FILE).write_text(
        "\n".join(e if isinstance(e, str) else json.dumps(e) for e in entries) + "\n")
    return d


GOOD = {"step_num": 0, "action": None, "screenshot_file": "a.png"}


@pytest.mark.parametrize(("entries", "files", "match"), [
    (["{not json"], None, "not JSON"),
    (["[1, 2]"], None, "JSON object"),
    ([], None, "no steps"),
    ([{"step_num": 0, "action": None}], None, "screenshot_file"),
    ([{**GOOD, "step_num": "0"}], None, "step_num"),
    ([GOOD, GOOD], None, "step_num"),
    ([{**GOOD, "screenshot_file": "missing.png"}], None, "cannot read"),
    ([GOOD], {"a.png": b"GIF89a not a png"}, "signature"),
    ([GOOD], {"a.png": _png((1, 1, 1))[:-20]}, "corrupt"),
    ([{**GOOD, "reward": "high"}], None, "reward"),
    ([{**GOOD, "reward": float("nan")}], None, "reward"),
])
def test_corrupt_trajectories_raise_trajectory_errors(tmp_path: Path, entries, files,
                                                      match: str) -> None:
    d = _write(tmp_path, entries, files)
    with pytest.raises(TrajectoryError, match=match):
        load_trajectory(d)


@pytest.mark.parametrize("name", ["../outside.png", "sub/../../outside.png", "/etc/passwd",
                                  "link.png"])
def test_paths_escaping_the_directory_are_refused(tmp_path: Path, name: str) -> None:
    (tmp_path / "outside.png").write_bytes(_png((5, 5, 5)))
    d = _write(tmp_path, [{**GOOD, "screenshot_file": name}])
    (d / "sub").mkdir()
    os.symlink(tmp_path / "outside.png", d / "link.png")
    with pytest.raises(TrajectoryPathError):
        load_trajectory(d)


def test_missing_directory_and_bad_pairs(tmp_path: Path) -> None:
    with pytest.raises(TrajectoryError):
        load_trajectory(tmp_path / "nope")
    with pytest.raises(TrajectoryError, match="pair 1"):
        ReplayEnv.from_pairs([(_png((0, 0, 0)), None), (b"\x89PNG\r\n\x1a\nxx", None)])
    with pytest.raises(TrajectoryError, match="at least one"):
        ReplayEnv.from_pairs([])
    with pytest.raises(ScreenshotError):
        png_size(b"")
    assert png_size(_png((0, 0, 0), (7, 5))) == (7, 5)


def test_a_screenshot_named_by_many_lines_is_read_once(tmp_path: Path) -> None:
    (tmp_path / "shot.png").write_bytes(_png((10, 20, 30)))
    lines = [{"step_num": i, "action": "WAIT", "screenshot_file": "shot.png"}
             for i in range(600)]
    (tmp_path / TRAJ_FILE).write_text("\n".join(json.dumps(x) for x in lines))
    traj = load_trajectory(tmp_path)
    assert len(traj.frames) == 600
    assert all(f.screenshot is traj.frames[0].screenshot for f in traj.frames)  # one copy


def test_fifos_and_huge_files_are_refused_without_reading(tmp_path: Path, monkeypatch) -> None:
    import vmenv.trajectory as trajectory

    os.mkfifo(tmp_path / "step_1.png")  # opening it for reading would block forever
    (tmp_path / TRAJ_FILE).write_text(json.dumps(
        {"step_num": 1, "action": "WAIT", "screenshot_file": "step_1.png"}))
    t0 = time.monotonic()
    with pytest.raises(TrajectoryError, match="not a regular file"):
        load_trajectory(tmp_path)
    assert time.monotonic() - t0 < 5
    (tmp_path / "step_1.png").unlink()
    (tmp_path / "step_1.png").write_bytes(_png((10, 20, 30)))
    monkeypatch.setattr(trajectory, "MAX_SCREENSHOT_BYTES", 10)
    with pytest.raises(TrajectoryError, match="more than the 10 a screenshot may have"):
        load_trajectory(tmp_path)
    monkeypatch.setattr(trajectory, "MAX_SCREENSHOT_BYTES", 1 << 20)
    monkeypatch.setattr(trajectory, "MAX_TOTAL_SCREENSHOT_BYTES", 10)
    with pytest.raises(TrajectoryError, match="screenshots pass 10 bytes"):
        load_trajectory(tmp_path)
