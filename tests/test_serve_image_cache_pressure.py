"""The image-embedding cache under pressure, served: 24 concurrent chat clients against a real
``kvagent serve`` (the forged tiny model, loopback, ``KVAGENT_DEBUG=1``: the integrity check
at every idle moment and at shutdown) whose budget forces rung 1 — the cache's capacity
shrunk for the steps while the clients' screenshots are being encoded into it.  Six rounds
(issue 20 saw the cache's accounts break in 3 of 6 such runs): every request answered, no
integrity report, and after each round the cache's three counts agree (its capacity, what
its entries hold, what the ledger holds for it) and, the conversations closed, the capacity
is back at its target."""

from __future__ import annotations

import base64
import re
from collections import Counter
from pathlib import Path

import anyio
import httpx

from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

CLIENTS = 24
ROUNDS = 6
TURNS = 2
#: Screenshots of 160x120 (an embedding of ~10 KB on the forged model); at this budget the
#: cache's target is 160 KiB and 24 conversations' KV do not fit beside it.
SIZE = (160, 120)
BUDGET = "640KiB"


def _image(n: int) -> dict:
    png = base64.b64encode(screenshot(n, *SIZE)).decode()
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64," + png}}


def _metrics(text: str) -> tuple[dict[str, int], Counter[str]]:
    cache = {k: int(v) for k, v in re.findall(r'kvagent_image_cache_bytes\{kind="(\w+)"\} (\d+)',
                                              text)}
    events = Counter({k: int(v) for k, v in
                      re.findall(r'kvagent_scheduler_events\{event="(\w+)"\} (\d+)', text)})
    return cache, events


async def _client(c: httpx.AsyncClient, model: str, name: str, first: int,
                  statuses: Counter[int]) -> None:
    """An agent in the Qwen3-VL agent's shape: each turn the last two screenshots."""
    for t in range(TURNS):
        body = {"model": model, "max_tokens": 2, "temperature": 0, "user": name,
                "messages": [{"role": "system", "content": "You operate a desktop."},
                             {"role": "user", "content": [
                                 {"type": "text", "text": "Open the terminal."},
                                 *(_image(first + j) for j in range(max(0, t - 1), t + 1))]}]}
        for _ in range(30):  # a 429 / 503 is retried after its Retry-After, as clients do
            r = await c.post("/v1/chat/completions", json=body)
            statuses[r.status_code] += 1
            if r.status_code not in (429, 503):
                break
            await anyio.sleep(float(r.headers["retry-after"]))
        assert r.status_code == 200, r.text


async def test_24_chat_clients_at_a_budget_that_shrinks_the_image_cache(forged,
                                                                       tmp_path: Path) -> None:
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path, "--memory-budget", BUDGET,
                       "--max-episodes", str(CLIENTS), "--window", "2") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=120) as c:
            cache, events = _metrics((await c.get("/metrics")).text)
            target = cache["target"]
            assert cache["capacity"] == cache["ledger"] == target > 0
            for round_ in range(ROUNDS):
                statuses: Counter[int] = Counter()
                with anyio.fail_after(120):
                    async with anyio.create_task_group() as tg:
                        for k in range(CLIENTS):
                            tg.start_soon(_client, c, served.model, f"r{round_}-c{k}",
                                          10_000 * round_ + 100 * k, statuses)
                assert 500 not in statuses, statuses
                cache, now = _metrics((await c.get("/metrics")).text)
                # rung 1 ran: the cache gave capacity up while the clients' screenshots were
                # being encoded into it...
                assert now["image_cache_shrinks"] > events["image_cache_shrinks"], now
                # ...and its counts agree: the ledger holds its capacity, its entries fit
                # (the capacity may be back at its target already: each release regrows it
                # by up to half the free bytes — ``regrow_image_cache`` — and how much the
                # round's last releases freed depends on which conversations rung 0 evicted)
                assert cache["ledger"] == cache["capacity"] <= target, cache
                assert cache["entries"] <= cache["capacity"], cache
                # the pressure gone (the conversations closed), the capacity is back
                listed = (await c.get("/v1/episodes")).json()["data"]
                assert len(listed) == CLIENTS
                for conversation in listed:
                    r = await c.delete(f"/v1/episodes/{conversation['episode_id']}")
                    assert r.status_code == 204
                cache, events = _metrics((await c.get("/metrics")).text)
                assert cache["capacity"] == cache["ledger"] == target, cache
                assert cache["entries"] <= target
                health = (await c.get("/health")).json()
                assert health["ledger"]["held_bytes"] == target  # the cache's, nothing else
                assert health["ledger"]["reserved_bytes"] == 0
            assert events["integrity_checks"] >= ROUNDS  # the idle checks ran, and held
    # kvagent_serve checked the exit: 0 (the shutdown's integrity check held), no traceback
    text = served.stderr()
    assert "IntegrityError" not in text and '"serve_error"' not in text, text[-3000:]
