"""``kvagent serve``'s OpenAI-compatible chat completions, driven by the official ``openai``
client (and raw httpx for what that client will not send) against a real server process."""

from __future__ import annotations

import base64
import io

import httpx
import openai
import pytest
from PIL import Image

from runtime.bench.chat_layout import sliding_window_messages
from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

SYSTEM = "You operate a desktop through screenshots."


def _img(i: int, size: tuple[int, int] = (320, 240)) -> dict:
    png = screenshot(i, *size)
    return {"type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-chat")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "3", "--window", "3") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                      timeout=120)
    model = c.models.list().data[0].id
    return c, model


def _run_agent(c: openai.OpenAI, model: str, steps: int, *, mode: str | None = None,
               window: int = 2, edit_at: int | None = None) -> list[dict]:
    """An agent loop in the Qwen3-VL agent's shape (``runtime.bench.chat_layout``): the
    oldest screenshot and answer dropped once ``window`` answers are kept; ``edit_at``: that
    answer is sent edited (the next request does not continue the conversation's text)."""
    answers: list[str] = []
    out = []
    for t in range(steps):
        sent = [a + " (edited)" if j == edit_at else a for j, a in enumerate(answers)]
        messages = _messages(t, sent, window)
        extra = {"kvagent_mode": mode} if mode else None
        r = c.chat.completions.create(model=model, messages=messages, max_tokens=6,
                                      temperature=0, extra_body=extra)
        answers.append(r.choices[0].message.content)
        out.append({"text": r.choices[0].message.content, **r.model_extra["kvagent"]})
    return out


def _messages(t: int, answers: list[str], window: int = 2) -> list[dict]:
    return sliding_window_messages(SYSTEM, "Open the terminal.",
                                   [screenshot(i, 320, 240) for i in range(t + 1)],
                                   answers[:t], kept_answers=window)


def test_text_chat_plain_and_streamed_say_the_same(client) -> None:
    c, model = client
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name a colour."}]
    plain = c.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                      temperature=0, seed=3)
    assert plain.object == "chat.completion" and plain.choices[0].message.role == "assistant"
    assert plain.usage.completion_tokens >= 1 and plain.usage.prompt_tokens > 0
    stream = c.chat.completions.create(model=model, messages=messages, max_tokens=8,
                                       temperature=0, seed=3, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    # the second request reused the first's prompt (same conversation) and still says the
    # very same tokens: reuse never changes an output
    assert text == plain.choices[0].message.content
    assert chunks[-1].model_extra["kvagent"]["reused_tokens"] > 0


def test_terminal_mode_critical_path_is_the_new_screenshot(client) -> None:
    c, model = client
    steps = _run_agent(c, model, 5)
    assert all(s["mode"] == "terminal" for s in steps)
    assert len({s["conversation_id"] for s in steps}) == 1, steps  # matched by content
    assert steps[0]["reused_tokens"] == 0
    for s in steps[1:]:
        assert s["reused_tokens"] > 0
        # the answer and the kept screenshots were prefetched after the previous step
        assert s["prefetch_prefill_tokens"] > 0
        assert s["critical_path_prefill_tokens"] <= 1.15 * s["new_content_tokens"]


def test_faithful_mode_reuses_across_a_sliding_window(client) -> None:
    c, model = client
    steps = _run_agent(c, model, 4, mode="faithful")
    assert all(s["mode"] == "faithful" for s in steps)
    assert len({s["conversation_id"] for s in steps}) == 1
    assert all(s["reused_tokens"] > 0 for s in steps[1:])  # at least the system prompt


def test_reuse_and_prefetch_never_change_an_output(client) -> None:
    """Every answer of a continued conversation (reuse, prefetch, a restart after a wrong
    prediction) equals the answer a fresh conversation gives to the very same request."""
    c, model = client
    continued = _run_agent(c, model, 4)
    edited = _run_agent(c, model, 4, edit_at=1)  # step 2 does not continue step 1's answer
    for steps in (continued, edited):
        answers = [s["text"] for s in steps]
        for t in (1, 3):
            sent = [a + (" (edited)" if steps is edited and j == 1 else "")
                    for j, a in enumerate(answers)]
            messages = _messages(t, sent)
            fresh = c.chat.completions.create(
                model=model, messages=messages, max_tokens=6, temperature=0,
                extra_headers={"X-Kvagent-Conversation": f"fresh-{id(steps)}-{t}"})
            assert fresh.choices[0].message.content == answers[t]


def _bomb_url() -> str:
    out = io.BytesIO()
    Image.new("1", (14000, 14000)).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def test_bad_requests_get_openai_errors(client, server) -> None:
    c, model = client
    user = {"role": "user", "content": "hi"}
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="no-such-model", messages=[user], max_tokens=2)
    bad_parts = [
        {"type": "image_url", "image_url": {"url": "data:text/plain;base64,aGVsbG8="}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64," +
                                            base64.b64encode(b"not a png").decode()}},
        {"type": "image_url", "image_url": {"url": _bomb_url()}},
        {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
    ]
    for part in bad_parts:
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=model, max_tokens=2,
                                      messages=[{"role": "user", "content": [part]}])
        assert err.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=model, max_tokens=2, messages=[
            {"role": "user", "content": [_img(i) for i in range(17)]}])
    assert err.value.code == "too_many_images"
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=model, messages=[user], max_tokens=10**7)
    assert err.value.code == "max_tokens_too_large"
    with pytest.raises(openai.BadRequestError) as err:
        c.chat.completions.create(model=model, max_tokens=4, messages=[
            {"role": "user", "content": "x " * 6000}])
    assert err.value.code == "context_length_exceeded"
    r = httpx.post(f"{server.url}/v1/chat/completions", content=b"{oops", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    # and the server goes on serving
    ok = c.chat.completions.create(model=model, messages=[user], max_tokens=2)
    assert ok.choices[0].message.role == "assistant"


def test_a_client_that_disconnects_mid_stream_leaks_nothing(client, server) -> None:
    c, model = client
    body = {"model": model, "stream": True, "max_tokens": 200, "temperature": 1.0,
            "messages": [{"role": "user", "content": "Tell a long story."}]}
    with httpx.Client(timeout=60) as h:
        with h.stream("POST", f"{server.url}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    break  # one chunk, then hang up
    health = httpx.get(f"{server.url}/health", timeout=30).json()
    assert health["ledger"]["reserved_bytes"] == 0
    ok = c.chat.completions.create(model=model, messages=[
        {"role": "user", "content": "again"}], max_tokens=2)
    assert ok.choices[0].finish_reason in ("stop", "length")


def test_busy_slots_give_429(client, server) -> None:
    c, model = client
    with httpx.Client(base_url=server.url, timeout=60) as h:
        for cid in [d["episode_id"] for d in h.get("/v1/episodes").json()["data"]]:
            h.delete(f"/v1/episodes/{cid}")
        ids = [h.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
               for _ in range(3)]  # every slot held by an episode (never evicted)
        with pytest.raises(openai.RateLimitError):
            c.chat.completions.create(model=model, max_tokens=2, messages=[
                {"role": "user", "content": [_img(0)]}])
        for ep in ids:
            h.delete(f"/v1/episodes/{ep}")
    ok = c.chat.completions.create(model=model, max_tokens=2, messages=[
        {"role": "user", "content": [_img(0)]}])
    assert ok.choices[0].message.content is not None
    metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert 'kvagent_steps_total{api="chat",status="ok"}' in metrics
    assert metrics.count("kvagent_ledger_bytes{") == 4
