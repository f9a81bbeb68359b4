"""KvAgent inside OSWorld's own runner contract, and OSWorldEnv, on the fake DesktopEnv.

The agent runs the real engine on the forged tiny qwen35 (random weights: aimless but valid
actions); only the VM is faked.  ``run_single_example_like`` mirrors OSWorld's
``lib_run_single.run_single_example`` step for step, minus its 60 s / 20 s sleeps.
"""

from __future__ import annotations

import gc
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fake_desktop_env import (
    CheckingDesktopEnv, UnsupportedCodeError, assert_action_contract, simdesk_example,
)
from osworld_runner_like import ARGS, TRAJ_KEYS, InfoRecorder, run_single_example_like
from structlog.testing import capture_logs

from cachepolicy.errors import PolicyRefusedError
from runtime.actions import (
    Click, Done, DragTo, Hotkey, MoveTo, Press, Scroll, TypeText, to_pyautogui,
)
from runtime.osworld import AgentClosedError, AgentStepError, KvAgent
from runtime.osworld.local import PORTAL_THREAD_PREFIX
from vmenv.errors import EnvClosedError, EpisodeOverError
from vmenv.osworld import MissingScreenshotError, OSWorldEnv, OSWorldUnavailableError
from vmenv.png import png_size
from vmenv.simdesk.widgets import locate

SCREEN = (320, 240)
@pytest.fixture
def make_agent(kv_agents: Any) -> Any:
    return lambda **kw: kv_agents(**{"n_ctx": 4096, "temperature": 1.0, "seed": 7, **kw})


def _result_dir(root: Path, example: dict[str, Any]) -> Path:
    d = root / "pyautogui" / "screenshot" / "kvagent-tiny" / "simdesk" / example["id"]
    d.mkdir(parents=True)
    return d


def _run(agent: Any, env: Any, task: str, root: Path, max_steps: int = 4,
         scores: list[float] | None = None) -> tuple[list[tuple[Any, ...]], Path]:
    example = simdesk_example(task)
    out = _result_dir(root, example)
    returned = run_single_example_like(agent, env, example, max_steps, example["instruction"],
                                       ARGS, str(out), scores if scores is not None else [])
    return returned, out


def test_runner_contract_and_result_layout(make_agent: Any, tmp_path: Path) -> None:
    agent, env, scores = make_agent(), CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1]), []
    returned, out = _run(agent, env, "open-terminal", tmp_path, scores=scores)
    agent.close()  # cancels the prefetch the last step left running
    assert 1 <= len(returned) <= 4
    for response, actions in returned:
        assert isinstance(response, str) and response
        assert isinstance(actions, list) and len(actions) == 1
        assert_action_contract(actions[0], SCREEN)
    assert env.received == [a[0] for _, a in returned]
    assert any(a.startswith("pyautogui.click(") for a in env.received)  # seed 7 clicks
    lines = [json.loads(x) for x in (out / "traj.jsonl").read_text().splitlines()]
    assert len(lines) == len(returned)
    for i, (line, (response, actions)) in enumerate(zip(lines, returned), start=1):
        assert set(line) == TRAJ_KEYS and line["step_num"] == i
        assert line["action"] == actions[0] and line["response"] == response
        assert png_size((out / line["screenshot_file"]).read_bytes()) == SCREEN
    assert (out / "result.txt").read_text() in ("0.0\n", "1.0\n") and len(scores) == 1
    assert env.controller.recordings == [str(out / "recording.mp4")]


def test_overlap_on_and_off_give_identical_steps(make_agent: Any, tmp_path: Path) -> None:
    runs = {}
    for overlap in (False, True):
        rec = InfoRecorder(make_agent(overlap=overlap, seed=5))
        env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
        returned, _ = _run(rec, env, "open-terminal", tmp_path / str(overlap), max_steps=5)
        rec.agent.close()
        runs[overlap] = returned, rec.infos
    (plain, plain_info), (over, over_info) = runs[False], runs[True]
    assert plain == over and len(over) == 5
    assert len({r for r, _ in over}) > 1  # the responses are not all the same text
    for p, o in zip(plain_info[1:], over_info[1:]):
        # the previous action and the kept screenshots left the critical path
        assert o["prefetch_prefill_tokens"] > 0 and p["prefetch_prefill_tokens"] == 0
        assert o["critical_path_prefill_tokens"] < p["critical_path_prefill_tokens"]
        assert o["prefill_tokens"] == p["prefill_tokens"]  # the same work, off the path


def test_consecutive_episodes_release_the_previous_sequence(make_agent: Any,
                                                            tmp_path: Path) -> None:
    agent = make_agent(overlap=True)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    with capture_logs() as logs:
        _run(agent, env, "open-terminal", tmp_path / "a", max_steps=3)
        first = agent.episode_id
        _run(agent, env, "click-ok", tmp_path / "b", max_steps=3)
        second = agent.episode_id
    assert first != second and env.resets == 2
    events = [(e["event"], e.get("episode_id")) for e in logs
              if e["event"] in ("episode_open", "episode_close")]
    assert events.index(("episode_close", first)) < events.index(("episode_open", second))
    status = agent.status()
    # one sequence in the engine (n_seq_max=1: the second episode got the first one's), and
    # the ledger holds exactly the image cache and the open episode
    assert status.episode_id == second and status.seqs_in_use == (0,)
    assert status.ledger.held == sum(status.held.values()) and status.held[second] > 0
    agent.reset()  # cancels the prefetch the last step left running
    after = agent.status()
    assert second not in after.held and after.episode_id != second
    assert not after.prefetch_running and after.ledger.reserved == 0


def test_missing_screenshot_is_a_wait_not_a_crash(make_agent: Any, tmp_path: Path) -> None:
    agent = make_agent()
    for obs in ({"screenshot": None}, {"screenshot": b"not a png"}, {}):
        response, actions = agent.predict("open the terminal", obs)
        assert actions == ["WAIT"] and "screenshot" in response
    # the first observation OSWorld hands over is None (index 1: after reset's own)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1], missing_screenshots={1})
    returned, _ = _run(agent, env, "open-terminal", tmp_path, max_steps=3)
    assert returned[0][1] == ["WAIT"] and len(returned) == 3
    assert all(isinstance(a[0], str) for _, a in returned[1:])
    agent.close()


def test_reset_forms_and_three_tuple(make_agent: Any) -> None:
    agent = make_agent()
    logger = logging.getLogger("desktopenv.agent")
    ids = []
    for args, kwargs in (((), {}), ((logger,), {}), ((logger,), {"vm_ip": "10.0.0.2"}),
                         ((), {"vm_ip": "10.0.0.3"}), ((None,), {"vm_ip": None, "task": 1})):
        agent.reset(*args, **kwargs)
        ids.append(agent.episode_id)
    assert len(set(ids)) == len(ids)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    obs = env.reset()
    response, actions, info = agent.predict_with_info("Open the Terminal application.", obs)
    assert isinstance(response, str) and len(actions) == 1
    assert info["episode_id"] == ids[-1] and info["step"] == 0 and info["code"] == actions[0]
    assert info["prefill_tokens"] > 0 and info["critical_path_s"] > 0
    assert isinstance(info["reused_tokens"], int) and info["decode_tokens"] >= 1
    agent.close()


def test_close_is_idempotent_and_stops_the_portal(make_agent: Any) -> None:
    agent = make_agent(overlap=True)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    agent.reset()
    agent.predict("Open the Terminal application.", env.reset())  # a prefetch is now running
    assert any(t.name.startswith(PORTAL_THREAD_PREFIX) for t in threading.enumerate())
    agent.close()
    agent.close()
    assert not any(t.name.startswith(PORTAL_THREAD_PREFIX) for t in threading.enumerate())
    with pytest.raises(AgentClosedError):
        agent.predict("x", env._get_obs())
    with pytest.raises(AgentClosedError):
        agent.reset()


def test_forgotten_agents_are_closed_by_gc_and_at_exit(forged: Any) -> None:
    m = forged("qwen35")
    agent = KvAgent(m.model_path, m.mmproj_path, n_threads=1, screen_size=SCREEN)
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    agent.predict("Open the Terminal application.", env.reset())
    del agent
    gc.collect()
    assert not any(t.name.startswith(PORTAL_THREAD_PREFIX) for t in threading.enumerate())
    script = (
        "import sys\n"
        "from runtime.osworld import KvAgent\n"
        "from vmenv.osworld_fake import FakeDesktopEnv\n"
        "a = KvAgent(sys.argv[1], sys.argv[2], n_threads=1, screen_size=(320, 240))\n"
        "print(a.predict('open the terminal', FakeDesktopEnv().reset())[1])\n")
    done = subprocess.run([sys.executable, "-c", script, str(m.model_path), str(m.mmproj_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "agent_closed" in done.stdout + done.stderr  # the exit hook closed it


def test_a_step_that_cannot_fit_the_budget_is_a_typed_error(make_agent: Any) -> None:
    agent = make_agent(memory_budget="64KiB")  # less than one step needs
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    agent.reset()
    with pytest.raises(AgentStepError, match="after evict, wait, downgrade, fail"):
        agent.predict("Open the Terminal application.", env.reset())
    status = agent.status()  # rolled back: nothing reserved, the episode holds nothing
    assert status.ledger.reserved == 0 and status.held[status.episode_id] == 0
    agent.close()


def test_config_is_checked(forged: Any) -> None:
    m = forged("qwen35")
    with pytest.raises(ValueError, match="action_space"):
        KvAgent(m.model_path, m.mmproj_path, action_space="computer_13")
    with pytest.raises(ValueError, match="mmproj"):
        KvAgent(m.model_path, None)
    with pytest.raises(PolicyRefusedError):  # relocate cannot run on a hybrid model
        KvAgent(m.model_path, m.mmproj_path, policy="relocate", n_threads=1).start()


def test_fake_reads_generated_code_and_refuses_anything_else() -> None:
    env = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    env.reset(simdesk_example("type-in-field"))
    field = locate(env.state, "notes.field")
    for action in (Click(*field), TypeText("kvagent"), DragTo(5, 5, 60, 70), Scroll(0, -3, 9, 9),
                   Hotkey(("ctrl", "c")), Press("enter")):
        env.step(to_pyautogui(action), 0)
        assert env.applied[-1] == action
    assert env.state.notes.saved == ("kvagent",) and env.evaluate() == 1.0
    for bad in ("import os", "os.system('true')", "pyautogui.click(x=__import__('os'))",
                "pyautogui.screenshot('/tmp/x.png')", "print('hi')", "click(1, 2)"):
        with pytest.raises(UnsupportedCodeError):
            env.step(bad, 0)


# ---------------------------------------------------------------------- OSWorldEnv


async def test_osworld_env_sends_generated_code() -> None:
    fake = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    env = OSWorldEnv(fake, pause=0.0, settle_s=0.0,
                     tasks={"t1": simdesk_example("open-terminal", example_id="t1")})
    obs = await env.reset("t1")
    assert obs.size == SCREEN and obs.step == 0 and "Terminal" in obs.instruction
    click = Click(*locate(fake.state, "icon.terminal"))
    out = await env.step(click)
    assert fake.received == [to_pyautogui(click)] and out.observation.step == 1
    assert not out.done and out.reward == 0.0
    out = await env.step(Done())
    assert fake.received[-1] == "DONE" and out.done and out.info == {"done": True}
    assert await env.evaluate() in (0.0, 1.0)
    with pytest.raises(EpisodeOverError):
        await env.step(MoveTo(1, 1))
    await env.close()
    await env.close()
    assert fake.closed
    with pytest.raises(EnvClosedError):
        await env.reset("t1")


async def test_osworld_env_missing_screenshot_and_missing_package() -> None:
    fake = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1], missing_screenshots={0})
    env = OSWorldEnv(fake, pause=0.0, settle_s=0.0)
    with pytest.raises(MissingScreenshotError):
        await env.reset(simdesk_example("click-ok"))
    fake.missing_screenshots = {fake.n_observations + 1}  # the one after the next step
    await env.reset(simdesk_example("click-ok"))
    with pytest.raises(MissingScreenshotError):
        await env.step(Click(*locate(fake.state, "dialog.ok")))
    obs = await env.observe()  # the action happened; a retry sees its result
    assert obs.step == 1 and await env.evaluate() == 1.0
    try:
        import desktop_env  # noqa: F401
    except ImportError:
        lazy = OSWorldEnv(desktop_kwargs={"provider_name": "docker"}, settle_s=0.0)
        with pytest.raises(OSWorldUnavailableError, match="desktop_env"):
            await lazy.reset(None)
        await lazy.close()


async def test_async_episode_loop_on_osworld_env(engines: Any) -> None:
    """The async runtime (run_episode + EpisodeDriver) drives the OSWorld adapter too."""
    from cachepolicy.segments import SegmentFactory
    from runtime.config import AgentConfig
    from runtime.driver import EpisodeDriver
    from runtime.env_loop import run_episode
    from scheduler.ledger import MemoryLedger
    from scheduler.scheduler import Scheduler

    engine = engines("qwen35")
    factory = SegmentFactory(engine)
    agent = AgentConfig(decode_tokens=48, temperature=1.0, seed=7)
    fake = CheckingDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    env = OSWorldEnv(fake, pause=0.0, settle_s=0.0,
                     tasks={"open-terminal": simdesk_example("open-terminal")})
    async with Scheduler(engine, MemoryLedger(1 << 40), factory,
                         options=agent.step_options(SCREEN)) as sched:
        driver = EpisodeDriver.open(sched, factory, agent, "osw",
                                    "Open the Terminal application.", SCREEN)
        try:
            result = await run_episode(driver, env, task="open-terminal", max_steps=3)
        finally:
            await env.close()
            await driver.aclose()
    assert result.n_steps >= 1 and len(fake.received) == result.n_steps
