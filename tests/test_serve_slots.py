"""Slots come back when their client is gone, and every open asks the same rule: an episode
open takes an answered chat conversation's slot as a chat open does, a conversation being
opened keeps its slot until its first answer, and a ``KvAgent(server=URL)`` process that ends
with ``os._exit`` gives its episode's slot back at once (its lease request closes)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from cachepolicy.engine import EngineConfig
from runtime.bench.trajectory import screenshot
from runtime.config import AgentConfig
from runtime.osworld import KvAgent
from runtime.pool import PoolFullError
from runtime.serve.config import ServeConfig
from runtime.serve.conversation import Conversation
from runtime.serve.host import ModelHost
from runtime.serve.owners import ANONYMOUS
from serve_helpers import kvagent_serve

ROOT = Path(__file__).resolve().parents[1]
W, H = 320, 240

EXITING_WORKER = """
import os, sys
from runtime.bench.trajectory import screenshot
from runtime.config import AgentConfig
from runtime.osworld import KvAgent
agent = KvAgent(server=sys.argv[1], screen_size=(320, 240), server_retry_s=0)
agent.reset()
_, actions = agent.predict("Open the terminal.", {"screenshot": screenshot(0, 320, 240)})
print(agent.episode_id, flush=True)
os._exit(0)  # as OSWorld's workers end: no close, no finalizer, no atexit hook
"""


def test_a_conversation_being_opened_keeps_its_slot_until_it_answers(forged) -> None:
    m = forged("qwen35")
    config = ServeConfig(model_path=m.model_path, mmproj_path=m.mmproj_path,
                         engine=EngineConfig(n_ctx_per_seq=4096, n_seq_max=2, n_threads=1))

    async def main() -> None:
        async with ModelHost.running(config) as host:
            first = (await host.episodes.create(host.config.agent, "x", None,
                                                ANONYMOUS)).episode_id
            conv = Conversation("chat-opening", ANONYMOUS, None, "", "")
            pooled = await host.conversations.open(
                conv, AgentConfig(profile="chat", grammar=False), (W, H))
            # every slot taken: an episode idle for less than --idle-seconds, and a
            # conversation still being told its earlier turns — neither gives its slot
            assert not host.slots.evictable(pooled)
            with pytest.raises(PoolFullError):
                await host.episodes.create(host.config.agent, "y", None, ANONYMOUS)
            conv.stepped = True  # it answered: an idle chat gives its slot away
            assert host.slots.evictable(pooled)
            second = await host.episodes.create(host.config.agent, "y", None, ANONYMOUS)
            assert "chat-opening" not in host.conversations
            for eid in (first, second.episode_id):
                await host.episodes.end(eid, ANONYMOUS)

    anyio.run(main)


@pytest.fixture(scope="module")
def server(forged, tmp_path_factory):
    m = forged("qwen35")
    tmp = tmp_path_factory.mktemp("serve-slots")
    with kvagent_serve(m.model_path.parent, tmp, "--max-episodes", "2",
                       "--lease-grace-seconds", "2") as served:
        yield served


def _clear(c: httpx.Client) -> None:
    for e in c.get("/v1/episodes").json()["data"]:
        c.delete(f"/v1/episodes/{e['episode_id']}")


def test_an_episode_open_takes_an_answered_chats_slot(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        _clear(c)
        for i in range(2):  # one-shot chat requests fill every slot
            r = c.post("/v1/chat/completions", json={
                "model": server.model, "max_tokens": 2,
                "messages": [{"role": "user", "content": f"question {i}"}]})
            assert r.status_code == 200, r.text
        assert c.get("/health").json()["episodes"]["open"] == 2
        eps = []
        for _ in range(2):  # an episode open takes them, as a chat open would
            r = c.post("/v1/episodes", json={"instruction": "x"})
            assert r.status_code == 201, r.text
            eps.append(r.json()["episode_id"])
        assert {e["kind"] for e in c.get("/v1/episodes").json()["data"]} == {"episode"}
        r = c.post("/v1/episodes", json={"instruction": "x"})  # episodes are not chats
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        _clear(c)


def _exiting_worker(url: str) -> str:
    out = subprocess.run([sys.executable, "-c", EXITING_WORKER, url], capture_output=True,
                         text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_a_client_ended_with_os_exit_gives_its_slot_back(server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        _clear(c)
        gone = [_exiting_worker(server.url) for _ in range(2)]  # both slots, clients gone
        # a new client at once: no 429 (a dropped lease's slot is free for the taking)
        agent = KvAgent(server=server.url, screen_size=(W, H), server_retry_s=0)
        try:
            agent.reset()
            agent.predict("Click OK.", {"screenshot": screenshot(1, W, H)})
            held = agent.episode_id
            listed = {e["episode_id"] for e in c.get("/v1/episodes").json()["data"]}
            assert held in listed and len(listed - set(gone)) == 1
            # the other one is ended by the host itself once the grace (2 s) is over
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                listed = {e["episode_id"] for e in c.get("/v1/episodes").json()["data"]}
                if listed == {held}:
                    break
                time.sleep(0.2)
            assert listed == {held}
            # ... while a live client's episode keeps its lease (and its slot)
            time.sleep(3)
            assert held in {e["episode_id"] for e in c.get("/v1/episodes").json()["data"]}
            assert "Leases: 1 held" in c.get("/health").json()["leases"]
        finally:
            agent.close()
        assert c.get("/health").json()["episodes"]["open"] == 0
    text = server.stderr()
    assert all(f'"episode_id": "{eid}"' in text for eid in gone)
    assert text.count("serve_lease_expired") >= 1


def test_a_dropped_lease_ends_its_episode_after_the_grace_never_mid_step() -> None:
    """``Leases`` alone (no model): a lease that comes back within the grace keeps the
    episode; one that does not ends it — after the running step, not during it."""
    from runtime.serve.leases import Leases

    async def main() -> None:
        ended: list[tuple[str, float]] = []
        busy = {"ep-a": False, "ep-b": True}

        async def end(eid: str) -> None:
            ended.append((eid, anyio.current_time()))
            busy.pop(eid)

        leases = Leases(grace_s=0.2, end=end, busy=lambda eid: busy.get(eid))
        async with anyio.create_task_group() as tg:
            await tg.start(leases.run)
            for eid in ("ep-a", "ep-b"):
                async with leases.hold(eid):
                    assert not leases.dropped(eid)
                assert leases.dropped(eid)  # the slot is free for the taking at once
            async with leases.hold("ep-a"):  # ep-a's client comes back within the grace
                await anyio.sleep(0.4)
                assert not ended  # (its first drop's grace passed meanwhile)
            t0 = anyio.current_time()  # ep-a dropped again, for good
            await anyio.sleep(0.6)  # ep-b's grace is over, but its step still runs
            assert [e for e, _ in ended] == ["ep-a"] and dict(ended)["ep-a"] >= t0 + 0.2
            busy["ep-b"] = False  # the step ends: the episode with it
            await anyio.sleep(0.5)
            assert "ep-b" in [e for e, _ in ended]
            assert dict(ended)["ep-b"] > t0 + 0.6
            assert leases.summary() == "Leases: 0 held, 0 dropped"
            leases.stop()

    anyio.run(main)
