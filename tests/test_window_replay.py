"""``window-replay`` on the forged qwen35 (hybrid, IMROPE) with screenshots, through the
step transaction that ships: a budget covering the retained window is terminal-slot bitwise
(logits compared at every step, not only tokens); a short one prefills less, keeps the
retained screenshots' attention KV (moved and re-rotated), is marked approximate at every
step it placed anything, and still gives finite logits that differ from the exact ones."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.kv_access import window_problem
from cachepolicy.engine.model_facts import read_facts
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.forge import forge_cached
from cachepolicy.executor import kl_divergence
from cachepolicy.policies import make_policy
from cachepolicy.policies.window_replay import WindowReplayPolicy
from cachepolicy.segments import SegmentFactory, model_info
from cachepolicy.tail import ReplayBudget
from replay_helpers import AGENT, check_accounts, step_segments
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory
from runtime.config import PolicyChoice
from runtime.model_check import policy_fits
from scheduler.ledger import MemoryLedger
from scheduler.transaction import (
    EpisodeCache, StepOptions, admit, begin, commit_finish, commit_prefill,
)

STEPS, WINDOW = 7, 3


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS, 128, 96)


@pytest.fixture(scope="module")
def q4_engine(tmp_path_factory):
    """The forged qwen35 of size XS quantized Q4_K_M (a user's file type), with vision."""
    m = forge_cached("qwen35", "XS", vision=True, quant="q4_k_m",
                     cache_dir=tmp_path_factory.mktemp("q4"))
    engine = Engine(m.model_path, m.mmproj_path,
                    EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=32, n_threads=1))
    yield engine
    engine.close()


def _episode(engine, factory, traj, policy: str, option: str | None, seq: int = 0,
             pinned: int = 0):
    """Run the trajectory through ``policy``; per step (logits, prefill tokens,
    approximate, the keys of the pieces placed instead of prefilled)."""
    kw = {"option": option} if option is not None else {}
    pol = make_policy(policy, model_info(engine), factory.kit, window=WINDOW,
                      decode_tokens=4, pinned=pinned, **kw)
    engine.clear(seq)
    ep = EpisodeCache("w", seq, pol)
    ledger = MemoryLedger(1 << 30)
    out = []
    try:
        for i in range(STEPS):
            txn = begin(engine, ep, step_segments(factory, traj, i))
            admit(txn, ledger)
            placed = (tuple(u.label for u in txn.plan.splice.place)
                      if txn.plan.splice is not None else ())
            exe = commit_prefill(engine, txn, ledger)
            logits = exe.logits.copy()
            commit_finish(engine, txn, ledger, StepOptions(), exe)
            check_accounts(engine, ep, ledger)
            out.append((logits, exe.prefill_tokens, exe.approximate, placed))
    finally:
        engine.clear(seq)
    return out


@pytest.mark.parametrize("quant", ["f16", "q4_k_m"])
def test_a_whole_window_budget_is_terminal_slot_bitwise(engines, q4_engine, traj,
                                                        quant) -> None:
    e = engines("qwen35") if quant == "f16" else q4_engine
    factory = SegmentFactory(e)
    slot = _episode(e, factory, traj, "terminal-slot", None)
    whole = _episode(e, factory, traj, "window-replay", "100%")
    for step, (a, b) in enumerate(zip(whole, slot)):
        assert np.array_equal(a[0], b[0]), f"step {step}: logits differ"
        assert a[1:] == b[1:] and a[3] == () and not a[2]
    # the check can fail: a budget of nothing changes the logits once a window slides
    none = _episode(e, factory, traj, "window-replay", "0")
    assert not all(np.array_equal(a[0], b[0]) for a, b in zip(none, slot))


@pytest.mark.parametrize("budget", ["0", "10%", "25%"])
def test_a_short_budget_prefills_less_and_is_marked(engines, traj, budget) -> None:
    e = engines("qwen35")
    factory = SegmentFactory(e)
    slot = _episode(e, factory, traj, "terminal-slot", None)
    short = _episode(e, factory, traj, "window-replay", budget)
    slid = 0
    for step, ((logits, prefill, approx, placed), ref) in enumerate(zip(short, slot)):
        assert np.isfinite(logits).all()
        if placed:
            slid += 1
            assert approx and prefill < ref[1], (step, prefill, ref[1])
            assert kl_divergence(ref[0], logits) > 0.0
        else:
            assert not approx and prefill == ref[1]
    assert slid >= STEPS - 3  # every step whose window holds a retained screenshot


def test_a_pinned_screenshot_is_kept_beside_the_newest_retained(engines, traj) -> None:
    """With the first screenshot pinned, the window's kept pieces come in two runs, each
    moved by its own shift (the pinned one by the new line, the retained one also by the
    screenshot that left between them): both images are placed at budget 0."""
    e = engines("qwen35")
    factory = SegmentFactory(e)
    slot = _episode(e, factory, traj, "terminal-slot", None, pinned=1)
    short = _episode(e, factory, traj, "window-replay", "0", pinned=1)
    first = factory.screenshot(0, traj.frames[0].screenshot).key
    for step in range(3, STEPS):
        logits, prefill, approx, placed = short[step]
        newest_kept = factory.screenshot(step - 1, traj.frames[step - 1].screenshot).key
        assert {first, newest_kept} <= set(placed), (step, placed)
        assert approx and prefill < slot[step][1] and np.isfinite(logits).all()


def test_with_overlap_the_placing_moves_into_the_prefetch(engines) -> None:
    """Under overlap the prefetch places the kept screenshots and replays the tail; the step
    continues from it, so its critical path is terminal-slot+overlap's (the new screenshot
    and the generation prompt).  At 100% the next-token logits equal the exact prompt's from
    scratch at every step (KL exactly 0); at 10% the steps prefill less in all and are
    marked."""
    traj = trajectory(STEPS, 160, 120)
    agent = attrs.evolve(AGENT, window=WINDOW, decode_tokens=6, replay_drift=True)
    slot, whole, short = run_arms(engines("qwen35"), ["terminal-slot+overlap",
                                                      "window-replay@100%+overlap",
                                                      "window-replay@10%+overlap"],
                                  traj, agent)
    assert whole.output_sha256 == slot.output_sha256
    assert all(s.drift_kl == 0.0 and not s.approximate for s in whole.episode.steps)
    for s, ref in zip(short.episode.steps[1:], slot.episode.steps[1:]):
        assert s.critical_path_prefill_tokens == ref.critical_path_prefill_tokens
        assert s.prefill_tokens < ref.prefill_tokens and s.approximate
        assert s.drift_kl is not None and s.drift_kl > 0.0


def test_the_budget_is_tail_replays_and_the_policy_is_refused_elsewhere(engines) -> None:
    assert WindowReplayPolicy.parse_option("256") == ReplayBudget(tokens=256)
    assert WindowReplayPolicy.parse_option("10%") == ReplayBudget(fraction=0.10)
    with pytest.raises(ValueError):
        WindowReplayPolicy.parse_option("ten")
    assert PolicyChoice.parse("window-replay@25%").option == "25%"
    llama = engines("llama")
    with pytest.raises(PolicyRefusedError):
        make_policy("window-replay", model_info(llama), SegmentFactory(llama).kit)
    assert WindowReplayPolicy.manifest.quality == "approximate"
    qwen = engines("qwen35")
    policy = make_policy("window-replay", model_info(qwen), SegmentFactory(qwen).kit)
    assert policy.budget == ReplayBudget(fraction=0.10)  # tail replay's default
    assert policy.with_tail(ReplayBudget(tokens=8)) is None  # no replay-rung twin


def test_check_model_says_where_it_applies(engines, forged) -> None:
    """The file's reading (check-model) and the loaded engine's agree: qwen35 can, llama
    (attention-only) cannot, each with its reason."""
    for arch, applies in (("qwen35", True), ("llama", False)):
        m = forged(arch)
        facts = read_facts(m.model_path, m.mmproj_path)
        fit = {f.name: f for f in policy_fits(facts)}["window-replay"]
        assert fit.applies is applies and fit.quality == "approximate"
        assert window_problem(facts.kind, facts.rope) == engines(arch).window_problem
        assert (engines(arch).window_problem is None) is applies
