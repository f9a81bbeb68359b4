"""Contract tests against OSWorld's own code: the real ``DesktopEnv`` (desktop-env 1.0.2,
installed with ``--no-deps``) driven against the loopback VM server over the simulated
desktop, with ``KvAgent`` on its default model (kvagent's shipped trained hybrid) or the forged
tiny qwen35 (random weights: aimless, valid actions).

Only the VM is a stand-in; DesktopEnv, PythonController, SetupController and the evaluator
(getter ``vm_command_line`` + metric ``check_include_exclude``) are OSWorld's.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from fake_desktop_env import FakeDesktopEnv, assert_action_contract
from osworld_runner_like import ARGS, TRAJ_KEYS, InfoRecorder, run_single_example_like
from PIL import Image

from runtime.actions import Click, DragTo, MoveTo, parse_action, to_pyautogui
from runtime.profiles import get, names, pointer_after
from vmenv.actions import SPECIAL_ACTIONS
from vmenv.osworld import OSWorldEnv
from vmenv.osworld_vm import VmServer, simdesk_example, vm_server
from vmenv.osworld_vm.desktop_env_import import DESKTOP_ENV_INSTALL, load_desktop_env
from vmenv.osworld_vm.machine import action_record
from vmenv.png import image_size, png_size, screenshot_png
from vmenv.simdesk.tasks import default_tasks
from vmenv.simdesk.widgets import locate

try:
    DesktopEnv = load_desktop_env().DesktopEnv
except ModuleNotFoundError as exc:  # desktop-env is an extra install step, not a dependency
    if exc.name != "desktop_env":
        raise  # desktop-env is there but a light package of the test extra is missing
    pytest.skip(f"OSWorld's desktop_env is not installed: {DESKTOP_ENV_INSTALL}",
                allow_module_level=True)

# the provider module imports OSWorld's base classes: only after the skip check
from vmenv.osworld_vm.provider import LOOPBACK_REGION, PROVIDER_NAME  # noqa: E402

SCREEN = (320, 240)


def _env(vm: VmServer, tmp_path: Path, **kwargs: Any) -> Any:
    """A DesktopEnv on the loopback server, built with run.py's keyword arguments."""
    opts: dict[str, Any] = {
        "provider_name": PROVIDER_NAME, "region": LOOPBACK_REGION, "path_to_vm": vm.address,
        "snapshot_name": "init_state", "action_space": "pyautogui", "screen_size": SCREEN,
        "headless": True, "os_type": "Ubuntu", "require_a11y_tree": False,
        "cache_dir": str(tmp_path / "cache")}
    opts.update(kwargs)
    return DesktopEnv(**opts)


def _status(vm: VmServer) -> dict[str, Any]:
    import requests  # one of the test extras (OSWorld's controllers use it)
    reply = requests.get(f"{vm.url}/simdesk/status", timeout=10)
    reply.raise_for_status()
    status: dict[str, Any] = reply.json()
    return status


@pytest.fixture
def kv_agent(forged: Any, kv_agents: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``KvAgent(**options)`` without a model: kvagent's shipped trained hybrid (the model
    cache points at the test session's, so nothing is written to ~/.cache)."""
    model = forged("qwen35")
    monkeypatch.setenv("KVAGENT_CACHE_DIR", str(model.model_path.parent.parent))
    return lambda **kw: kv_agents(**{"model_path": None, "mmproj_path": None, "n_ctx": 4096,
                                     "screen_size": SCREEN, **kw})


def test_run_single_example_against_the_real_desktop_env(kv_agent: Any, tmp_path: Path) -> None:
    """lib_run_single's calls in its order; the codes the agent returned reach the VM intact
    (the VM applied exactly what the same strings mean on the local fake) and OSWorld's own
    evaluator reports the task checker's verdict."""
    example = simdesk_example("type-in-field")
    out = tmp_path / "pyautogui" / "screenshot" / "kvagent-tiny" / "simdesk" / example["id"]
    out.mkdir(parents=True)
    rec, scores = InfoRecorder(kv_agent(temperature=1.0, seed=7)), []
    with vm_server("open-terminal", SCREEN) as vm:  # the example's setup step switches task
        env = _env(vm, tmp_path)
        returned = run_single_example_like(rec, env, example, 3, example["instruction"], ARGS,
                                           str(out), scores)
        status = _status(vm)
        env.close()
    codes = [actions[0] for _, actions in returned]
    assert 1 <= len(returned) <= 3 and all(len(a) == 1 for _, a in returned)
    for code, info in zip(codes, rec.infos):
        assert_action_contract(code, SCREEN)
        assert info["code"] == code and info["prefill_tokens"] > 0
    assert any(c.startswith("pyautogui.") for c in codes)  # seed 7 acts on the desktop
    fake = FakeDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    fake.reset(example)
    for code in codes:
        fake.step(code, 0)
    assert status["task"] == "type-in-field"
    assert status["actions"] == [action_record(a) for a in fake.applied]
    assert scores == [fake.evaluate()]
    assert float((out / "result.txt").read_text()) == scores[0]
    lines = [json.loads(x) for x in (out / "traj.jsonl").read_text().splitlines()]
    assert [line["action"] for line in lines] == codes
    for i, line in enumerate(lines, start=1):
        assert set(line) == TRAJ_KEYS and line["step_num"] == i
        assert png_size((out / line["screenshot_file"]).read_bytes()) == SCREEN
    executed = [c for c in codes if c not in SPECIAL_ACTIONS]
    with Image.open(out / "recording.mp4") as video:  # APNG: the state at start + each step
        assert video.n_frames == 1 + len(executed)


def test_evaluate_reports_the_checker_and_reset_reverts(tmp_path: Path) -> None:
    """OSWorld's evaluate() with its own getter and metric follows the simdesk checker; a
    reset after steps reverts the "VM" through the provider."""
    example = simdesk_example("save-note")
    fake = FakeDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    fake.reset(example)
    solution = default_tasks()["save-note"].solve(fake.state)
    with vm_server("click-ok", SCREEN) as vm:
        env = _env(vm, tmp_path)
        first = env.reset(task_config=example)
        assert first["screenshot"] == fake._screenshot() and first["instruction"]
        assert env.evaluate() == 0
        for action in solution[:-1]:
            env.step(to_pyautogui(action), 0)
        assert env.evaluate() == 0  # not saved yet
        obs, reward, done, info = env.step(to_pyautogui(solution[-1]), 0)
        assert (reward, done, info) == (0, False, {})  # DesktopEnv's own semantics
        assert env.evaluate() == 1.0
        assert env.step("FAIL", 0)[2:] == (True, {"fail": True})
        assert env.evaluate() == 0  # a final FAIL scores 0 whatever the screen shows
        again = env.reset(task_config=example)
        assert again["screenshot"] == first["screenshot"] and env.evaluate() == 0
        assert _status(vm)["actions"] == []
        env.close()


def test_run_py_style_construction_reads_agent_action_space(kv_agent: Any,
                                                            tmp_path: Path) -> None:
    agent = kv_agent()
    assert agent.action_space == agent.config.action_space == "pyautogui"
    with vm_server("click-ok", SCREEN) as vm:
        env = _env(vm, tmp_path, action_space=agent.action_space)
        assert env.action_space == "pyautogui" and env.vm_platform == "Linux"
        assert env.vm_screen_size == {"width": SCREEN[0], "height": SCREEN[1]}
        obs = env.reset(task_config=simdesk_example("click-ok"))
        agent.reset(vm_ip=env.vm_ip)
        for _ in range(2):
            _, actions = agent.predict(obs["instruction"], obs)
            assert_action_contract(actions[0], SCREEN)
            obs, _, done, _ = env.step(actions[0], 0)
            assert png_size(obs["screenshot"]) == SCREEN
            if done:
                break
        env.close()


def test_jpeg_screenshots_reach_the_agent(kv_agent: Any, tmp_path: Path) -> None:
    """PythonController accepts JPEG; KvAgent decodes it (it used to answer WAIT) and the
    engine sees the same image as the JPEG's PNG conversion."""
    agent = kv_agent()  # greedy: equal inputs give equal outputs
    with vm_server("open-terminal", SCREEN, fmt="jpeg") as vm:
        env = _env(vm, tmp_path)
        obs = env.reset(task_config=simdesk_example("open-terminal"))
        env.close()
    jpeg = obs["screenshot"]
    assert jpeg[:3] == b"\xff\xd8\xff" and image_size(jpeg) == ("JPEG", SCREEN)
    agent.reset()
    r1, a1, info1 = agent.predict_with_info(obs["instruction"], obs)
    assert info1["status"] != "no_screenshot" and info1["prefill_tokens"] > 0
    agent.reset()
    png, _ = screenshot_png(jpeg)
    r2, a2, info2 = agent.predict_with_info(obs["instruction"], {**obs, "screenshot": png})
    assert (r1, a1, info1["prefill_tokens"]) == (r2, a2, info2["prefill_tokens"])
    response, actions = agent.predict(obs["instruction"], {**obs, "screenshot": jpeg[:-64]})
    assert actions == ["WAIT"] and "not a valid image" in response  # truncated: refused


def _end_point(action: dict[str, Any]) -> tuple[int, int]:
    return (action["x1"], action["y1"]) if action["kind"] == "drag" else (action["x"], action["y"])


def test_coordinates_are_scaled_from_screenshot_to_screen(kv_agent: Any,
                                                          tmp_path: Path) -> None:
    """Screenshots twice the screen's size (HiDPI): the model points in screenshot pixels,
    pyautogui needs screen pixels; every pointer action must land inside the screen, at the
    model's point scaled by screen / screenshot."""
    shot = (2 * SCREEN[0], 2 * SCREEN[1])
    # screen_size=SCREEN: the VM's screen; its screenshots are twice that (told so)
    agent = kv_agent(temperature=1.0, seed=7, scale_to_screen=True)
    checked = 0
    with vm_server("open-terminal", SCREEN, screenshot_size=shot) as vm:
        env = _env(vm, tmp_path)
        obs = env.reset(task_config=simdesk_example("open-terminal"))
        assert image_size(obs["screenshot"])[1] == shot
        assert env.vm_screen_size == {"width": SCREEN[0], "height": SCREEN[1]}
        agent.reset(vm_ip=env.vm_ip)
        for _ in range(4):
            response, actions = agent.predict(obs["instruction"], obs)
            model_text = response.partition("\n[kvagent: ")[0]  # what kvagent noted follows
            meant = parse_action(model_text, screen=shot)  # the model's point, screenshot px
            obs, _, done, _ = env.step(actions[0], 0)
            if isinstance(meant, Click | MoveTo | DragTo):
                u, v = (meant.x1, meant.y1) if isinstance(meant, DragTo) else (meant.x, meant.y)
                x, y = _end_point(_status(vm)["actions"][-1])
                assert 0 <= x < SCREEN[0] and 0 <= y < SCREEN[1], (x, y)
                assert abs(x - u * SCREEN[0] / shot[0]) <= 1, (x, u)
                assert abs(y - v * SCREEN[1] / shot[1]) <= 1, (y, v)
                checked += 1
            if done:
                break
        env.close()
    assert checked > 0, "the agent made no pointer action to check"


def test_recording_file_is_playable(tmp_path: Path) -> None:
    """end_recording writes what the server sent: an animated PNG Pillow can open."""
    with vm_server("open-terminal", SCREEN) as vm:
        env = _env(vm, tmp_path)
        env.reset(task_config=simdesk_example("open-terminal"))
        env.controller.start_recording()
        env.step("pyautogui.moveTo(10, 10)", 0)
        dest = tmp_path / "recording.mp4"
        env.controller.end_recording(str(dest))
        env.close()
    with Image.open(io.BytesIO(dest.read_bytes())) as video:
        assert video.n_frames == 2 and video.size == SCREEN


async def test_osworld_env_adapter_builds_and_drives_the_real_desktop_env(tmp_path: Path) -> None:
    """kvagent's async adapter builds OSWorld's DesktopEnv itself (through the light import)
    and reads its JPEG screenshots."""
    fake = FakeDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    fake.reset(simdesk_example("click-ok"))
    with vm_server("open-terminal", SCREEN, fmt="jpeg") as vm:
        env = OSWorldEnv(desktop_kwargs={
            "provider_name": PROVIDER_NAME, "region": LOOPBACK_REGION, "path_to_vm": vm.address,
            "screen_size": SCREEN, "headless": True, "require_a11y_tree": False,
            "cache_dir": str(tmp_path / "cache")}, pause=0.0, settle_s=0.0)
        obs = await env.reset(simdesk_example("click-ok"))
        assert png_size(obs.screenshot) == (obs.width, obs.height) == SCREEN
        assert await env.evaluate() == 0
        out = await env.step(Click(*locate(fake.state, "dialog.ok")))
        assert png_size(out.observation.screenshot) == SCREEN and not out.done
        assert await env.evaluate() == 1.0
        await env.close()


@pytest.mark.parametrize("name", names())
def test_each_profile_drives_the_real_desktop_env(kv_agent: Any, tmp_path: Path,
                                                  name: str) -> None:
    """Every profile end to end: its grammar-constrained responses parse into pyautogui
    code on the screen, its prompt and instruction open the log, and each decided step
    enters the history as the profile's own line."""
    profile = get(name)
    agent = kv_agent(profile=name, n_ctx=None, temperature=1.0, seed=11)  # n_ctx: derived
    assert agent.config.agent.window == profile.layout.window  # the trained window
    example = simdesk_example("open-terminal")
    responses, notes = [], []
    with vm_server("open-terminal", SCREEN) as vm:
        env = _env(vm, tmp_path)
        obs = env.reset(task_config=example)
        agent.reset(vm_ip=env.vm_ip)
        for _ in range(3):  # on past DONE / FAIL too: the history keeps growing
            response, actions, info = agent.predict_with_info(example["instruction"], obs)
            # every response parses — but a Qwen3-VL drag from the pointer before any action
            # has placed it cannot be carried out (kvagent never guesses where it is)
            assert info["parsed"] or name == "qwen3vl" and info["notes"] == [
                "not an action: left_click_drag starts at the pointer, whose position is "
                "unknown"], (response, info["notes"])
            assert_action_contract(actions[0], SCREEN)
            responses.append(info["model_response"])  # without kvagent's notes
            notes.append(info["notes"])
            if actions[0] not in SPECIAL_ACTIONS:
                obs, *_ = env.step(actions[0], 0)
        status = agent.status()
        env.close()
    assert profile.system_prompt(*SCREEN) in status.head
    assert profile.layout.instruction_text(example["instruction"]) in status.head
    expected, pointer = [], None
    for i, response in enumerate(responses):
        parsed = profile.parse(response, SCREEN, pointer=pointer)
        pointer = pointer_after(parsed.action, pointer)
        text = profile.history_text(parsed.action, response, SCREEN)
        expected.append(profile.layout.step_text(i, text.strip()))
    # UI-TARS 1.5 points in the pixels of its processor's resize (28 px cells, at least 100
    # of them); this projector (Qwen3-VL's 32 px cells) makes 80 tokens of 320x240: said once
    mismatch = [[n for n in step if "image tokens of the 320x240 screenshot" in n]
                for step in notes]
    assert mismatch == ([[f"the projector made 80 image tokens of the 320x240 screenshot "
                          f"where the uitars model's processor makes "
                          f"{profile.image_tokens(SCREEN)}: its points may be off target"],
                         [], []] if name == "uitars" else [[], [], []])
    # the last step's line is in once its prefetch ran (it may still be running)
    assert len(status.history) >= 2
    assert list(status.history) == expected[:len(status.history)]


def test_run_multienv_style_workers_leak_nothing(forged: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Two worker processes, each with a real DesktopEnv (its own loopback VM) and a KvAgent,
    drain one task queue and end with os._exit without closing the agent: every task is
    recorded once in OSWorld's layout, and nothing outlives the workers — no child process,
    no temporary file; each engine took $KVAGENT_THREADS threads, not every core."""
    import multiprocessing

    from osworld_multienv_like import MODEL_NAME, worker

    model = forged("qwen35")
    tasks = ["open-terminal", "click-ok", "type-in-field", "save-note"]
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter, as a VM worker has
    queue_ = ctx.Queue()
    for name in tasks:
        queue_.put(("simdesk", simdesk_example(name)))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    results = tmp_path / "results"
    with vm_server("open-terminal", SCREEN) as vm0, vm_server("open-terminal", SCREEN) as vm1:
        monkeypatch.setenv("TMPDIR", str(scratch))  # the workers' temporary files
        monkeypatch.setenv("KVAGENT_THREADS", "1")
        workers = [ctx.Process(target=worker, args=(
            queue_, vm.address, str(results), str(model.model_path), str(model.mmproj_path),
            SCREEN, str(tmp_path / f"report{i}.json"))) for i, vm in enumerate((vm0, vm1))]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=240)
    assert [w.exitcode for w in workers] == [0, 0]
    reports = [json.loads((tmp_path / f"report{i}.json").read_text()) for i in range(2)]
    assert sorted(t for r in reports for t in r["done"]) == sorted(tasks)  # each task once
    assert all(r["children"] == [] and r["n_threads"] == 1 for r in reports)
    assert list(scratch.iterdir()) == []
    for name in tasks:
        out = results / "pyautogui" / "screenshot" / MODEL_NAME / "simdesk" / name
        lines = [json.loads(x) for x in (out / "traj.jsonl").read_text().splitlines()]
        assert 1 <= len(lines) <= 2 and all(set(x) == TRAJ_KEYS for x in lines)
        for x in lines:
            assert_action_contract(x["action"], SCREEN)
            assert png_size((out / x["screenshot_file"]).read_bytes()) == SCREEN
        assert float((out / "result.txt").read_text()) in (0.0, 1.0)
        assert (out / "recording.mp4").stat().st_size > 0
