"""KvAgent's sizes: the context checked (or derived) before the model loads, points scaled
from the screenshot to the screen, the parser's notes in ``last_info``, the default thread
count.  The engine is the forged tiny qwen35 (random weights: aimless, valid actions).
"""

from __future__ import annotations

import io
import os
import re
from typing import Any

import numpy as np
import pytest
from fake_desktop_env import CheckingDesktopEnv, assert_action_contract
from PIL import Image

from cachepolicy.engine.records import THREADS_ENV, default_threads
from runtime.actions import Click, DragTo, MoveTo, Scroll, TypeText, parse_action, to_pyautogui
from runtime.context_budget import ContextBudgetError, blank_png, estimate_image_tokens
from runtime.osworld import AgentStepError, KvAgent
from runtime.osworld.agent import ScreenSizeError
from runtime.osworld.config import KvAgentConfig
from vmenv.actions.rescale import rescale, rescale_axis

SCREEN = (320, 240)
HD = (1920, 1080)


def _png(size: tuple[int, int], seed: int = 0) -> bytes:
    """A noisy screenshot (blocks of 8 px) of ``size``."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 255, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(blocks).resize(size, Image.NEAREST).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture
def agent_of(kv_agents: Any) -> Any:
    return lambda **kw: kv_agents(**{"temperature": 1.0, "seed": 7, **kw})


# ---------------------------------------------------------------- the context

def test_projector_metadata_estimate_bounds_the_real_count(forged: Any, engines: Any) -> None:
    """What the context is sized from before loading is what the loaded projector says, or
    a little more where the projector resizes (1000 px is not a whole number of 32 px cells:
    the estimate rounds up, the projector down)."""
    e = engines("qwen35")
    mmproj = forged("qwen35").mmproj_path
    for size in [(320, 240), (1280, 720), HD]:
        assert estimate_image_tokens(mmproj, size) == e.image_tokens(blank_png(size))[0], size
    real = e.image_tokens(blank_png((1000, 1000)))[0]
    assert real < estimate_image_tokens(mmproj, (1000, 1000)) <= real * 11 // 10


def test_too_small_context_fails_at_construction_naming_the_knobs(agent_of: Any) -> None:
    with pytest.raises(ContextBudgetError) as err:  # what examples/osworld_runner.py used
        agent_of(n_ctx=4096, screen_size=HD)
    msg = str(err.value)
    assert "n_ctx=4096" in msg and "window" in msg and "smaller screenshots" in msg
    assert "3 screenshot(s) of 1920x1080" in msg and "max_steps" in msg
    need = int(re.search(r"at least (\d+)", msg)[1])
    assert need > 3 * 2040  # three screenshots of ~2040 tokens alone exceed 6K
    agent = agent_of(n_ctx=need, screen_size=HD)  # the size it names is enough
    assert agent.n_ctx == need
    with pytest.raises(ContextBudgetError, match="lower the window"):
        agent_of(window=2, n_ctx=need // 2, screen_size=HD)


def test_unknown_profiles_and_conventions_fail_at_construction(agent_of: Any) -> None:
    with pytest.raises(ValueError, match="known: kvagent, qwen3vl, uitars, uitars-v1"):
        agent_of(profile="gpt-4o")
    with pytest.raises(ValueError, match="fixes its own"):  # Qwen3-VL's grid is its own
        agent_of(profile="qwen3vl", coord_convention="relative_1")


def test_1920x1080_with_defaults_runs_a_full_window(agent_of: Any) -> None:
    """The default context is derived from the screen: a 1920x1080 episode runs until its
    window (3 screenshots) is full — it used to fail at its second step on n_ctx=4096."""
    agent = agent_of(screen_size=HD, n_threads=2)
    png = _png(HD)  # the same screen each step: encoded once (embedding cache), prefilled 3x
    agent.reset()
    contexts = []
    for _ in range(3):
        _, actions, info = agent.predict_with_info("Open the terminal.", {"screenshot": png})
        assert info["status"] == "ok" and info["prefill_tokens"] > 0
        assert_action_contract(actions[0], HD)
        contexts.append(info["context_tokens"])
    assert contexts[2] > 3 * 2040 and max(contexts) <= agent.n_ctx


def test_screenshots_larger_than_sized_for_fail_before_running(agent_of: Any) -> None:
    # scaled screenshots allowed (a HiDPI VM); the context holds 320x240 ones, not 1920x1080
    agent = agent_of(n_ctx=3072, scale_to_screen=True)
    agent.reset()
    with pytest.raises(AgentStepError) as err:
        agent.predict("Open the terminal.", {"screenshot": blank_png(HD)})
    assert "1920x1080" in str(err.value) and "n_ctx=3072" in str(err.value)
    assert agent.status().steps == 0  # nothing ran
    _, actions = agent.predict("Open the terminal.", {"screenshot": blank_png(SCREEN)})
    assert_action_contract(actions[0], SCREEN)


# ---------------------------------------------------------------- screenshot → screen

@pytest.mark.parametrize("shot", [(160, 120), (640, 480)])
def test_a_screenshot_of_another_size_than_the_screen_is_refused_either_way(
        agent_of: Any, shot: tuple[int, int], caplog: pytest.LogCaptureFixture) -> None:
    """OSWorld's screenshots are at the VM's resolution: another size means a wrong
    screen_size — the same clear error whether the screenshot is smaller or larger, logged
    where OSWorld keeps logs (the example's runtime.log logger and the desktopenv ones)."""
    import logging

    runtime_log = logging.getLogger("desktopenv.example.test-mismatch")
    agent = agent_of()  # screen_size=SCREEN
    agent.reset(runtime_log)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(ScreenSizeError, match=rf"{shot[0]}x{shot[1]} but screen_size is "
                                                  rf"{SCREEN[0]}x{SCREEN[1]}.*scale_to_screen"):
            agent.predict("Open the terminal.", {"screenshot": blank_png(shot)})
    # once: the example's logger propagates to the root, where the desktopenv logs are too
    assert [r.name for r in caplog.records if "screen_size" in r.getMessage()] == [
        "desktopenv.example.test-mismatch"]


def test_every_adjustment_is_noted_for_osworld(agent_of: Any,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """Scaled points and a WAIT for an unreadable screenshot: in last_info["notes"], in the
    response OSWorld writes to traj.jsonl, and in its logs."""
    import logging

    agent = agent_of(scale_to_screen=True, n_ctx=4096)
    agent.reset(logging.getLogger("desktopenv.example.test-notes"))
    with caplog.at_level(logging.WARNING):
        response, _ = agent.predict("Open the terminal.", {"screenshot": b"not an image"})
        assert "[kvagent: answered WAIT without asking the model" in response
        assert agent.last_info["notes"][0].startswith("answered WAIT")
        big = (2 * SCREEN[0], 2 * SCREEN[1])
        for _ in range(12):  # until the model points at something (random weights)
            response, _ = agent.predict("Open the terminal.", {"screenshot": blank_png(big)})
            if any("scaled" in n for n in agent.last_info["notes"]):
                break
    scaled = [n for n in agent.last_info["notes"] if "scaled" in n]
    assert scaled == [f"points scaled from the {big[0]}x{big[1]} screenshot to the "
                      f"{SCREEN[0]}x{SCREEN[1]} screen"]
    assert scaled[0] in response
    messages = [r.getMessage() for r in caplog.records
                if r.name == "desktopenv.example.test-notes"]
    assert any("answered WAIT" in m for m in messages) and any("scaled" in m for m in messages)


def test_each_note_is_in_each_of_osworlds_logs_once(agent_of: Any, tmp_path: Any) -> None:
    """OSWorld's run.py logging (root: normal / debug files, stdout and sdebug filtered to
    "desktopenv") and lib_run_single's setup_logger (desktopenv.example.<id> with its
    runtime.log, propagating): a note is written once to each, also when a runner passes
    the logger as reset(runtime_logger=...)."""
    import logging

    root, before = logging.getLogger(), logging.getLogger().level
    stdout = io.StringIO()
    handlers = {"normal": logging.FileHandler(tmp_path / "normal.log"),
                "debug": logging.FileHandler(tmp_path / "debug.log"),
                "stdout": logging.StreamHandler(stdout),
                "sdebug": logging.FileHandler(tmp_path / "sdebug.log")}
    for name, handler in handlers.items():
        handler.setLevel(logging.DEBUG if "debug" in name else logging.INFO)
        if name in ("stdout", "sdebug"):
            handler.addFilter(logging.Filter("desktopenv"))
        root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    runtime_logger = logging.getLogger("desktopenv.example.test-once")
    runtime_logger.setLevel(logging.DEBUG)
    runtime_file = logging.FileHandler(tmp_path / "runtime.log")
    runtime_logger.addHandler(runtime_file)
    agent = agent_of(n_ctx=4096)
    try:
        agent.reset(runtime_logger, vm_ip="127.0.0.1")
        agent.predict("Open the terminal.", {"screenshot": b"not an image"})
        agent.reset(runtime_logger=runtime_logger, vm_ip="127.0.0.1")
        agent.predict("Open the terminal.", {"screenshot": b"not an image either"})
    finally:
        for handler in (*handlers.values(), runtime_file):
            handler.close()
        for handler in handlers.values():
            root.removeHandler(handler)
        runtime_logger.removeHandler(runtime_file)
        root.setLevel(before)
    logs = {name: (tmp_path / f"{name}.log").read_text() for name in handlers if name != "stdout"}
    logs["stdout"], logs["runtime"] = stdout.getvalue(), (tmp_path / "runtime.log").read_text()
    for name, text in logs.items():
        assert text.count("answered WAIT") == 2, (name, text)


def test_rescale_maps_pixel_centres() -> None:
    # 640 -> 320: screenshot pixel u covers screen [u/2, (u+1)/2), its centre (2u+1)/4
    assert rescale(Click(639, 479), (640, 480), SCREEN) == Click(319, 239)
    assert rescale(Click(1, 1, button="right"), (640, 480), SCREEN) == Click(0, 0, "right")
    assert rescale(MoveTo(3, 2), (640, 480), SCREEN) == MoveTo(1, 1)
    # 320 -> 640: pixel u covers [2u, 2u+2), its centre 2u+1
    assert rescale(DragTo(0, 0, 319, 239), SCREEN, (640, 480)) == DragTo(1, 1, 639, 479)
    assert rescale(Scroll(0, -3, 10, 20), SCREEN, (640, 480)) == Scroll(0, -3, 21, 41)
    assert rescale(Scroll(0, -3), SCREEN, (640, 480)) == Scroll(0, -3)
    assert rescale(TypeText("a"), SCREEN, (640, 480)) == TypeText("a")
    assert rescale(Click(5, 6), SCREEN, SCREEN) == Click(5, 6)
    for image, screen in [(640, 320), (1920, 1280), (1280, 1920), (333, 1000), (1000, 333)]:
        mapped = [rescale_axis(u, image, screen) for u in range(image)]
        assert 0 <= mapped[0] and mapped[-1] < screen and mapped == sorted(mapped)
        # the screen pixel holding the centre of pixel u: m <= (u + 1/2) * screen / image < m + 1
        assert all(2 * image * m <= (2 * u + 1) * screen < 2 * image * (m + 1)
                   for u, m in enumerate(mapped))


def test_obs_screen_size_overrides_and_info_reports_both(agent_of: Any) -> None:
    """A runner may put DesktopEnv.vm_screen_size in the observation; the code then targets
    that screen, scaled from the screenshot's pixels the model answered in."""
    agent = agent_of()
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    obs = env.reset()
    agent.reset()
    small = {"width": 160, "height": 120}
    pointed = 0
    for _ in range(5):
        _, actions, info = agent.predict_with_info("Open the terminal.",
                                                   {**obs, "screen_size": small})
        assert info["screenshot_size"] == [320, 240] and info["screen_size"] == [160, 120]
        assert_action_contract(actions[0], (160, 120))
        meant = parse_action(info["action"], screen=SCREEN) if info["parsed"] else None
        if isinstance(meant, Click | MoveTo | DragTo):
            assert actions[0] == to_pyautogui(rescale(meant, SCREEN, (160, 120)))
            pointed += 1
    assert pointed > 0
    with pytest.raises(ValueError, match="screen_size"):
        agent.predict("x", {**obs, "screen_size": "big"})


_POINTING = {"click", "double_click", "right_click", "move_to", "drag"}


def test_clamped_and_refused_outputs_are_noted_in_last_info(agent_of: Any) -> None:
    """kvagent's grammar allows pixels up to 9999 on any screen: every point off the
    screenshot is clamped, and said so in the step's notes; text that is no action is a
    WAIT whose notes say why."""
    agent = agent_of(seed=3)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    obs = env.reset()
    agent.reset()
    clamped = 0
    for _ in range(6):
        response, _, info = agent.predict_with_info("Open the terminal.", obs)
        model_text, _, note = response.partition("\n[kvagent: ")  # what kvagent changed
        call = re.fullmatch(r"(\w+)\((.*)\)", model_text)
        assert call is not None, response
        outside = False
        if call[1] in _POINTING:
            nums = [int(v) for v in call[2].split(", ")]
            outside = (any(x >= SCREEN[0] for x in nums[0::2])
                       or any(y >= SCREEN[1] for y in nums[1::2]))
        assert bool(info["notes"]) == outside == bool(note), (response, info["notes"])
        assert all("lay outside the screen: clamped to" in n for n in info["notes"])
        clamped += outside
    assert clamped > 0
    free = agent_of(grammar=False, max_tokens=6)
    free.reset()
    _, actions, info = free.predict_with_info("Open the terminal.", obs)
    assert actions == ["WAIT"] and not info["parsed"]
    assert info["notes"][0].startswith("not an action: ")


# ---------------------------------------------------------------- threads

def test_default_threads_do_not_take_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(THREADS_ENV, raising=False)
    cores = len(os.sched_getaffinity(0))
    assert default_threads(shared=True) == min(4, cores)
    assert KvAgentConfig(None, None).engine.n_threads == min(4, cores)
    assert default_threads() == cores  # a command that owns the machine takes every core
    monkeypatch.setenv(THREADS_ENV, "3")  # e.g. 12 cores // 4 run_multienv workers
    assert default_threads() == 3 and KvAgentConfig(None, None).engine.n_threads == 3
    assert KvAgent(None, None, n_threads=2).config.engine.n_threads == 2  # explicit wins
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            default_threads()
