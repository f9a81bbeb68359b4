"""Bounded work per request and every bad input a 4xx — a real ``kvagent serve`` on loopback:
an image refused from its header (a flat 16000x4000 PNG costs well under a second), pixels
per request, half-sent requests closed (slowloris), a body that does not arrive (408), the
issue's bad inputs, ``Retry-After`` on streamed and plain 429s."""

from __future__ import annotations

import base64
import io
import json
import os
import socket
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image

from runtime.bench.trajectory import screenshot
from runtime.serve.http.errors import ApiError, error_response
from serve_helpers import kvagent_serve

W, H = 320, 240


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _url(png: bytes) -> str:
    return "data:image/png;base64," + _b64(png)


def _flat_png(w: int, h: int) -> bytes:
    out = io.BytesIO()
    Image.new("L", (w, h)).save(out, "PNG", optimize=True)
    return out.getvalue()


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-limits")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2", "--header-timeout", "1",
                       "--body-timeout", "1", "--max-connections", "64",
                       "--max-request-pixels", str(3 * W * H + 1)) as served:
        yield served


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_a_huge_flat_png_is_refused_from_its_header(server) -> None:
    png = _flat_png(16000, 4000)  # a few KB on the wire, 64 M pixels
    assert len(png) < 200_000
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ep = c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
        chat = {"model": server.model, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _url(png)}}]}]}
        seconds = []
        for method, path, body in (("POST", f"/v1/episodes/{ep}/step", {"screenshot": _b64(png)}),
                                   ("POST", "/v1/chat/completions", chat)):
            t0 = time.perf_counter()
            r = c.request(method, path, json=body)
            seconds.append(time.perf_counter() - t0)  # the client's round trip: an upper
            err = _error(r, 413)                       # bound of the server's time
            assert err["code"] == "image_too_large" and "16000x4000" in err["message"]
        print(f"16000x4000 PNG ({len(png)} bytes) refused in {max(seconds):.3f} s")
        assert max(seconds) < 3.0  # headroom for a loaded box; a decode and encode of the
        # 64 M pixels would take longer (the PNG decode alone: 0.75 s on an idle core)
        # the request's pixels in all: three 320x240 screenshots fit, a fourth does not
        shots = [{"type": "image_url", "image_url": {"url": _url(screenshot(i, W, H))}}
                 for i in range(4)]
        err = _error(c.post("/v1/chat/completions", json={**chat, "messages": [
            {"role": "user", "content": shots}]}), 413)
        assert err["code"] == "image_too_large" and "in all" in err["message"]
        assert c.delete(f"/v1/episodes/{ep}").status_code == 204


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_half_sent_requests_are_closed_and_connections_capped(server) -> None:
    pid = server.process.pid
    before = _open_fds(pid)
    socks = []
    host, port = server.url.removeprefix("http://").split(":")
    for _ in range(150):  # more than --max-connections 64
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: x\r\nContent-Le")  # and stop
        socks.append(s)
    time.sleep(0.5)
    # the server holds at most --max-connections of them (the rest closed as accepted)
    assert _open_fds(pid) - before <= 64 + 2
    deadline = time.monotonic() + 10  # --header-timeout 1: every one of them is closed
    closed = 0
    for s in socks:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            closed += s.recv(1) == b""
        except ConnectionResetError:
            closed += 1
        except TimeoutError:
            pass
        s.close()
    assert closed == len(socks)
    assert _open_fds(pid) <= before + 2
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_a_body_that_does_not_arrive_is_a_408(server) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 1000\r\n\r\n{\"instruction\"")  # then nothing
        t0 = time.monotonic()
        reply = s.recv(4096)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert 0.8 < time.monotonic() - t0 < 5
        while b"request_timeout" not in reply:  # (the body may come in its own segment)
            more = s.recv(4096)
            assert more, reply
            reply += more


def _raw(c: httpx.Client, path: str, text: str | bytes) -> httpx.Response:
    return c.post(path, content=text if isinstance(text, bytes) else text.encode(),
                  headers={"content-type": "application/json"})


def test_the_issues_bad_inputs_are_4xx(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        chat = {"model": server.model, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        for path in ("/v1/chat/completions", "/v1/episodes"):
            _error(_raw(c, path, "[" * 100_000 + "]" * 100_000), 400)  # RecursionError
            _error(_raw(c, path, '{"a":' * 70 + "1" + "}" * 70), 400)  # deeper than 64
            _error(_raw(c, path, '{"seed": ' + "9" * 5000 + "}"), 400)  # int over 4300 digits
            _error(_raw(c, path, '{"x": NaN}'), 400)
            _error(_raw(c, path, b'{"x": "\xff"}'), 400)
        lone = json.dumps({**chat, "messages": [{"role": "user", "content": "a\ud800b"}]})
        err = _error(_raw(c, "/v1/chat/completions", lone), 400)
        assert "surrogate" in err["message"]
        _error(_raw(c, "/v1/chat/completions", json.dumps({**chat, "user": "\udc00"})), 400)
        _error(_raw(c, "/v1/episodes", json.dumps({"instruction": "x\ud83d"})), 400)
        for options, status in (({"seed": -1}, 400), ({"decode_tokens": 8.5}, 400),
                                ({"window": True}, 400), ({"overlap": 1}, 400),
                                ({"temperature": "1"}, 400), ({"profile": ["kvagent"]}, 400),
                                ({"system_prompt": "x" * 5_000_000}, 413),
                                ({"policy": "relocate"}, 400)):  # (refused on a hybrid)
            r = c.post("/v1/episodes", json={"instruction": "x", "options": options})
            assert r.status_code == status, (options, r.text)
        for bad in ({"response_format": {"type": "json_schema", "json_schema": {
                        "schema": {"type": "object", "properties": {"a": {"$ref": "#"}}}}}},
                    {"grammar": "root ::= nothing-defined"},
                    {"grammar": "root ::= root \"a\""},
                    {"kvagent": {"action_grammar": "no-such-profile"}},
                    {"grammar": 'root ::= "a"', "kvagent": {"action_grammar": "qwen3vl"}},
                    {"user": "u" * 1000}, {"model": "m" * 1000}):
            _error(c.post("/v1/chat/completions", json={**chat, **bad}), 400)
        # a good request still works, and nothing is held or reserved
        assert c.post("/v1/chat/completions", json=chat).status_code == 200
        health = c.get("/health").json()
        assert health["ledger"]["reserved_bytes"] == 0
        for e in c.get("/v1/episodes").json()["data"]:
            c.delete(f"/v1/episodes/{e['episode_id']}")


def test_streamed_and_plain_429_carry_retry_after(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        for e in c.get("/v1/episodes").json()["data"]:
            c.delete(f"/v1/episodes/{e['episode_id']}")
        eps = [c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
               for _ in range(2)]  # every slot held by an episode (not idle long enough)
        chat = {"model": server.model, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        for stream in (False, True):
            r = c.post("/v1/chat/completions", json={**chat, "stream": stream})
            assert r.status_code == 429, r.text
            assert int(r.headers["retry-after"]) >= 1
        r = c.post("/v1/episodes", json={"instruction": "x"})
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        for ep in eps:
            c.delete(f"/v1/episodes/{ep}")
    # every 429 / 503 the one mapping makes has it, whatever the error said
    for status in (429, 503):
        assert error_response(ApiError(status, "x")).headers["retry-after"] == "1"
    assert "retry-after" not in error_response(ApiError(400, "x")).headers


def test_the_server_log_says_no_internal_error(server) -> None:
    text = Path(server.stderr_path).read_text()
    assert "serve_error" not in text and "Traceback" not in text
