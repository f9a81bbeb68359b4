"""``kvagent serve``'s exit status says how its shutdown went: a real server process (the
forged tiny model, loopback) whose shutdown fails — a fault injected into the scheduler's
close, after every episode closed, where the final integrity check runs — exits 1 and names
the cause last on stderr (uvicorn alone logs "Application shutdown failed" and exits 0).

A shutdown past ``--grace-seconds`` ends every request still in flight with an answer — a
JSON ``503 server_shutting_down``, or a stream's error event then ``[DONE]`` — closes every
episode exactly once and exits 0."""

from __future__ import annotations

import base64
import json
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

#: Runs kvagent's command line with the scheduler's close failing once it has closed
#: every episode (as the final integrity check does when the ledger drifted).
FAULTY_CLOSE = """
import sys
import scheduler.scheduler as s
from scheduler.errors import IntegrityError

close = s.Scheduler.aclose

async def aclose(self):
    await close(self)
    raise IntegrityError("injected: the ledger holds 4096 bytes that no sequence has")

s.Scheduler.aclose = aclose
from runtime.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_failed_shutdown_exits_non_zero_and_says_why(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    png = base64.b64encode(screenshot(0, 320, 240)).decode()
    with kvagent_serve(m.model_path.parent, tmp_path, expect_clean_exit=False,
                       launcher=("-c", FAULTY_CLOSE)) as served:
        with httpx.Client(base_url=served.url, timeout=60) as c:
            ep = c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
            assert c.post(f"/v1/episodes/{ep}/step", json={"screenshot": png}).status_code == 200
    text = served.stderr()
    assert served.exit_code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last == ("kvagent serve: error: the shutdown failed: IntegrityError: injected: "
                    "the ledger holds 4096 bytes that no sequence has"), text[-3000:]
    assert '"serve_shutdown_failed"' in text


def test_a_clean_shutdown_exits_zero(forged, tmp_path: Path) -> None:
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path) as served:  # checks exit 0 on its way out
        assert httpx.get(f"{served.url}/health", timeout=30).json()["status"] == "ok"
    assert "shutdown failed" not in served.stderr()


#: A grammar no answer can finish: every request decodes its whole ``max_tokens``.
ENDLESS = "root ::= [a-z ]+ root"


def _chat(url: str, model: str, i: int, stream: bool, out: dict[int, Any],
          started: threading.Event) -> None:
    """One long chat completion; what came back goes to ``out[i]``: (status, JSON body) or,
    streamed, (status, the ``data:`` payloads)."""
    body = {"model": model, "max_tokens": 8000, "temperature": 1.0, "seed": i,
            "stream": stream, "grammar": ENDLESS,
            "messages": [{"role": "user", "content": f"Tell a long story, {i}."}]}
    if not stream:
        started.set()  # (the server's health says when it runs)
    with httpx.Client(timeout=120) as h:
        with h.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if not stream:
                out[i] = (r.status_code, json.loads(r.read()))
                return
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: "):])
                    if '"content"' in line:
                        started.set()
            out[i] = (r.status_code, events)


def test_a_shutdown_past_the_grace_period_answers_every_request(forged, tmp_path: Path) -> None:
    """Four long completions in flight (two streamed, two not; a grammar that never lets
    them end), SIGTERM with ``--grace-seconds 1``: the non-streamed ones get a JSON 503
    ``server_shutting_down``, the streams an error event with that code then ``[DONE]``;
    every episode closes exactly once (no KeyError of a double close), no traceback, exit 0
    (``kvagent_serve`` checks it and ``serve_host_closed`` on its way out)."""
    m = forged("qwen35")
    out: dict[int, Any] = {}
    with kvagent_serve(m.model_path.parent, tmp_path, "--grace-seconds", "1",
                       "--max-episodes", "4", "--ctx", "16384") as served:
        model = httpx.get(f"{served.url}/v1/models", timeout=30).json()["data"][0]["id"]
        started = [threading.Event() for _ in range(4)]
        threads = [threading.Thread(target=_chat, args=(served.url, model, i, i % 2 == 0, out,
                                                        started[i]))
                   for i in range(4)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # every request decoding (the streams: a token)
            health = httpx.get(f"{served.url}/health", timeout=30).json()
            if (all(e.is_set() for e in started)
                    and health["summary"].startswith("episodes: 4 running")):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the requests did not all start: {health}")
        served.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(90)
        served.process.wait(60)  # (exited: the helper sends no second signal)
    text = served.stderr()
    assert "Traceback" not in text and "KeyError" not in text, text[-3000:]
    assert sorted(out) == [0, 1, 2, 3], out
    for i in (1, 3):
        status, body = out[i]
        assert status == 503 and body["error"]["code"] == "server_shutting_down", out[i]
    for i in (0, 2):
        status, events = out[i]
        assert status == 200 and events[-1] == "[DONE]", (status, events[-3:])
        error = json.loads(events[-2])["error"]
        assert error["code"] == "server_shutting_down", events[-2]
        assert any('"content"' in e for e in events[:-2])  # it was cut mid-answer
    # every episode opened was closed exactly once
    opened = re.findall(r'"episode_id": "([^"]+)", "seq_id": \d+, "policy"', text)
    closed = re.findall(r'"episode_id": "([^"]+)", "seq_id": \d+, "event": "episode_close"',
                        text)
    assert len(opened) == 4 and sorted(closed) == sorted(opened), (opened, closed)
    assert '"serve_grace_expired"' in text and '"scheduler_shutdown"' in text
