"""OSWorld's own agents on the architectures they were made for (issue 49 item 3), each
through ``kvagent serve`` with its action grammar, driving the real DesktopEnv on the
loopback VM through OSWorld's runner calls:

* the UI-TARS agent (``mm_agents.uitars15_v1``, with the ``reset`` fix of
  ``runtime.osworld.mm_agents``) on the forged ``qwen2vl`` (UI-TARS-1.5 is a Qwen2.5-VL),
  served with ``--profile uitars --chat-action-grammar uitars``;
* ``Qwen3VLAgent`` (``mm_agents.qwen3vl_agent``) on the forged ``qwen3vl`` (deepstack
  image rows), served with ``--chat-action-grammar qwen3vl``.

Random weights choose aimlessly; the grammar makes every answer one action in the agent's
own format, which OSWorld's own parser turns into pyautogui code that reaches the VM.
"""

from __future__ import annotations

import httpx
import pytest

from serve_helpers import kvagent_serve

pytest.importorskip("loguru", reason="OSWorld's UI-TARS agents import loguru (test extra)")
pytest.importorskip("dashscope", reason="the test extra installs OSWorld agents' imports")
pytest.importorskip("desktop_env", reason="OSWorld's desktop_env")

from fake_desktop_env import FakeDesktopEnv  # noqa: E402
from osworld_runner_like import ARGS, run_single_example_like  # noqa: E402

from runtime.osworld.mm_agents import qwen3vl_agent_class, uitars_agent_class  # noqa: E402
from vmenv.osworld_vm import simdesk_example, vm_server  # noqa: E402
from vmenv.osworld_vm.desktop_env_import import load_desktop_env  # noqa: E402
from vmenv.osworld_vm.machine import action_record  # noqa: E402
from vmenv.osworld_vm.provider import LOOPBACK_REGION, PROVIDER_NAME  # noqa: E402

KEY = "osworld-vl-agent-key-0123"
SCREEN = (320, 240)
STEPS = 3
#: what OSWorld's run_multienv_uitars15_v1.py builds its agent with (max_tokens capped: the
#: grammar's answers are short anyway)
UITARS_CONF = {"infer_mode": "qwen25vl_normal", "prompt_style": "qwen25vl_normal",
               "input_swap": True, "language": "English", "history_n": 5,
               "max_pixels": 2116800, "min_pixels": 3136, "callusr_tolerance": 3,
               "temperature": 0.0, "top_k": -1, "top_p": 0.9, "max_tokens": 200}


def _serve(forged, tmp_path_factory, arch: str, *args: str):
    m = forged(arch)
    tmp = tmp_path_factory.mktemp(f"serve-{arch}")
    return kvagent_serve(m.model_path.parent, tmp, "--ctx", "16384", "--api-key", KEY,
                         "--temperature", "1.0", *args)


def _run_on_the_vm(agent, tmp_path) -> tuple[list, dict, dict]:
    example = simdesk_example("open-terminal")
    out = tmp_path / "result"
    out.mkdir()
    scores: list[float] = []
    with vm_server("open-terminal", SCREEN) as vm:
        env = load_desktop_env().DesktopEnv(
            provider_name=PROVIDER_NAME, region=LOOPBACK_REGION, path_to_vm=vm.address,
            action_space="pyautogui", screen_size=SCREEN, headless=True, os_type="Ubuntu",
            require_a11y_tree=False, cache_dir=str(tmp_path / "cache"))
        try:
            returned = run_single_example_like(agent, env, example, STEPS,
                                               example["instruction"], ARGS, str(out), scores)
            status = httpx.get(f"{vm.url}/simdesk/status", timeout=10).json()
        finally:
            env.close()
    assert scores and (out / "result.txt").exists()
    return returned, status, example


def _check_acted(returned: list, status: dict, example: dict) -> None:
    """Every answer gave at most one action in OSWorld's own parse (its parser may drop a
    call it cannot map, e.g. Qwen3VLAgent's ``hscroll`` without a coordinate), at least one
    was pyautogui code, and those reached the VM: it applied what the same codes mean on
    the local fake."""
    assert returned and all(len(actions) <= 1 for _, actions in returned), returned
    codes = [code for _, actions in returned for code in actions]
    assert any("pyautogui." in code for code in codes), returned
    fake = FakeDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    fake.reset(example)
    for code in codes:
        fake.step(code, 0)
    assert status["actions"] and status["actions"] == [action_record(a) for a in fake.applied]


def _one_conversation(server) -> list[dict]:
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"authorization": f"Bearer {KEY}"}) as c:
        chats = [e for e in c.get("/v1/episodes").json()["data"] if e["kind"] == "chat"]
        assert len(chats) == 1, chats  # every request matched the one conversation
        return c.get(f"/v1/episodes/{chats[0]['episode_id']}").json()["steps"]


def test_osworld_uitars_agent_acts_through_serve_on_qwen2vl(
        forged, tmp_path_factory, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    with _serve(forged, tmp_path_factory, "qwen2vl", "--profile", "uitars",
                "--chat-action-grammar", "uitars") as server:
        # the agent reads its endpoint from DOUBAO_API_URL / DOUBAO_API_KEY
        monkeypatch.setenv("DOUBAO_API_URL", f"{server.url}/v1")
        monkeypatch.setenv("DOUBAO_API_KEY", KEY)
        agent = uitars_agent_class("uitars15_v1")(model=server.model,
                                                  runtime_conf=UITARS_CONF)
        returned, status, example = _run_on_the_vm(agent, tmp_path)
        steps = _one_conversation(server)
    _check_acted(returned, status, example)
    for response, actions in returned:
        assert response.startswith("Thought:") and "\nAction: " in response, response
        assert actions[0] in ("DONE", "WAIT", "FAIL") or actions[0].startswith(
            ("pyautogui.", "import pyautogui")), actions
    assert len(steps) == len(returned)
    assert all(s["reused_tokens"] > 0 for s in steps[1:])  # the conversation's cache held


def test_osworld_qwen3vl_agent_acts_through_serve_on_qwen3vl(
        forged, tmp_path_factory, monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)  # the agent writes ./draft/message_cache/*.json
    with _serve(forged, tmp_path_factory, "qwen3vl", "--window", "3",
                "--chat-action-grammar", "qwen3vl") as server:
        monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
        agent = qwen3vl_agent_class()(model=server.model, api_backend="openai", history_n=2)
        returned, status, example = _run_on_the_vm(agent, tmp_path)
        steps = _one_conversation(server)
    _check_acted(returned, status, example)
    for response, _ in returned:
        assert "<tool_call>" in response and "computer_use" in response
    assert len(steps) == len(returned)
    assert all(s["reused_tokens"] > 0 for s in steps[1:])
