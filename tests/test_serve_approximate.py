"""Approximate policies behind ``kvagent serve``, said out loud (issue 48 item 2).

The engine's own record first: a removal that shifts positions marks the survivors
(``Run.shifted``), so a sequence holding them is approximate whatever is fed after it, and
a trim below them makes it exact again.  Then real ``kvagent serve`` processes on loopback:
every chat answer (plain and streamed) and every episode step says whether it was decoded
from an approximate state, and ``/metrics`` counts those steps per policy; the default
(exact) server never marks one."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import httpx
import pytest

from cachepolicy.engine.checkpoint import holds_shift
from runtime.bench.chat_layout import sliding_window_messages
from runtime.bench.trajectory import screenshot
from serve_helpers import kvagent_serve

WINDOW = 2
SYSTEM = "You operate a desktop through screenshots."


def test_a_shifting_removal_marks_the_survivors_until_they_are_gone(engines) -> None:
    e = engines("llama")
    e.clear(0)
    first, second, third = (e.tokenize(t) for t in ("one two three", "four five", "six"))
    for piece in (first, second, third):
        e.prefill_tokens(0, piece, logits=False)
    end = e.seq_info(0).next_pos
    e.remove_range(0, end - len(third), end)  # a tail: nothing shifts, still exact
    assert not holds_shift(e.seq_info(0).history)
    e.prefill_tokens(0, third, logits=False)
    e.remove_range(0, len(first), len(first) + len(second))  # the middle: the tail shifts
    hist = e.seq_info(0).history
    assert [r.shifted for r in hist] == [False, True] and holds_shift(hist)
    e.prefill_tokens(0, e.tokenize("seven"), logits=False)  # fed after it: still marked
    assert holds_shift(e.seq_info(0).history)
    e.truncate(0, len(first))  # the shifted runs are gone: exact again
    assert not holds_shift(e.seq_info(0).history)
    e.clear(0)


def test_relocate_marks_its_steps_from_its_first_slide_on(engines) -> None:
    """In the step records (and so bench JSON): relocate's steps are exact while the window
    fills and approximate from its first slide on (the splicing policies, kamera and the
    token evictors, mark every step that splices); the exact policy's never."""
    import attrs

    from replay_helpers import AGENT
    from runtime.bench.arms import run_arms
    from runtime.bench.trajectory import trajectory

    window = 3
    slot, rel = run_arms(engines("llama"), ["terminal-slot", "relocate"],
                         trajectory(6, 128, 96),
                         attrs.evolve(AGENT, window=window, decode_tokens=4))
    assert [s["approximate"] for s in slot.steps] == [False] * 6
    assert [s["approximate"] for s in rel.steps] == [False] * window + [True] * 3
    # what relocate skips: the retained screenshots are not prefilled again
    assert all(r["prefill_tokens"] < s["prefill_tokens"]
               for r, s in zip(rel.steps[window:], slot.steps[window:]))


# ---------------------------------------------------------------- a real server on loopback


def _chat(c: httpx.Client, model: str, steps: int, *, stream_last: bool = False) -> list[dict]:
    """A sliding-window agent conversation (OSWorld's agents' shape: the oldest screenshot
    and answer dropped once ``WINDOW`` answers are kept); each answer's ``kvagent`` fields
    (the last one streamed if ``stream_last``: its closing chunk's)."""
    answers: list[str] = []
    out = []
    for t in range(steps):
        messages = sliding_window_messages(SYSTEM, "Open the terminal.",
                                           [screenshot(i, 160, 120) for i in range(t + 1)],
                                           answers, kept_answers=WINDOW)
        body = {"model": model, "messages": messages, "max_tokens": 4, "temperature": 0}
        if stream_last and t == steps - 1:
            with c.stream("POST", "/v1/chat/completions",
                          json={**body, "stream": True}) as r:
                assert r.status_code == 200
                events = [json.loads(line[6:]) for line in r.iter_lines()
                          if line.startswith("data: {")]
            fields = events[-1]["kvagent"]  # the closing chunk (only it carries them)
            assert all("kvagent" not in e for e in events[:-1])
            text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        else:
            r = c.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            fields, text = r.json()["kvagent"], r.json()["choices"][0]["message"]["content"]
        answers.append(text)
        out.append(fields)
    return out


def _episode(c: httpx.Client, steps: int, options: dict | None = None) -> tuple[dict, list]:
    r = c.post("/v1/episodes", json={"instruction": "Open the terminal.",
                                     **({"options": options} if options else {})})
    assert r.status_code == 201, r.text
    created, ep = r.json(), r.json()["episode_id"]
    out = []
    for i in range(steps):
        shot = base64.b64encode(screenshot(i, 160, 120)).decode()
        r = c.post(f"/v1/episodes/{ep}/step", json={"screenshot": shot})
        assert r.status_code == 200, r.text
        out.append(r.json())
    assert c.delete(f"/v1/episodes/{ep}").status_code == 204
    return created, out


def _approximate_counts(metrics: str) -> dict[tuple[str, str], int]:
    """``kvagent_steps_approximate_total`` samples: (api, policy) → count."""
    out = {}
    for line in metrics.splitlines():
        if line.startswith("kvagent_steps_approximate_total{"):
            labels, value = line[len("kvagent_steps_approximate_total{"):].split("} ")
            kv = dict(p.split("=") for p in labels.split(","))
            out[(kv["api"].strip('"'), kv["policy"].strip('"'))] = int(value)
    return out


def test_relocate_behind_serve_says_so_on_every_answer(forged, tmp_path) -> None:
    """``kvagent serve --policy relocate`` on an attention model: the chat API's terminal
    mode runs it — each answer names it, says ``approximate: false`` while the window fills
    (nothing was edited) and ``true`` from its first slide on, prefilling less than the exact
    server does for the same conversation — and ``/metrics`` counts those steps."""
    m = forged("llama")
    runs = {}
    for policy in ("terminal-slot", "relocate"):
        with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "2",
                           "--window", str(WINDOW), "--policy", policy) as s, \
                httpx.Client(base_url=s.url, timeout=120) as c:
            runs[policy] = _chat(c, s.model, 6, stream_last=True)
            if policy == "relocate":  # the splicing policies, per episode
                for name in ("kamera@own", "recency-evict@50%"):
                    _, runs[name] = _episode(c, 4, {"policy": name})
            runs[policy + " metrics"] = c.get("/metrics").text
    exact, rel = runs["terminal-slot"], runs["relocate"]
    assert {f["policy"] for f in exact} == {"terminal-slot"}
    assert {f["policy"] for f in rel} == {"relocate"}
    assert len({f["conversation_id"] for f in rel}) == 1  # one conversation, continued
    assert [f["approximate"] for f in exact] == [False] * 6
    assert [f["approximate"] for f in rel] == [False] * WINDOW + [True] * (6 - WINDOW)
    print("prefill (critical path) per step, exact / relocate:",
          [(e["prefill_tokens"], e["critical_path_prefill_tokens"], r["prefill_tokens"],
            r["critical_path_prefill_tokens"]) for e, r in zip(exact, rel)])
    # the approximate steps skip work: the retained screenshots are not prefilled again
    for e, r in zip(exact[WINDOW:], rel[WINDOW:]):
        assert r["prefill_tokens"] < e["prefill_tokens"]
    assert _approximate_counts(runs["terminal-slot metrics"]) == {}
    assert "# TYPE kvagent_steps_approximate_total counter" in runs["terminal-slot metrics"]
    for name in ("kamera", "recency-evict"):
        steps = runs[next(k for k in runs if k.startswith(name + "@"))]
        assert {st["policy"] for st in steps} == {name}
        assert all(st["approximate"] for st in steps[WINDOW:])  # from their first slide
    counts = _approximate_counts(runs["relocate metrics"])
    assert counts.pop(("chat", "relocate")) == 6 - WINDOW
    assert set(counts) == {("episode", "kamera"), ("episode", "recency-evict")}
    assert all(WINDOW <= n <= 4 for n in counts.values())
    assert 'kvagent_steps_total{api="chat",status="ok"} 6' in runs["relocate metrics"]


def test_tail_replay_behind_serve_and_per_episode(forged, tmp_path) -> None:
    """On a hybrid: ``--policy tail-replay@10%`` runs the chat API's terminal mode with that
    budget (its answers marked, counted under its name), an episode asking for an exact
    policy is never marked, and an episode's own ``tail-replay@…`` is marked and counted
    under the episode API."""
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "2",
                       "--window", str(WINDOW), "--policy", "tail-replay@10%") as s, \
            httpx.Client(base_url=s.url, timeout=120) as c:
        chat = _chat(c, s.model, 4)
        created, exact = _episode(c, 3, {"policy": "terminal-slot"})
        assert created["config"]["policy"] == "terminal-slot"
        assert not created["config"]["approximate"]
        created, tail = _episode(c, 3, {"policy": "tail-replay@50%"})
        assert created["config"]["policy"] == "tail-replay"
        assert created["config"]["replay_budget"] == "50%" and created["config"]["approximate"]
        metrics = c.get("/metrics").text
    assert {f["policy"] for f in chat} == {"tail-replay"}
    assert not chat[0]["approximate"] and all(f["approximate"] for f in chat[1:])
    assert [(s["policy"], s["approximate"]) for s in exact] == [("terminal-slot", False)] * 3
    assert [s["approximate"] for s in tail] == [s["info"]["approximate"] for s in tail]
    assert not tail[0]["approximate"] and all(s["approximate"] for s in tail[1:])
    assert _approximate_counts(metrics) == {("chat", "tail-replay"): 3,
                                            ("episode", "tail-replay"): 2}


def test_window_replay_behind_serve_prefills_less_and_says_so(forged, tmp_path) -> None:
    """On a hybrid under M-RoPE: ``--policy window-replay@10%`` runs the chat API's terminal
    mode — its answers named and, from the first step that moved a retained screenshot on,
    marked approximate, each prefilling less than the exact server does for the same
    conversation — and ``/metrics`` counts exactly the marked answers; an episode's own
    ``window-replay@100%`` (the whole window replayed: terminal-slot's work) is exact."""
    m = forged("qwen35")
    runs = {}
    for policy in ("terminal-slot", "window-replay@10%"):
        with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "2",
                           "--window", str(WINDOW), "--policy", policy) as s, \
                httpx.Client(base_url=s.url, timeout=120) as c:
            runs[policy] = _chat(c, s.model, 5)
            if policy != "terminal-slot":
                _, runs["whole"] = _episode(c, 4, {"policy": "window-replay@100%"})
            runs[policy + " metrics"] = c.get("/metrics").text
    exact, wr = runs["terminal-slot"], runs["window-replay@10%"]
    assert {f["policy"] for f in wr} == {"window-replay"}
    marked = [f["approximate"] for f in wr]
    print("approximate, prefill exact / window-replay:", marked,
          [(e["prefill_tokens"], w["prefill_tokens"]) for e, w in zip(exact, wr)])
    assert not marked[0] and all(marked[2:])  # step 0 has nothing retained to move
    for e, w, approx in zip(exact, wr, marked):
        if approx:  # a moved screenshot is not prefilled again
            assert w["prefill_tokens"] < e["prefill_tokens"]
        else:
            assert w["prefill_tokens"] == e["prefill_tokens"]
    assert [st["approximate"] for st in runs["whole"]] == [False] * 4
    assert _approximate_counts(runs["window-replay@10% metrics"]) == {
        ("chat", "window-replay"): sum(marked)}


def test_the_default_server_is_exact_and_marks_nothing(forged, tmp_path) -> None:
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "2",
                       "--window", str(WINDOW)) as s, \
            httpx.Client(base_url=s.url, timeout=120) as c:
        chat = _chat(c, s.model, 4, stream_last=True)
        created, steps = _episode(c, 2)
        metrics = c.get("/metrics").text
    # the chat API's terminal mode runs chrono-slot when no --policy is given (exact too)
    assert [(f["policy"], f["approximate"]) for f in chat] == [("chrono-slot", False)] * 4
    assert [(s["policy"], s["approximate"]) for s in steps] == [("terminal-slot", False)] * 2
    assert created["config"]["policy"] == "terminal-slot" and not created["config"]["approximate"]
    assert _approximate_counts(metrics) == {}


@pytest.mark.parametrize(("policy", "reason"), [
    ("relocate", "relocate"),  # a hybrid cannot shift positions: refused with the reason
    ("terminal-slot@5%", "is exact"), ("tail-replay@150%", "0..1"), ("lru", "unknown")])
def test_a_policy_the_model_cannot_run_is_refused_at_startup(forged, tmp_path, policy,
                                                             reason) -> None:
    m = forged("qwen35")
    res = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "serve", "--port", "0", "--threads", "1",
         "--ctx", "4096", "--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
         "--policy", policy], capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and reason in res.stderr, res.stderr[-2000:]
    assert "serve_ready" not in res.stdout


def test_the_episode_api_reads_the_policy_spelling(forged, tmp_path) -> None:
    """A bad spelling is a 400 naming the option, before any step; a policy the model
    cannot run is refused when the episode is created."""
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "1") as s, \
            httpx.Client(base_url=s.url, timeout=120) as c:
        for policy, words in (("terminal-slot@5%", "is exact"), ("tail-replay@x", "budget"),
                              ("kamera@32", "kamera"), ("relocate", "relocate"),
                              (7, "must be one of"), ("x" * 100, "must be one of")):
            r = c.post("/v1/episodes", json={"instruction": "x",
                                             "options": {"policy": policy}})
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_a_cluster_sums_its_hosts_approximate_steps() -> None:
    """The counter is the server's own and a cluster's front door sums it over hosts."""
    import attrs

    from runtime.cluster import metrics
    from runtime.metrics import StepMetrics
    from runtime.serve.prometheus import ServeMetrics

    step = attrs.evolve(StepMetrics.failed("e", 0, "x", critical_path_s=0.1), status="ok", policy="relocate")
    a, b = ServeMetrics(), ServeMetrics()
    a.step("chat", attrs.evolve(step, approximate=True))
    b.step("chat", attrs.evolve(step, approximate=True))
    b.step("episode", attrs.evolve(step, approximate=True, policy="tail-replay"))
    b.step("episode", step)  # exact: not counted
    text = metrics.exposition([(a, []), (b, [])], [])
    assert _approximate_counts(text) == {("chat", "relocate"): 2,
                                         ("episode", "tail-replay"): 1}
    assert 'kvagent_steps_total{api="episode",status="ok"} 2' in text
