"""A client's grammar costs the server a bounded time and no memory of its own: matched in a
grammar worker, a grammar whose cost explodes ends its completion with a 400
``grammar_budget_exceeded`` (or an error event on a stream) within the budget, and the
server answers the next request — on a real ``kvagent serve`` with the real clients."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from serve_helpers import kvagent_serve
from test_grammar_isolation import CLICK_GRAMMAR, EXPLODING_GRAMMAR

#: the default budget: 2 s for one token, 30 s for a completion
BUDGET_S = 30.0


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-grammar-budget")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "3") as s:
        yield s


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def _body(model: str, grammar: str, **extra: object) -> dict:
    return {"model": model, "max_tokens": 300, "temperature": 0, "grammar": grammar,
            "messages": [{"role": "user", "content": "write"}], **extra}


def test_an_exploding_grammar_is_a_400_within_the_budget(server) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as h:
        model = h.get("/v1/models").json()["data"][0]["id"]
        rss = _rss_bytes(server.process.pid)
        started = time.monotonic()
        r = h.post("/v1/chat/completions", json=_body(model, EXPLODING_GRAMMAR))
        took = time.monotonic() - started
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "grammar_budget_exceeded" and error["param"] == "grammar"
        assert "simplify the grammar" in error["message"]
        assert took < BUDGET_S, took
        # the grammar's stacks grew in the worker, not in the server
        assert _rss_bytes(server.process.pid) - rss < 200 << 20
        # the server goes on, with client grammars too
        ok = h.post("/v1/chat/completions", json=_body(model, CLICK_GRAMMAR, max_tokens=24))
        assert ok.status_code == 200, ok.text
        assert ok.json()["choices"][0]["message"]["content"].startswith("click(")
        assert h.get("/health").json()["ledger"]["reserved_bytes"] == 0


def test_a_streamed_exploding_grammar_ends_its_stream_with_the_error(server) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as h:
        model = h.get("/v1/models").json()["data"][0]["id"]
        started = time.monotonic()
        events = []
        with h.stream("POST", "/v1/chat/completions",
                      json=_body(model, EXPLODING_GRAMMAR, stream=True)) as r:
            if r.status_code == 200:  # tokens came before the budget ran out
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
            else:  # it ran out before the first token: a plain error response
                assert r.status_code == 400
                events.append(json.loads(r.read()))
        assert time.monotonic() - started < BUDGET_S
        assert events and events[-1]["error"]["code"] == "grammar_budget_exceeded"


def test_the_openai_client_sees_a_bad_request(server) -> None:
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0,
                      timeout=120)
    model = c.models.list().data[0].id
    with pytest.raises(openai.BadRequestError, match="grammar"):
        c.chat.completions.create(model=model, max_tokens=300, temperature=0,
                                  messages=[{"role": "user", "content": "write"}],
                                  extra_body={"grammar": EXPLODING_GRAMMAR})


def test_shutdown_ends_a_grammar_completion_within_the_grace(forged, tmp_path) -> None:
    """SIGTERM while a client's exploding grammar is being matched: the server exits
    cleanly, within its grace period plus one grammar call — never waiting on the grammar."""
    import threading

    m = forged("qwen35")
    answered: list[int] = []

    def ask(url: str, model: str) -> None:
        try:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                           json=_body(model, EXPLODING_GRAMMAR))
            answered.append(r.status_code)
        except httpx.HTTPError:
            answered.append(0)  # the connection closed at shutdown: also an end

    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "2",
                       "--grace-seconds", "1") as s:
        asking = threading.Thread(target=ask, args=(s.url, s.model))
        asking.start()
        time.sleep(1.0)  # the completion is under way
        stopping = time.monotonic()
    took = time.monotonic() - stopping  # kvagent_serve waited for the exit (code 0)
    asking.join(timeout=60)
    assert not asking.is_alive() and len(answered) == 1
    assert took < 20.0, took


def test_a_client_that_leaves_stops_its_grammar_completion(server) -> None:
    """A streamed completion under a client grammar that never ends: the client hangs up
    after its first chunk; the step stops at its next token (each grammar call is bounded),
    the server logs the disconnect, holds nothing, and answers the next grammar request."""
    with httpx.Client(base_url=server.url, timeout=120) as h:
        model = h.get("/v1/models").json()["data"][0]["id"]
        endless = 'root ::= "a" ("a" | "b")*'
        with h.stream("POST", "/v1/chat/completions",
                      json=_body(model, endless, stream=True, max_tokens=4000)) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    break  # one chunk, then hang up
        deadline = time.monotonic() + 30
        while "chat_client_disconnected" not in server.stderr():
            assert time.monotonic() < deadline, "the server did not see the client leave"
            time.sleep(0.2)
        while h.get("/health").json()["ledger"]["reserved_bytes"]:  # the step rolled back
            assert time.monotonic() < deadline, "the left client's step still holds memory"
            time.sleep(0.2)
        ok = h.post("/v1/chat/completions", json=_body(model, CLICK_GRAMMAR, max_tokens=24))
        assert ok.status_code == 200, ok.text
