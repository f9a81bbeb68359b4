"""Cache policies on forged tiny models with vision: exactness, bounded prefill, refusal."""

from __future__ import annotations

import attrs
import pytest

from cachepolicy.policies import POLICIES, make_policy
from cachepolicy.errors import PolicyError, PolicyRefusedError
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import (
    AGENT, check_accounts, past_step, run_prefetch, run_step, step_segments,
)
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory

STEPS, WINDOW = 12, 3


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS, 128, 96)


def _arm(engines, arch, name, traj, **decode):
    (res,) = run_arms(engines(arch), [name], traj,
                      attrs.evolve(AGENT, window=WINDOW, decode_tokens=6, **decode))
    return res


#: Sampled, not greedy: greedy decoding on a forged model writes one token whatever the
#: prompt, so equal greedy tokens would say nothing about the prompt's state.
SAMPLED = {"temperature": 1.0, "seed": 0}


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_terminal_slot_equals_terminal_scratch_token_for_token(engines, arch, traj) -> None:
    slot = _arm(engines, arch, "terminal-slot", traj, **SAMPLED)
    scratch = _arm(engines, arch, "terminal-scratch", traj, **SAMPLED)
    assert [s["output_tokens"] for s in slot.steps] == [s["output_tokens"] for s in scratch.steps]
    assert slot.output_sha256 == scratch.output_sha256
    # the comparison can fail: the sampled tokens vary, and another prompt (evict's
    # interleaved layout) gives other tokens from the same seed
    assert len({t for s in scratch.steps for t in s["output_tokens"]}) > 3
    assert _arm(engines, arch, "evict", traj, **SAMPLED).output_sha256 != scratch.output_sha256
    assert all(len(s["output_tokens"]) == 6 for s in slot.steps)
    # and terminal-slot really reused: from step 1 on it never started from scratch
    assert {s["start"] for s in slot.steps[1:]} == ({"truncate"} if arch == "qwen35" else {"trim"})


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_slot_prefill_is_window_plus_delta_while_scratch_grows(engines, arch, traj) -> None:
    e = engines(arch)
    factory = SegmentFactory(e)
    slot = _arm(engines, arch, "terminal-slot", traj)
    scratch = _arm(engines, arch, "terminal-scratch", traj)
    gen = len(factory.kit.generation_prompt)
    for t in range(WINDOW, STEPS):
        window = sum(factory.screenshot(i, traj.frames[i].screenshot).n_tokens for i in range(t - WINDOW + 1, t + 1))
        delta = len(past_step(factory, traj, t - 1).tokens)
        assert slot.steps[t]["prefill_tokens"] == window + delta + gen
        assert slot.steps[t]["context_tokens"] == scratch.steps[t]["context_tokens"]
    scratch_prefill = [s["prefill_tokens"] for s in scratch.steps]
    assert all(b > a for a, b in zip(scratch_prefill, scratch_prefill[1:]))
    assert scratch_prefill[-1] > 2 * slot.steps[-1]["prefill_tokens"]
    if arch == "qwen35":  # the anchor is a PARTIAL_ONLY checkpoint: the recurrent state only
        assert {s["checkpoint_bytes"] for s in slot.steps} == {e.recurrent_bytes_per_seq}
    else:  # attention-only: a plain trim, no checkpoint at all
        assert {s["checkpoint_bytes"] for s in slot.steps} == {0}


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_noevict_reuses_all_but_the_new_content(engines, arch, traj) -> None:
    res = _arm(engines, arch, "noevict", traj)
    kit = SegmentFactory(engines(arch)).kit
    wrappers = len(kit.generation_prompt) + len(kit.turn_break)  # the new assistant turn
    for s in res.steps[1:]:
        assert s["prefill_tokens"] == s["new_content_tokens"] + wrappers
        assert s["reused_tokens"] + s["prefill_tokens"] == s["context_tokens"]
    contexts = [s["context_tokens"] for s in res.steps]
    assert all(b > a for a, b in zip(contexts, contexts[1:]))  # unbounded growth


def test_evict_reprefills_everything(engines, traj) -> None:
    res = _arm(engines, "qwen35", "evict", traj)
    assert all(s["reused_tokens"] == 0 and s["start"] == "clear" for s in res.steps)
    assert all(s["prefill_tokens"] == s["context_tokens"] for s in res.steps)


def test_relocate_is_refused_on_hybrid_models(engines) -> None:
    e = engines("qwen35")
    with pytest.raises(PolicyRefusedError, match="does not support hybrid"):
        make_policy("relocate", model_info(e), SegmentFactory(e).kit)
    assert _arm(engines, "qwen35", "relocate", trajectory(2, 64, 64)).refused


def test_relocate_reports_drift_on_attention_models(engines, traj) -> None:
    res = _arm(engines, "llama", "relocate", traj, replay_drift=True)
    assert res.refused is None
    sliding = res.steps[WINDOW:]
    assert all(s["drift_kl"] is not None and s["drift_kl"] >= 0.0 for s in sliding)
    assert all(isinstance(s["drift_top1_agree"], bool) for s in sliding)
    # unasked, no step pays the from-scratch reference prefill (a server's default)
    plain = _arm(engines, "llama", "relocate", traj)
    assert all(s["drift_kl"] is None for s in plain.steps)
    assert [s["prefill_tokens"] for s in plain.steps] == [s["prefill_tokens"] for s in res.steps]
    # it prefills only the new content: far less than a full re-prefill of the same context
    assert all(s["prefill_tokens"] < s["context_tokens"] / 2 for s in sliding)
    assert POLICIES["relocate"].manifest.quality == "approximate"


def test_unknown_policy_lists_the_known_ones(engines) -> None:
    e = engines("llama")
    with pytest.raises(PolicyError, match="known: chrono-slot, evict, faithful, faithful-tail, kamera, noevict, noevict-tail, random-evict, recency-evict, relocate"):
        make_policy("lru", model_info(e), SegmentFactory(e).kit)


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_terminal_slot_prefetch_leaves_only_the_new_screenshot(engines, arch, traj) -> None:
    """Prefetch (action text + retained screenshots) then the critical step gives the same
    outputs as plain terminal-slot, and the critical step prefills only the new screenshot,
    its label and the generation prompt."""
    from scheduler.ledger import MemoryLedger
    from scheduler.transaction import EpisodeCache, StepOptions

    e = engines(arch)
    factory = SegmentFactory(e)
    reference = _arm(engines, arch, "terminal-slot", traj)
    policy = make_policy("terminal-slot", model_info(e), factory.kit, window=WINDOW,
                         decode_tokens=6)
    e.clear(0)
    ep = EpisodeCache("overlap", 0, policy)
    ledger = MemoryLedger(1 << 30)
    opts = StepOptions(decode_tokens=6)
    outputs, critical = [], []
    for i in range(STEPS):
        if i == 0:
            segs = step_segments(factory, traj, 0)[:-1]
        else:
            pre = run_prefetch(e, ep, (past_step(factory, traj, i - 1),),
                               ledger)
            assert pre.planned and pre.prefill_tokens > 0
            segs = ()
        shot = factory.screenshot(i, traj.frames[i].screenshot)
        rec = run_step(e, ep, segs + (shot,), ledger, opts)
        check_accounts(e, ep, ledger)
        outputs.append(list(rec.output_tokens))
        critical.append((rec.prefill_tokens, shot.n_tokens))
    assert outputs == [s["output_tokens"] for s in reference.steps]
    gen = len(factory.kit.generation_prompt)
    for t in range(1, STEPS):
        prefilled, shot_tokens = critical[t]
        prev_outro = len(factory.screenshot(t - 1, traj.frames[t - 1].screenshot).outro)
        assert prefilled == shot_tokens + prev_outro + gen  # nothing else on the critical path


@pytest.mark.parametrize("policy", ["terminal-slot", "terminal-scratch", "evict", "noevict"])
def test_plan_names_the_visible_segments_in_order(engines, traj, policy) -> None:
    from cachepolicy.context_log import ContextLog
    from cachepolicy.plan import CacheState, CacheView
    from replay_helpers import step_segments

    e = engines("qwen35")
    factory = SegmentFactory(e)
    log = ContextLog()
    for i in range(6):
        log = log.append(*step_segments(factory, traj, i))
    plan = make_policy(policy, model_info(e), factory.kit, window=WINDOW).select(
        log, CacheView(CacheState(), e.seq_info(0)))
    keys = [s.key for s in plan.visible]
    shots = [k for k in keys if k.startswith("screenshot@")]
    expected = [f"screenshot@{i}" for i in (range(6) if policy == "noevict" else range(3, 6))]
    assert shots == expected
    assert keys[:2] == ["preamble@-1", "instruction@-1"]
    assert [k for k in keys if k.startswith("action@")] == [f"action@{i}" for i in range(5)]
    if policy.startswith("terminal"):  # the text history comes before the screenshot region
        assert keys.index("action@4") < keys.index("screenshot@3")
