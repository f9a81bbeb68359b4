"""``kvagent serve`` shared by tenants: API keys on every route but ``/health``, episodes and
conversations owned by the key that opened them (another key gets 404 and does not see them),
unguessable ids, loopback without a key, ``KvAgent(server=..., api_key=...)`` — a real server
process on loopback, spoken to with httpx, the ``openai`` client and ``KvAgent``."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest

from runtime.bench.trajectory import screenshot
from runtime.osworld import AgentStepError, KvAgent
from runtime.serve.http.auth import ApiKeyError, ApiKeys
from runtime.serve.http.routes import ROUTES
from serve_helpers import kvagent_serve

ROOT = Path(__file__).resolve().parents[1]
ALICE, BOB = "alice-key-0123456789", "bob-key-9876543210"
W, H = 320, 240


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _as(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-keys")
    keyfile = tmp / "keys.txt"
    keyfile.write_text(f"# the second tenant\n{BOB}\n")
    with kvagent_serve(m.model_path.parent, tmp, "--api-key", ALICE, "--api-key-file",
                       str(keyfile), "--max-episodes", "4") as served:
        yield served
    text = served.stderr()
    assert ALICE not in text and BOB not in text  # keys never reach the log


def test_every_route_but_health_needs_a_key(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        ep = c.post("/v1/episodes", json={"instruction": "x"}, headers=_as(ALICE)).json()[
            "episode_id"]
        for route in ROUTES:
            path = route.path.replace("{episode_id}", ep)
            for key in (None, "wrong-key-000000", ALICE[:-1]):
                r = c.request(route.method, path, headers=_as(key), json={})
                if route.path == "/health":
                    assert r.status_code == 200, r.text
                    continue
                assert r.status_code == 401, (route, key, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
                assert r.headers["www-authenticate"].startswith("Bearer")
        # a path no route has: 401 as well (nothing is said about what exists)
        assert c.get("/v1/nothing", headers=_as(None)).status_code == 401
        assert c.get("/v1/nothing", headers=_as(ALICE)).status_code == 404
        assert c.get("/metrics", headers=_as(BOB)).status_code == 200
        assert c.delete(f"/v1/episodes/{ep}", headers=_as(ALICE)).status_code == 204


def test_one_key_cannot_list_read_step_restart_or_end_anothers(server) -> None:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        r = c.post("/v1/episodes", json={"instruction": "Open the terminal."},
                   headers=_as(ALICE))
        assert r.status_code == 201
        ep = r.json()["episode_id"]
        assert re.fullmatch(r"ep-[A-Za-z0-9_-]{22}", ep)  # 128 random bits, not a count
        shot = {"screenshot": _b64(screenshot(0, W, H))}
        assert c.post(f"/v1/episodes/{ep}/step", json=shot, headers=_as(ALICE)).status_code \
            == 200
        # Alice's chat conversation, named by `user`
        chat = {"model": server.model, "max_tokens": 3, "temperature": 0, "user": "agent-1",
                "messages": [{"role": "user", "content": "Name a colour."}]}
        first = c.post("/v1/chat/completions", json=chat, headers=_as(ALICE)).json()
        conv = first["kvagent"]["conversation_id"]
        assert conv.startswith("chat-") and conv != "agent-1"

        # Bob sees none of it, and every way in is a 404 like an id that does not exist
        assert c.get("/v1/episodes", headers=_as(BOB)).json()["data"] == []
        for method, path in (("GET", f"/v1/episodes/{ep}"), ("GET", f"/v1/episodes/{conv}"),
                             ("POST", f"/v1/episodes/{ep}/step"),
                             ("GET", f"/v1/episodes/{ep}/lease"),
                             ("DELETE", f"/v1/episodes/{ep}"),
                             ("DELETE", f"/v1/episodes/{conv}")):
            mine = c.request(method, path, json=shot, headers=_as(BOB))
            nobody = c.request(method, path.replace(ep, "ep-" + "A" * 22).replace(
                conv, "chat-" + "A" * 22), json=shot, headers=_as(BOB))
            assert mine.status_code == nobody.status_code == 404, (method, path, mine.text)
            assert mine.json()["error"]["code"] == nobody.json()["error"]["code"]
        # Bob naming the same conversation, with other content, gets his own: Alice's is
        # not restarted (her next request still reuses her cache)
        bobs = c.post("/v1/chat/completions", headers=_as(BOB), json={
            **chat, "messages": [{"role": "user", "content": "Something else entirely."}]})
        assert bobs.status_code == 200 and bobs.json()["kvagent"]["conversation_id"] != conv
        # ... and a `user` equal to an episode id names a conversation, not the episode
        odd = c.post("/v1/chat/completions", headers=_as(BOB), json={**chat, "user": ep})
        assert odd.status_code == 200, odd.text
        again = c.post("/v1/chat/completions", json=chat, headers=_as(ALICE)).json()
        assert again["kvagent"]["conversation_id"] == conv
        assert again["kvagent"]["reused_tokens"] > 0
        listed = {e["episode_id"] for e in c.get("/v1/episodes", headers=_as(ALICE)).json()[
            "data"]}
        assert listed == {ep, conv}
        for gone in (ep, conv):
            assert c.delete(f"/v1/episodes/{gone}", headers=_as(ALICE)).status_code == 204
        for e in c.get("/v1/episodes", headers=_as(BOB)).json()["data"]:
            assert c.delete(f"/v1/episodes/{e['episode_id']}", headers=_as(BOB)).status_code \
                == 204


def test_the_openai_client_and_kvagent_send_their_key(server, monkeypatch) -> None:
    c = openai.OpenAI(base_url=f"{server.url}/v1", api_key=BOB, max_retries=0, timeout=60)
    assert c.models.list().data[0].id == server.model
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="not-a-key-at-all",
                      max_retries=0).models.list()
    agent = KvAgent(server=server.url, api_key=ALICE, screen_size=(W, H))
    try:
        agent.reset()
        _, actions = agent.predict("Open the terminal.", {"screenshot": screenshot(0, W, H)})
        assert actions
    finally:
        agent.close()
    monkeypatch.setenv("KVAGENT_API_KEY", f"{BOB},{ALICE}")  # a client takes the first
    from_env = KvAgent(server=server.url, screen_size=(W, H))
    keyless = KvAgent(server=server.url, screen_size=(W, H), api_key="wrong-key-000000",
                      server_retry_s=0)
    try:
        from_env.predict("Click OK.", {"screenshot": screenshot(1, W, H)})
        with pytest.raises(AgentStepError, match="401"):
            keyless.predict("Click OK.", {"screenshot": screenshot(1, W, H)})
    finally:
        from_env.close()
        keyless.close()


def test_keys_from_flags_environment_and_files(tmp_path) -> None:
    keyfile = tmp_path / "k"
    keyfile.write_text("# comment\n\nfile-key-aaaaaaaa\n")
    keys = ApiKeys.gather(["flag-key-bbbbbbbb"], "env-key-cccccccc, env-key-dddddddd",
                          [keyfile])
    assert keys.keys == ("flag-key-bbbbbbbb", "env-key-cccccccc", "env-key-dddddddd",
                         "file-key-aaaaaaaa")
    assert "bbbb" not in repr(keys) and "aaaa" not in repr(keys)
    assert keys.owner("Bearer env-key-dddddddd", None) == "key-3"
    assert keys.owner("Bearer env-key-dddddddd", "key-1") == "key-3"  # (no internal key)
    assert keys.owner("Basic env-key-dddddddd", None) is None
    assert keys.owner(None, None) is None
    internal = ApiKeys(internal="internal-key-eeeeeeee")
    assert internal.owner("Bearer internal-key-eeeeeeee", "key-2") == "key-2"
    assert internal.owner("Bearer key-2", "key-2") is None
    for bad in ("short", "has space inside"):
        with pytest.raises(ApiKeyError):
            ApiKeys.gather([bad])


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", "serve", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={k: v for k, v in __import__("os").environ.items()
                               if k != "KVAGENT_API_KEY"})


def test_a_public_address_without_a_key_is_refused() -> None:
    out = _serve("--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 2, out.stderr
    assert "--insecure-no-auth" in out.stderr and "Traceback" not in out.stderr
    out = _serve("--host", "0.0.0.0", "--api-key", "short")
    assert out.returncode == 2 and "at least 8" in out.stderr


def test_a_context_that_does_not_fit_is_refused_before_loading(forged) -> None:
    # the M model: 64 sequences of 1M positions are ~220 GiB of KV cache, more than any
    # machine running this has available (the tiny one's 21 GiB may fit)
    m = forged("qwen35", size="M")
    out = _serve("--model", str(m.model_path), "--mmproj", str(m.mmproj_path), "--port", "0",
                 "--ctx", "1048576", "--max-episodes", "64")
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--ctx" in out.stderr and "--max-episodes" in out.stderr
    assert "Traceback" not in out.stderr and "ModelLoadError" not in out.stderr
