"""OSWorld's own Qwen3-VL agent (``mm_agents.qwen3vl_agent`` from the desktop-env 1.0.2 wheel,
unchanged) pointed at ``kvagent serve`` through its OpenAI backend — the way a user runs it:
``OPENAI_BASE_URL`` set, the agent's defaults (``max_tokens=32768`` included) otherwise."""

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
