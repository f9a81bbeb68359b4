"""OSWorld's own Qwen3-VL agent (``mm_agents.qwen3vl_agent`` from the desktop-env 1.0.2 wheel,
unchanged) pointed at ``kvagent serve`` through its OpenAI backend — the way a user runs it:
``OPENAI_BASE_URL`` set, the agent's defaults (``max_tokens=32768`` included) otherwise; and
through OSWorld's runner calls against the real DesktopEnv on the loopback VM, with the
server's ``--chat-action-grammar qwen3vl`` so the forged model's answers parse and act."""

from __future__ import annotations

import logging

import httpx
import pytest

from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

pytest.importorskip("dashscope", reason="the test extra installs OSWorld agents' imports")
from mm_agents_import import load_qwen3vl_agent  # noqa: E402

STEPS = 4


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-osworld-agent")
    # K = 3 screenshots (the agent's history_n=2 plus the current one); the agent's system
    # prompt (its tool schema) alone is ~3k tokens: serve's default context; completions
    # capped at 48 tokens so the forged model's aimless text stays short
    with kvagent_serve(m.model_path.parent, tmp, "--window", "3", "--ctx", "16384",
                       "--max-completion-tokens", "48") as s:
        yield s


def test_osworld_qwen3vl_agent_reuses_the_cache(server, monkeypatch, tmp_path) -> None:
    module = load_qwen3vl_agent()
    monkeypatch.chdir(tmp_path)  # the agent writes ./draft/message_cache/*.json
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    with httpx.Client(base_url=server.url, timeout=60) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
    agent = module.Qwen3VLAgent(model=model, api_backend="openai", history_n=2)
    agent.reset(logging.getLogger("test.qwen3vl"))
    instruction = "Open the terminal and list the files in the home folder."
    responses = []
    for i in range(STEPS):
        response, code = agent.predict(instruction, {"screenshot": screenshot(i, 640, 480)})
        assert isinstance(code, list)
        responses.append(response)
    # (the agent turns a failed call into "" after its own retries: every call succeeded)
    assert all(isinstance(r, str) and r for r in responses)
    with httpx.Client(base_url=server.url, timeout=60) as c:
        listing = c.get("/v1/episodes").json()["data"]
        chats = [e for e in listing if e["kind"] == "chat"]
        assert len(chats) == 1, listing  # every request matched the one conversation
        steps = c.get(f"/v1/episodes/{chats[0]['episode_id']}").json()["steps"]
        metrics = c.get("/metrics").text
    assert f'route="chat",status="200"}} {STEPS}' in metrics.replace(".0\n", "\n")
    assert len(steps) == STEPS
    assert steps[0]["reused_tokens"] == 0
    for s in steps[1:]:
        assert s["reused_tokens"] > 0  # the window slid; the cache held
        assert s["prefetch_prefill_tokens"] > 0  # the answer and kept shots, prefetched
        # terminal mode: the critical path is about the new screenshot only
        assert s["critical_path_prefill_tokens"] <= 1.15 * s["new_content_tokens"]
        assert s["decode_tokens"] <= 48
    assert (tmp_path / "draft/message_cache/messages_step_3.json").exists()


KEY = "osworld-agent-key-0123"


@pytest.fixture(scope="module")
def grammar_server(forged, tmp_path_factory):
    """The server as docs/serving.md starts it for OSWorld's Qwen3-VL agent on a model that
    needs its answers constrained (the forged one): ``--chat-action-grammar qwen3vl``, an
    API key the agent sends as ``OPENAI_API_KEY``."""
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-osworld-grammar")
    with kvagent_serve(m.model_path.parent, tmp, "--window", "3", "--ctx", "16384",
                       "--chat-action-grammar", "qwen3vl", "--api-key", KEY,
                       "--temperature", "1.0") as s:
        yield s


def test_osworld_qwen3vl_agent_acts_on_the_vm_through_run_single_example(
        grammar_server, monkeypatch, tmp_path) -> None:
    """OSWorld's Qwen3VLAgent (as the docs say to load it from the wheel) through
    run_single_example's calls against the real DesktopEnv on the loopback VM: every answer
    parses (the action grammar), and the actions it generates reach the VM."""
    desktop_env = pytest.importorskip("desktop_env", reason="OSWorld's desktop_env")
    del desktop_env
    from fake_desktop_env import FakeDesktopEnv
    from osworld_runner_like import ARGS, run_single_example_like

    from runtime.osworld.mm_agents import qwen3vl_agent_class
    from vmenv.osworld_vm import simdesk_example, vm_server
    from vmenv.osworld_vm.desktop_env_import import load_desktop_env
    from vmenv.osworld_vm.machine import action_record
    from vmenv.osworld_vm.provider import LOOPBACK_REGION, PROVIDER_NAME

    screen = (320, 240)
    monkeypatch.chdir(tmp_path)  # the agent writes ./draft/message_cache/*.json
    monkeypatch.setenv("OPENAI_BASE_URL", f"{grammar_server.url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    agent = qwen3vl_agent_class()(model=grammar_server.model, api_backend="openai",
                                  history_n=2)
    example = simdesk_example("open-terminal")
    out = tmp_path / "result"
    out.mkdir()
    scores: list[float] = []
    with vm_server("open-terminal", screen) as vm:
        env = load_desktop_env().DesktopEnv(
            provider_name=PROVIDER_NAME, region=LOOPBACK_REGION, path_to_vm=vm.address,
            action_space="pyautogui", screen_size=screen, headless=True, os_type="Ubuntu",
            require_a11y_tree=False, cache_dir=str(tmp_path / "cache"))
        try:
            returned = run_single_example_like(agent, env, example, 3, example["instruction"],
                                               ARGS, str(out), scores)
            status = httpx.get(f"{vm.url}/simdesk/status", timeout=10).json()
        finally:
            env.close()
    # every answer parsed into exactly one action (the grammar), in OSWorld's own parser
    assert returned and all(len(actions) == 1 for _, actions in returned), returned
    codes = [actions[0] for _, actions in returned]
    for response, _ in returned:
        assert "<tool_call>" in response and "computer_use" in response
    # the actions reached the VM: it applied what the same codes mean on the local fake
    fake = FakeDesktopEnv(width=screen[0], height=screen[1])
    fake.reset(example)
    for code in codes:
        fake.step(code, 0)
    assert status["actions"] == [action_record(a) for a in fake.applied]
    # (greedy-seeded sampling: the same clicks every run)
    assert any(c.startswith("pyautogui.") for c in codes) and status["actions"]
    assert scores and (out / "result.txt").exists()
    with httpx.Client(base_url=grammar_server.url, timeout=60,
                      headers={"authorization": f"Bearer {KEY}"}) as c:
        steps = [e for e in c.get("/v1/episodes").json()["data"] if e["kind"] == "chat"]
        assert len(steps) == 1 and steps[0]["steps"] == len(returned)  # one conversation
