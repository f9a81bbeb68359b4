"""``KvAgent(server=URL)``: the OSWorld agent as a thin client of a real ``kvagent serve``
process on loopback — deciding exactly like the in-process agent, several worker processes
sharing one server, waiting (not failing) while the server is full, an episode lost on the
server continued in a fresh one."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime.bench.trajectory import screenshot
from runtime.osworld import AgentStepError, KvAgent
from serve_helpers import kvagent_serve

W, H = 320, 240  # the screenshots
SCREEN = (640, 480)  # the VM's screen: the points are scaled onto it
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(forged):
    return forged("qwen35")


@pytest.fixture(scope="module")
def server(model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve-agents")
    with kvagent_serve(model.model_path.parent, tmp, "--max-episodes", "2",
                       "--n-batch", "64") as served:
        yield served


def _run(agent: KvAgent, instruction: str, steps: int) -> list[tuple[str, list[str], dict]]:
    agent.reset()
    out = []
    for i in range(steps):
        out.append(agent.predict_with_info(instruction, {"screenshot": screenshot(i, W, H)}))
    return out


def test_a_remote_agent_decides_exactly_like_the_in_process_one(model, server) -> None:
    instruction = "Open the file manager and create a folder named reports."
    # screenshots W x H on a SCREEN-sized screen: points scaled on this side (both agents)
    local = KvAgent(model.model_path, model.mmproj_path, n_ctx=4096, n_batch=64, n_threads=1,
                    screen_size=SCREEN, scale_to_screen=True, temperature=1.0, seed=3)
    remote = KvAgent(server=server.url, screen_size=SCREEN, scale_to_screen=True,
                     temperature=1.0, seed=3)
    try:
        here = _run(local, instruction, 4)
        there = _run(remote, instruction, 4)
        assert remote.server == server.url and remote.episode_id is not None
        status = remote.status()
        assert isinstance(status, dict) and status["episode_id"] == remote.episode_id
        assert len(status["steps"]) == 4
    finally:
        local.close()
        remote.close()
    # the same responses and the same code, generated on this side from the parsed action
    assert [(r, a) for r, a, _ in there] == [(r, a) for r, a, _ in here]
    assert any(a[0] not in ("WAIT", "DONE", "FAIL") for _, a, _ in there)
    for (_, actions, info), (_, _, local_info) in zip(there, here):
        assert info["action"] == local_info["action"]
        assert info["screen_size"] == list(SCREEN) and info["screenshot_size"] == [W, H]
        assert info["round_trip_s"] >= info["critical_path_s"] > 0
    # the server's overlap: after an action (not after DONE / FAIL: the episode is over) the
    # next step's critical path is the new screenshot, the rest was prefetched while "the
    # VM acted"
    after_action = [info for (_, before, _), (_, _, info) in zip(there, there[1:])
                    if before[0] not in ("DONE", "FAIL")]
    assert after_action
    for info in after_action:
        assert info["prefetch_prefill_tokens"] > 0 and info["reused_tokens"] > 0
        assert info["critical_path_prefill_tokens"] < info["prefill_tokens"]
    # ending the episode freed its slot on the server
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert c.get("/health").json()["episodes"]["open"] == 0


def test_worker_processes_share_one_server(server) -> None:
    """Three workers (separate processes, like run_multienv.py's) on a server with two
    episode slots: the third waits for a slot; everyone's actions equal a lone run's."""
    instructions = ["Open the terminal.", "Rename the file to notes.txt.",
                    "Close the browser window."]
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests/remote_agent_worker.py"),
                               server.url, text, "3", str(W), str(H)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT)
             for text in instructions]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert len({r["pid"] for r in results}) == 3
    assert len({s["episode_id"] for r in results for s in r["steps"]}) == 3
    lone = KvAgent(server=server.url, screen_size=(W, H))
    try:
        for text, result in zip(instructions, results):
            alone = _run(lone, text, 3)
            assert [s["actions"] for s in result["steps"]] == [a for _, a, _ in alone]
            assert [s["response"] for s in result["steps"]] == [r for r, _, _ in alone]
            assert all(s["reused"] > 0 for s in result["steps"][1:])  # (cached head)
    finally:
        lone.close()
    with httpx.Client(base_url=server.url, timeout=30) as c:
        health = c.get("/health").json()
        metrics = c.get("/metrics").text
    assert health["episodes"]["open"] == 0
    # one server, one ledger: every worker's steps went through it (3 workers x 3 steps,
    # the lone reruns 3 x 3, the earlier test's 4) — counted by the server, not the clients
    assert 'kvagent_steps_total{api="episode",status="ok"}' in metrics


def test_a_full_server_makes_a_client_wait_and_a_lost_episode_continues(model,
                                                                         tmp_path) -> None:
    with kvagent_serve(model.model_path.parent, tmp_path, "--max-episodes", "1",
                       "--idle-seconds", "6", "--n-batch", "64") as served:
        first = KvAgent(server=served.url, screen_size=(W, H))
        second = KvAgent(server=served.url, screen_size=(W, H), server_retry_s=120)
        impatient = KvAgent(server=served.url, screen_size=(W, H), server_retry_s=0.5)
        try:
            first.reset()
            _, _, info = first.predict_with_info("Open the terminal.",
                                                 {"screenshot": screenshot(0, W, H)})
            held = info["episode_id"]
            with pytest.raises(AgentStepError, match="429"):
                impatient.predict("Close it.", {"screenshot": screenshot(0, W, H)})
            done: list[Any] = []
            t = threading.Thread(target=lambda: done.append(second.predict_with_info(
                "Close the window.", {"screenshot": screenshot(0, W, H)})))
            t.start()
            t.join(timeout=1.0)
            assert t.is_alive() and not done  # the one slot is held: it waits
            t.join(timeout=300)  # the slot comes back when `first` has idled 6 s (room for
            # the impatient client's retries and a slow machine before the check above)
            assert done and done[0][1]
            # `first`'s episode gave its slot away: its next step continues in a fresh one
            time.sleep(6.5)  # (`second` idles past --idle-seconds in turn)
            _, actions, info = first.predict_with_info("Open the terminal.",
                                                       {"screenshot": screenshot(1, W, H)})
            assert actions and info["episode_id"] != held
            assert any("was gone on the server" in n for n in info["notes"])
        finally:
            for agent in (first, second, impatient):
                agent.close()


def test_remote_configuration_is_checked(model) -> None:
    with pytest.raises(ValueError, match="server"):
        KvAgent(model.model_path, model.mmproj_path, server="http://127.0.0.1:9")
    with pytest.raises(ValueError, match="n_ctx"):
        KvAgent(server="http://127.0.0.1:9", n_ctx=4096)
    with pytest.raises(ValueError, match="http"):
        KvAgent(server="127.0.0.1:9")
    nobody = KvAgent(server="http://127.0.0.1:9", server_retry_s=0.3,  # nothing listens
                     screen_size=(W, H))
    try:
        with pytest.raises(AgentStepError, match="cannot connect"):
            nobody.predict("x", {"screenshot": screenshot(0, W, H)})
    finally:
        nobody.close()
