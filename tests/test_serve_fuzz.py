"""Every bad input a 4xx: a hypothesis fuzz of both APIs' request bodies against a real
``kvagent serve`` on loopback — JSON shapes, wrong types, huge and negative numbers, deep
nesting, lone surrogates, raw bytes that are not JSON — asserting that no request gets a 5xx
(429 is load, and a 4xx) and that the ledger does not drift: the server runs with the
suite's ``KVAGENT_DEBUG=1`` (the scheduler checks the ledger against the engine whenever it
goes idle, and an ``IntegrityError`` would be a 500), holds nothing reserved at the end and
exits cleanly.  Derandomized (the same examples every run) and bounded (``EXAMPLES`` per
API) to keep the suite fast."""

from __future__ import annotations

import base64
import io
import json
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from serve_helpers import kvagent_serve

EXAMPLES = 100
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), database=None)


def _png(w: int = 32, h: int = 24) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), (40, 90, 200)).save(out, "PNG")
    return out.getvalue()


PNG_B64 = base64.b64encode(_png()).decode()
SURROGATES = ["\ud800", "a\udfffb", "\udc00\ud800"]

scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, -1, 1, 2**31, 2**63, -(2**63) - 1, 10**300]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=24), st.sampled_from(SURROGATES))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                      | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=16)
#: whole bodies that are not JSON objects, or that JSON parsers choke on
RAW = st.sampled_from([
    b"", b"{", b"null", b"[]", b"\"text\"", b"{\"a\": NaN}", b"{\"a\": Infinity}",
    b"{\"a\": " + b"7" * 5000 + b"}", b"[" * 50_000 + b"]" * 50_000,
    b"{\"a\":" * 100 + b"1" + b"}" * 100, b"\xff\xfe{}", b"{\"a\": \"\\ud800\"}",
    b"{\"a\": 1, \"a\": 2}", b"{" + b"\"k\": 1, " * 300_000 + b"\"z\": 0}"])

image_parts = st.one_of(
    st.just({"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG_B64}}),
    st.just({"type": "image_url", "image_url": {"url": PNG_B64}}),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}},
              st.sampled_from(["data:image/png;base64,%%%", "data:text/plain;base64,aGk=",
                               "https://example.com/x.png", "file:///etc/passwd",
                               "data:image/png,raw", ""])),
    st.builds(lambda v: {"type": "image_url", "image_url": v}, values))
parts = st.one_of(st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=40)),
                  image_parts, values)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "developer", "tool", ""]),
     "content": st.one_of(st.text(max_size=40), st.lists(parts, max_size=3), values)}),
    min_size=0, max_size=4)
CHAT_FIELDS: dict[str, Any] = {
    "messages": st.one_of(messages, values),
    "max_tokens": st.one_of(st.integers(-5, 2**40), values),
    "max_completion_tokens": st.one_of(st.integers(-5, 100), values),
    "temperature": st.one_of(st.floats(-1, 3, allow_nan=False), values),
    "top_p": st.one_of(st.floats(-1, 2, allow_nan=False), values),
    "seed": st.one_of(st.integers(-(2**70), 2**70), values),
    "stop": st.one_of(st.lists(st.text(max_size=80), max_size=6), values),
    "stream": st.one_of(st.booleans(), values), "user": st.one_of(st.text(max_size=300), values),
    "n": values, "tools": values, "kvagent_mode": st.one_of(
        st.sampled_from(["faithful", "terminal", "x"]), values),
    "grammar": st.one_of(st.sampled_from(['root ::= "yes" | "no"', "root ::= x", "root ::= (",
                                          'root ::= [a-z]{1,5}']), values),
    "response_format": st.one_of(st.sampled_from([
        {"type": "json_object"}, {"type": "text"},
        {"type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
            "a": {"type": "integer"}, "b": {"enum": ["x", "y"]}}, "required": ["a"]}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "x"}}},
        {"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}}]), values),
    "kvagent": st.one_of(st.sampled_from([{"action_grammar": "qwen3vl"},
                                          {"action_grammar": "nope"}, {"x": 1}]), values),
    "model": st.one_of(st.text(max_size=10), values),
}
OPTION_FIELDS: dict[str, Any] = {
    "profile": st.one_of(st.sampled_from(["kvagent", "qwen3vl", "uitars", "chat", "x"]),
                         values),
    "policy": st.one_of(st.sampled_from(["terminal-slot", "evict", "relocate", "x"]), values),
    "window": st.one_of(st.integers(-2, 80), values), "overlap": values,
    "temperature": st.one_of(st.floats(-1, 200, allow_nan=False), values),
    "seed": st.one_of(st.integers(-(2**70), 2**70), values), "grammar": values,
    "convention": st.one_of(st.sampled_from(["absolute", "relative_999", "relative_1"]),
                            values),
    "decode_tokens": st.one_of(st.integers(-3, 10_000), values),
    "system_prompt": st.one_of(st.text(max_size=50), values), "flux": values,
}


def _override(base: dict[str, Any], fields: dict[str, Any], most: int = 3) -> Any:
    """``base`` with up to ``most`` of ``fields`` replaced by drawn values."""
    return st.dictionaries(st.sampled_from(sorted(fields)), st.just(None),
                           max_size=most).flatmap(
        lambda chosen: st.fixed_dictionaries({k: fields[k] for k in chosen}).map(
            lambda drawn: {**base, **drawn}))


def _send(c: httpx.Client, method: str, path: str, body: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body, ensure_ascii=True).encode()
    with c.stream(method, path, content=content,
                  headers={"content-type": "application/json"}) as r:
        r.read()  # (a stream: every event)
    return r


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text[:500])
    if r.status_code >= 400:
        body = r.json()
        assert set(body) == {"error"} and body["error"]["message"]
    if r.status_code in (429, 503):
        assert int(r.headers["retry-after"]) >= 1


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-fuzz")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2",
                       "--max-completion-tokens", "3", "--idle-seconds", "1") as served:
        yield served
    # (kvagent_serve checked: exit 0 after SIGTERM, every episode closed, no traceback —
    # and the scheduler's integrity check at close, under KVAGENT_DEBUG=1)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _clean(c: httpx.Client) -> None:
    for e in c.get("/v1/episodes").json()["data"]:
        c.delete(f"/v1/episodes/{e['episode_id']}")


def test_fuzz_chat_completions(server, client) -> None:
    base = {"model": server.model, "max_tokens": 3,
            "messages": [{"role": "user", "content": "hi"}]}
    seen: dict[int, int] = {}

    @SETTINGS
    @given(st.one_of(_override(base, CHAT_FIELDS), RAW, values))
    def fuzz(body: Any) -> None:
        r = _send(client, "POST", "/v1/chat/completions", body)
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        _check(r)

    fuzz()
    print(f"chat fuzz: {sum(seen.values())} requests by status {dict(sorted(seen.items()))}")
    assert seen.get(200) and sum(v for k, v in seen.items() if 400 <= k < 500)
    _clean(client)
    assert client.get("/health").json()["ledger"]["reserved_bytes"] == 0


def test_fuzz_the_episode_api(server, client) -> None:
    seen: dict[int, int] = {}
    create_base = {"instruction": "Open the terminal.", "options": {"decode_tokens": 4}}
    held: list[str] = []  # the good episode the fuzzed steps go to

    def note(r: httpx.Response) -> None:
        seen[r.status_code] = seen.get(r.status_code, 0) + 1
        _check(r)

    @SETTINGS
    @given(create=st.one_of(
               _override(create_base, {"instruction": st.one_of(st.text(max_size=30), values),
                                       "screen": st.one_of(st.lists(st.integers(-1, 20_000),
                                                                    max_size=3), values),
                                       "options": st.one_of(_override({}, OPTION_FIELDS, 2),
                                                            values)}, 1),
               RAW),
           step=st.one_of(st.just({"screenshot": PNG_B64}),
                          st.fixed_dictionaries({"screenshot": st.one_of(
                              values, st.sampled_from([PNG_B64[:-4], "%%%", PNG_B64 + "=",
                                                       base64.b64encode(b"GIF89a").decode()]))}),
                          RAW, values),
           other=st.text(min_size=1, max_size=40))
    def fuzz(create: Any, step: Any, other: str) -> None:
        r = _send(client, "POST", "/v1/episodes", create)  # a fuzzed create ...
        note(r)
        if r.status_code == 201:
            note(_send(client, "DELETE", f"/v1/episodes/{r.json()['episode_id']}", b""))
        if not held or client.get(f"/v1/episodes/{held[0]}").status_code != 200:
            made = client.post("/v1/episodes", json=create_base)
            assert made.status_code == 201, made.text
            held[:] = [made.json()["episode_id"]]
        ep = quote(held[0], safe="")  # ... and a fuzzed step of a good episode
        for method, path, body in (("POST", f"/v1/episodes/{ep}/step", step),
                                   ("GET", f"/v1/episodes/{ep}", b""),
                                   ("POST", f"/v1/episodes/{quote(other, safe='')}/step", step),
                                   ("GET", f"/v1/episodes/{quote(other, safe='')}", b""),
                                   ("DELETE", f"/v1/episodes/{quote(other, safe='')}", b"")):
            note(_send(client, method, path, body))

    fuzz()
    print(f"episode fuzz: {sum(seen.values())} requests by status {dict(sorted(seen.items()))}")
    assert seen.get(201) and seen.get(200) and seen.get(400) and seen.get(404)
    print(f"episode fuzz: {seen.get(200, 0)} OK answers (steps and views)")
    _clean(client)
    health = client.get("/health").json()
    assert health["episodes"]["open"] == 0 and health["ledger"]["reserved_bytes"] == 0


def test_the_fuzzed_server_logged_no_internal_error(server) -> None:
    text = server.stderr()
    assert "serve_error" not in text and "Traceback" not in text
    assert "IntegrityError" not in text
