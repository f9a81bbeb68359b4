"""``kvagent serve --ray`` on a two-node Ray cluster on loopback (one model host per node,
the forged tiny model), compared with one ``kvagent serve`` host: placement by ledger
headroom and free sequences, affinity, /metrics summed over hosts, chat forwarding, outputs
identical to a single host, and a host killed mid-episode (the episode continues on the
other host, bitwise as if nothing happened)."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import signal
import threading
import time

import httpx
import pytest

from cluster_helpers import needs_ray, ray_nodes
from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

pytestmark = needs_ray

ARGS = ("--max-episodes", "2", "--memory-budget", "1GiB")
HOST = "x-kvagent-host"
#: The front door takes API keys like a single server; its hosts take only its own key.
KEY, OTHER = "cluster-client-key-0123", "cluster-other-key-4567"
AUTH = {"authorization": f"Bearer {KEY}"}


def _b64(png: bytes) -> str:
    return base64.b64encode(png).decode()


def _shot(i: int, width: int = 320) -> dict:
    return {"screenshot": _b64(screenshot(i, width, 240))}


@pytest.fixture(scope="module")
def model_dir(forged):
    return forged("qwen35").model_path.parent


@pytest.fixture(scope="module")
def ray_address():
    with ray_nodes(2) as address:
        yield address


@pytest.fixture(scope="module")
def cluster(model_dir, ray_address, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    with kvagent_serve(model_dir, tmp, *ARGS, "--ray", "--address", ray_address,
                       "--api-key", KEY, "--api-key", OTHER, timeout=180,
                       expect_clean_exit=False) as served:
        yield served
    text = served.stderr()
    assert served.process.returncode == 0, text[-3000:]
    assert "cluster_closed" in text and "Traceback" not in text, text[-3000:]


@pytest.fixture(scope="module")
def single(model_dir, tmp_path_factory):
    with kvagent_serve(model_dir, tmp_path_factory.mktemp("single"), *ARGS) as served:
        yield served


#: Every episode's number (its sampling seed), from the create answers: ids are unguessable.
NUMBERS: dict[str, int] = {}


def _create(c: httpx.Client, body: dict) -> str:
    """Create an episode (on the cluster); its number is remembered."""
    r = c.post("/v1/episodes", json=body)
    assert r.status_code == 201, r.text
    NUMBERS[r.json()["episode_id"]] = r.json()["episode_number"]
    return r.json()["episode_id"]


def _number(episode_id: str) -> int:
    return NUMBERS[episode_id]


def _create_as(c: httpx.Client, number: int, body: dict) -> str:
    """Create an episode on a single host under ``number`` (its sampling seed): the host
    numbers episodes in order, so earlier numbers are created and ended first."""
    while True:
        ep = _create(c, body)
        if _number(ep) == number:
            return ep
        assert _number(ep) < number, "the reference host is ahead of the cluster"
        c.delete(f"/v1/episodes/{ep}")


def _free(health: dict) -> dict[str, int]:
    return {name: h["ledger"]["budget_bytes"] - h["ledger"]["held_bytes"]
            - h["ledger"]["reserved_bytes"]
            for name, h in health["hosts"].items()
            if h["alive"] and h["episodes"]["open"] < h["episodes"]["max"]}


def _settled_free(c: httpx.Client) -> dict[str, int]:
    """``_free`` once the hosts are idle: a step's overlapped prefetch reserves, then
    publishes, after the step answered — read while it runs, the test and the front door's
    placement (a moment later) would see different ledgers."""
    deadline, last = time.monotonic() + 60, None
    while True:
        health = c.get("/health").json()
        now = (_free(health), [h["ledger"]["reserved_bytes"] for h in health["hosts"].values()])
        if now == last and not any(now[1]) or time.monotonic() > deadline:
            return now[0]
        last = now
        time.sleep(0.25)


def test_placement_by_headroom_then_affinity(cluster) -> None:
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=120) as c:
        health = c.get("/health").json()
        assert len([h for h in health["hosts"].values() if h["alive"]]) == 2
        assert len({h["node_id"] for h in health["hosts"].values()}) == 2  # one per node
        placed: dict[str, str] = {}
        widths = {0: 640, 1: 320, 2: 480}  # different screenshot sizes hold different bytes
        for k in range(3):
            free = _settled_free(c)
            best = max(free.values())
            r = c.post("/v1/episodes", json={"instruction": f"task {k}"})
            assert r.status_code == 201, r.text
            ep, host = r.json()["episode_id"], r.headers[HOST]
            assert free[host] == best, (free, host)  # the most free ledger bytes
            placed[ep] = host
            assert c.post(f"/v1/episodes/{ep}/step", json=_shot(k, widths[k])).headers[HOST] \
                == host
        assert len(set(placed.values())) == 2  # headroom spread them
        # every later step goes where the episode lives
        for i in range(2):
            for ep, host in placed.items():
                r = c.post(f"/v1/episodes/{ep}/step", json=_shot(10 + i))
                assert r.status_code == 200 and r.headers[HOST] == host, r.text
        # a full host is skipped whatever its headroom; all slots taken: 429
        r = c.post("/v1/episodes", json={"instruction": "fourth"})
        assert r.status_code == 201
        placed[r.json()["episode_id"]] = r.headers[HOST]
        assert sorted(placed.values()).count(r.headers[HOST]) == 2
        r = c.post("/v1/episodes", json={"instruction": "fifth"})
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_episodes"
        for ep in placed:
            assert c.delete(f"/v1/episodes/{ep}").status_code == 204
        health = c.get("/health").json()
        assert health["episodes"]["open"] == 0 and health["episodes"]["routed"] == 0


def test_the_front_door_needs_a_key_and_the_hosts_take_only_its_own(cluster) -> None:
    assert httpx.get(f"{cluster.url}/v1/episodes", timeout=30).status_code == 401
    assert httpx.get(f"{cluster.url}/health", timeout=30).status_code == 200
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=120) as c:
        hosts = [h["url"] for h in c.get("/health").json()["hosts"].values() if h["alive"]]
        ep = _create(c, {"instruction": "x"})
        for url in hosts:
            assert url.startswith("http://127.0.0.1:")  # one machine: loopback only
            for headers in ({}, AUTH, {**AUTH, "x-kvagent-owner": "key-1"}):
                r = httpx.get(f"{url}/v1/episodes", headers=headers, timeout=30)
                assert r.status_code == 401, r.text  # the client's key is not the host's
        wrong = {"authorization": "Bearer some-wrong-key-9999"}
        assert httpx.get(f"{cluster.url}/v1/episodes/{ep}", headers=wrong,
                         timeout=30).status_code == 401
        # another client's key: the episode does not exist for it
        with httpx.Client(base_url=cluster.url, timeout=60,
                          headers={"authorization": f"Bearer {OTHER}"}) as o:
            assert o.get("/v1/episodes").json()["data"] == []
            for method, path in (("GET", f"/v1/episodes/{ep}"),
                                 ("POST", f"/v1/episodes/{ep}/step"),
                                 ("GET", f"/v1/episodes/{ep}/lease"),
                                 ("DELETE", f"/v1/episodes/{ep}")):
                r = o.request(method, path, json=_shot(0))
                assert r.status_code == 404, (method, r.text)
        assert [e["episode_id"] for e in c.get("/v1/episodes").json()["data"]] == [ep]
        assert c.delete(f"/v1/episodes/{ep}").status_code == 204


def _steps_total(text: str) -> int:
    m = re.search(r'^kvagent_steps_total\{api="episode",status="ok"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else 0


def test_metrics_sum_over_hosts_and_errors_pass_through(cluster) -> None:
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=120) as c:
        before = _steps_total(c.get("/metrics").text)
        eps = [c.post("/v1/episodes", json={"instruction": "x"}).json()["episode_id"]
               for _ in range(2)]
        hosts = set()
        for ep in eps:
            for i in range(2):
                hosts.add(c.post(f"/v1/episodes/{ep}/step", json=_shot(i)).headers[HOST])
        assert len(hosts) == 2
        listed = {e["episode_id"]: e for e in c.get("/v1/episodes").json()["data"]}
        assert {listed[ep]["steps"] for ep in eps} == {2} and len(
            {listed[ep]["host"] for ep in eps}) == 2
        assert c.get(f"/v1/episodes/{eps[0]}").json()["episode_id"] == eps[0]
        text = c.get("/metrics").text
        assert _steps_total(text) - before == 4
        assert 'kvagent_cluster_hosts{state="alive"} 2' in text
        assert text.count("# TYPE kvagent_cluster_host_ledger_bytes gauge") == 1
        # a host's own error passes through in OpenAI's shape; the front door's too
        r = c.post(f"/v1/episodes/{eps[0]}/step", json={"screenshot": _b64(b"not an image")})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
        r = c.post("/v1/episodes/ep-unknown/step", json=_shot(0))
        assert r.status_code == 404 and r.json()["error"]["code"] == "episode_not_found"
        # chat completions go to a host and stick to it by conversation
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        a = c.post("/v1/chat/completions", json=chat)
        b = c.post("/v1/chat/completions", json=chat)
        assert a.headers[HOST] == b.headers[HOST] and a.status_code == b.status_code
        assert "error" in a.json() or "choices" in a.json()
        for ep in eps:
            c.delete(f"/v1/episodes/{ep}")


def test_outputs_equal_one_host(cluster, single) -> None:
    body = {"instruction": "Open the terminal.", "options": {"temperature": 1.0}}
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=120) as cc, \
            httpx.Client(base_url=single.url, timeout=120) as sc:
        eps = [_create(cc, body) for _ in range(4)]
        shots = [[_shot(3 * k + i, 320 + 80 * k) for i in range(3)] for k in range(4)]
        got: list[list[str]] = [[] for _ in eps]
        hosts = set()
        for i in range(3):  # the cluster's episodes interleaved, two per host
            for k, ep in enumerate(eps):
                r = cc.post(f"/v1/episodes/{ep}/step", json=shots[k][i])
                assert r.status_code == 200, r.text
                hosts.add(r.headers[HOST])
                got[k].append(r.json()["response"])
        assert len(hosts) == 2
        want: list[list[str]] = []
        for k, ep in enumerate(eps):  # the single host's one after the other
            ref = _create_as(sc, _number(ep), body)
            want.append([sc.post(f"/v1/episodes/{ref}/step", json=shots[k][i]).json()
                         ["response"] for i in range(3)])
            sc.delete(f"/v1/episodes/{ref}")
        assert got == want
        assert len({tuple(g) for g in got}) > 1  # sampled, different episodes: not constant
        for ep in eps:
            cc.delete(f"/v1/episodes/{ep}")


def test_parallel_osworld_run_over_the_cluster(cluster, ray_address, tmp_path) -> None:
    """Env workers (Ray actors, simulated DesktopEnv stand-ins) drain OSWorld examples
    through the front door into OSWorld's result layout; finished tasks are skipped."""
    import ray

    import osworld_runner_like
    from runtime.osworld import KvAgent
    from runtime.cluster.osworld_run import OsworldTask, result_dir, run_parallel
    from vmenv.osworld_fake import FakeDesktopEnv, simdesk_example

    names = ["open-terminal", "click-ok", "open-terminal", "click-ok"]
    tasks = [OsworldTask("simdesk", simdesk_example(n, example_id=f"{n}-{i}"))
             for i, n in enumerate(names)]
    run = functools.partial(
        run_parallel, result_root=tmp_path, model_name="kvagent", workers=2,
        make_env=functools.partial(FakeDesktopEnv, width=320, height=240),
        make_agent=functools.partial(KvAgent, server=cluster.url, api_key=KEY,
                                     screen_size=(320, 240),
                                     temperature=1.0),
        run_example=osworld_runner_like.run_single_example_like, max_steps=3)
    ray.init(address=ray_address, log_to_driver=False)
    try:
        ray.cloudpickle.register_pickle_by_value(osworld_runner_like)  # a test helper
        with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=60) as c:
            before = _steps_total(c.get("/metrics").text)
            outcomes = run(tasks)
            steps = _steps_total(c.get("/metrics").text) - before
            assert c.get("/health").json()["episodes"]["open"] == 0  # every episode ended
        assert sorted(o.task_id for o in outcomes) == sorted(t.task_id for t in tasks)
        assert all(o.error == "" and o.score in (0.0, 1.0) for o in outcomes), outcomes
        assert {o.worker for o in outcomes} == {0, 1}
        lines = 0
        for t in tasks:
            out = result_dir(tmp_path, "kvagent", "simdesk", t.task_id)
            assert (out / "result.txt").read_text().strip() in ("0.0", "1.0")
            traj = (out / "traj.jsonl").read_text().splitlines()
            assert 1 <= len(traj) <= 3 and all((out / json.loads(x)["screenshot_file"])
                                               .exists() for x in traj)
            lines += len(traj)
        assert steps == lines  # one served step per recorded action
        assert run(tasks) == []  # all finished: nothing to run
        (result_dir(tmp_path, "kvagent", "simdesk", tasks[1].task_id) / "result.txt").unlink()
        assert [o.task_id for o in run(tasks)] == [tasks[1].task_id]
    finally:
        ray.shutdown()


def test_a_killed_host_episode_continues_elsewhere_exactly(cluster, single) -> None:
    body = {"instruction": "Click OK.", "options": {"temperature": 1.0}}
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=120) as cc, \
            httpx.Client(base_url=single.url, timeout=120) as sc:
        eps = [_create(cc, body) for _ in range(2)]
        where = {}
        for ep in eps:
            for i in range(2):
                where[ep] = cc.post(f"/v1/episodes/{ep}/step", json=_shot(i)).headers[HOST]
        assert len(set(where.values())) == 2
        victim = eps[0]
        health = cc.get("/health").json()
        os.kill(health["hosts"][where[victim]]["pid"], signal.SIGKILL)
        # the next steps: no error, served by the surviving host
        got = []
        for i in range(2, 4):
            r = cc.post(f"/v1/episodes/{victim}/step", json=_shot(i))
            assert r.status_code == 200, r.text
            assert r.headers[HOST] == where[eps[1]]
            got.append(r.json()["response"])
        # ... exactly what an uninterrupted episode of the same number decides
        ref = _create_as(sc, _number(victim), body)
        want = [sc.post(f"/v1/episodes/{ref}/step", json=_shot(i)).json()["response"]
                for i in range(4)]
        assert got == want[2:]
        # the other episode was not disturbed
        r = cc.post(f"/v1/episodes/{eps[1]}/step", json=_shot(5))
        assert r.status_code == 200 and r.headers[HOST] == where[eps[1]]
        health = cc.get("/health").json()
        assert health["failovers"] == 1
        assert health["hosts"][where[victim]]["alive"] is False
        # a replacement host is started on the freed node
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            alive = [h for h in cc.get("/health").json()["hosts"].values() if h["alive"]]
            if len(alive) == 2:
                break
            time.sleep(0.5)
        assert len(alive) == 2
        for ep in eps:
            assert cc.delete(f"/v1/episodes/{ep}").status_code == 204
        sc.delete(f"/v1/episodes/{ref}")


def test_a_host_killed_during_a_step_the_step_is_answered_by_another(cluster, single) -> None:
    """The step in flight when its host dies is sent again after the episode is rebuilt:
    the client gets the answer the uninterrupted episode gives."""
    body = {"instruction": "Save the note.", "options": {"temperature": 1.0}}
    big = [{"screenshot": _b64(screenshot(20 + i, 960, 720))} for i in range(5)]
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=180) as cc, \
            httpx.Client(base_url=single.url, timeout=120) as sc:
        ep = _create(cc, body)
        r = cc.post(f"/v1/episodes/{ep}/step", json=big[0])
        assert r.status_code == 200, r.text
        host, seconds = r.headers[HOST], r.elapsed.total_seconds()
        pid = cc.get("/health").json()["hosts"][host]["pid"]
        answer: list[httpx.Response] = []

        def step(shot: dict[str, str]) -> None:
            with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=180) as c2:
                answer.append(c2.post(f"/v1/episodes/{ep}/step", json=shot))

        # a step answered before the kill (faster than the first one was) tests nothing:
        # the episode goes on on its host and the next step is tried
        for sent in range(2, len(big) + 1):
            answer.clear()
            thread = threading.Thread(target=step, args=(big[sent - 1],))
            thread.start()
            time.sleep(min(0.3, seconds / 4))  # well inside the step (a screenshot this
            if not answer:                     # size takes `seconds` to encode and prefill)
                os.kill(pid, signal.SIGKILL)
                break
            thread.join(timeout=170)
            assert answer[0].status_code == 200 and answer[0].headers[HOST] == host
        else:
            pytest.fail(f"every step was answered within {min(0.3, seconds / 4):.2f} s")
        thread.join(timeout=170)
        assert answer and answer[0].status_code == 200, answer and answer[0].text
        assert answer[0].headers[HOST] != host
        ref = _create_as(sc, _number(ep), body)
        want = [sc.post(f"/v1/episodes/{ref}/step", json=shot).json()["response"]
                for shot in big[:sent]]
        assert answer[0].json()["response"] == want[-1]
        assert cc.delete(f"/v1/episodes/{ep}").status_code == 204
        sc.delete(f"/v1/episodes/{ref}")
        deadline = time.monotonic() + 90  # the replacement host comes up
        while time.monotonic() < deadline and sum(
                h["alive"] for h in cc.get("/health").json()["hosts"].values()) < 2:
            time.sleep(0.5)


def test_every_host_killed_the_episode_waits_for_a_replacement(cluster, single) -> None:
    body = {"instruction": "Type hello.", "options": {"temperature": 1.0}}
    with httpx.Client(base_url=cluster.url, headers=AUTH, timeout=180) as cc, \
            httpx.Client(base_url=single.url, timeout=120) as sc:
        ep = _create(cc, body)
        for i in range(2):
            assert cc.post(f"/v1/episodes/{ep}/step", json=_shot(i)).status_code == 200
        before = cc.get("/health").json()
        for host in before["hosts"].values():
            if host["alive"]:
                os.kill(host["pid"], signal.SIGKILL)
        r = cc.post(f"/v1/episodes/{ep}/step", json=_shot(2))  # no error: it waited
        assert r.status_code == 200, r.text
        assert r.headers[HOST] not in before["hosts"]  # a replacement host served it
        ref = _create_as(sc, _number(ep), body)
        want = [sc.post(f"/v1/episodes/{ref}/step", json=_shot(i)).json()["response"]
                for i in range(3)]
        assert r.json()["response"] == want[2]
        assert cc.delete(f"/v1/episodes/{ep}").status_code == 204
        sc.delete(f"/v1/episodes/{ref}")
