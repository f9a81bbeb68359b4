"""A window that pins the episode's first screenshots (``pinned``, ``--pin-first``): which
screenshots it shows, who may lay it out, and — on the real engine, through the loop that
ships — that the exact policies stay bitwise with it, the prefetch still leaves the critical
path only the new screenshot, and the splicing policies keep the pinned screenshot's rows
(re-rotated at every slide) instead of prefilling it again.  (The runtime's sequence holding
exactly the pinned layout is checked step by step in ``test_train_prompts``.)"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cachepolicy.context_log import ContextLog, Segment, SegmentKind
from cachepolicy.errors import PolicyError
from cachepolicy.layouts import window_of
from cachepolicy.policies import make_policy
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import AGENT
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory
from runtime.cli import build_parser
from runtime.commands.options import agent_config
from runtime.config import AgentConfig

STEPS, WINDOW = 7, 3
PINNED = attrs.evolve(AGENT, window=WINDOW, pinned=1, decode_tokens=6)


def _log(n: int) -> ContextLog:
    shots = tuple(Segment(SegmentKind.SCREENSHOT, i, image_id=f"img{i}") for i in range(n))
    return ContextLog(shots, n) if n else ContextLog()


@given(n=st.integers(0, 12), window=st.integers(1, 6), data=st.data())
def test_a_pinned_window_keeps_the_first_and_the_newest(n: int, window: int, data) -> None:
    pinned = data.draw(st.integers(0, window - 1))
    shots = _log(n).screenshots
    shown = window_of(_log(n), window, pinned)
    assert len(shown) == min(n, window)
    assert list(shown) == sorted(shown, key=lambda s: s.step)  # step order, no repeats
    if n > window:
        assert shown[:pinned] == shots[:pinned]
        assert shown[pinned:] == shots[n - (window - pinned):]
    if n:
        assert shown[-1] == shots[-1]  # the newest is always shown
        # a prefetch lays out window - 1 with the same pins: the next window without its
        # new screenshot
        ahead = window_of(_log(n), window - 1, pinned) if window > 1 else ()
        assert window_of(_log(n + 1), window, pinned) == (*ahead, _log(n + 1).screenshots[-1])


def test_who_may_pin_and_how_many(engines) -> None:
    e = engines("llama")
    kit = SegmentFactory(e).kit
    info = model_info(e)
    for name in ("evict", "noevict"):
        with pytest.raises(PolicyError, match="cannot pin"):
            make_policy(name, info, kit, window=3, pinned=1)
    with pytest.raises(PolicyError, match="no room"):
        make_policy("terminal-slot", info, kit, window=3, pinned=3)
    assert make_policy("kamera", info, kit, window=3, pinned=2, option="m8").pinned == 2
    with pytest.raises(ValueError, match="cannot pin"):
        AgentConfig(policy="evict", pinned=1)
    with pytest.raises(ValueError, match="no room"):
        AgentConfig(window=2, pinned=2)
    parser = build_parser()
    args = parser.parse_args(["bench-eval", "--window", "2", "--pin-first", "2"])
    with pytest.raises(ValueError, match="--pin-first 2: .*no room"):
        agent_config(args)
    args = parser.parse_args(["bench-eval", "--pin-first", "1"])
    assert agent_config(args).pinned == 1


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS, 128, 96)


def _tokens(arm) -> list:
    return [s["output_tokens"] for s in arm.steps]


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_exact_policies_stay_bitwise_with_a_pinned_window(engines, traj, arch) -> None:
    """terminal-slot (± overlap) against terminal-scratch, the pinned first screenshot in
    every prompt: the same tokens at every step; under overlap the prefetch laid out the
    pinned window too (else the step would prefill the retained screenshots itself)."""
    arms = run_arms(engines(arch), ["terminal-scratch", "terminal-slot",
                                    "terminal-slot+overlap", "evict"], traj, PINNED)
    scratch, slot, over, evict = arms
    assert evict.refused and "cannot pin" in evict.refused
    assert _tokens(slot) == _tokens(over) == _tokens(scratch)
    factory = SegmentFactory(engines(arch))
    for t in range(1, STEPS):
        new_shot = factory.screenshot(t, traj.frames[t].screenshot).n_tokens
        s, ref = over.steps[t], scratch.steps[t]
        assert s["context_tokens"] == ref["context_tokens"]
        # the new screenshot with its label and the generation prompt, nothing retained
        assert s["critical_path_prefill_tokens"] <= new_shot + 40


def test_kamera_and_relocate_keep_the_pinned_screenshot_s_rows(engines, traj) -> None:
    """kamera with the first screenshot pinned: every step prefills only the new content
    and stores only the previous screenshot — the pinned one, placed once at step 1, is
    re-rotated at every later slide, never prefilled or stored again — and holds the exact
    policy's bytes; relocate keeps it where it is and removes only what leaves."""
    scratch, kam, rel = run_arms(engines("llama"), ["terminal-scratch", "kamera@m8",
                                                    "relocate"], traj,
                                 attrs.evolve(PINNED, replay_drift=True))
    factory = SegmentFactory(engines("llama"))
    for t in range(1, STEPS):
        s, r, ref = kam.steps[t], rel.steps[t], scratch.steps[t]
        prev = factory.screenshot(t - 1, traj.frames[t - 1].screenshot).n_tokens
        assert s["prefill_tokens"] == s["new_content_tokens"] == ref["new_content_tokens"]
        assert s["store_tokens"] == prev and s["stored_bytes"] == 0
        assert s["kv_bytes"] == ref["kv_bytes"] == r["kv_bytes"]
        assert s["approximate"] and s["drift_kl"] is not None
        assert r["prefill_tokens"] == r["new_content_tokens"] and r["drift_kl"] is not None


def test_the_remote_agent_sends_what_the_server_takes() -> None:
    """``KvAgent(server=URL, pinned=1)`` asks the server's episode for the pinned window:
    the client's options are the episode API's, and the server checks the value."""
    from runtime.osworld.remote import REMOTE_OPTIONS, remote_options
    from runtime.serve.http.episode_bodies import EPISODE_OPTIONS, episode_config
    from runtime.serve.http.errors import ApiError

    assert set(REMOTE_OPTIONS) == set(EPISODE_OPTIONS)
    sent = remote_options(AgentConfig(pinned=1))
    assert sent["pinned"] == 1
    assert episode_config(AgentConfig(), sent).pinned == 1
    for bad in (-1, 99, True, "1"):
        with pytest.raises(ApiError, match="options.pinned"):
            episode_config(AgentConfig(), {"pinned": bad})
    with pytest.raises(ApiError, match="no room"):
        episode_config(AgentConfig(), {"pinned": 2, "window": 2})


def test_tail_replay_lays_out_the_pinned_window(engines, traj) -> None:
    """The hybrid's approximate policy with the first screenshot pinned: the same context
    as the exact reference's every step, and under overlap its prefetch (the action, the
    retained screenshots, the replay) leaves the critical path only the new screenshot."""
    scratch, tail = run_arms(engines("qwen35"), ["terminal-scratch", "tail-replay+overlap"],
                             traj, PINNED)
    factory = SegmentFactory(engines("qwen35"))
    for t in range(1, STEPS):
        new_shot = factory.screenshot(t, traj.frames[t].screenshot).n_tokens
        s = tail.steps[t]
        assert s["context_tokens"] == scratch.steps[t]["context_tokens"]
        assert s["critical_path_prefill_tokens"] <= new_shot + 40


def test_a_server_s_default_pin_is_named_when_it_refuses() -> None:
    from runtime.serve.http.episode_bodies import episode_config
    from runtime.serve.http.errors import ApiError

    base = AgentConfig(pinned=1)
    with pytest.raises(ApiError, match="server pins the first 1 screenshot"):
        episode_config(base, {"policy": "evict"})
    assert episode_config(base, {"policy": "evict", "pinned": 0}).pinned == 0
    with pytest.raises(ValueError, match="whole number from 0, got True"):
        AgentConfig(pinned=True)
