"""The KV-splicing policies (kamera, random-evict, recency-evict) on the forged tiny llama
with vision, through the loop that ships (``run_arms``: scheduler, ledger and integrity
checks after every step): what they prefill, what they hold, their drift against the exact
prompt, and their refusal on hybrid models."""

from __future__ import annotations

import attrs
import pytest

from cachepolicy.errors import PolicyRefusedError
from cachepolicy.policies import POLICIES, make_policy
from cachepolicy.segments import SegmentFactory, model_info
from replay_helpers import AGENT
from runtime.bench.arms import ArmSpec, run_arms
from runtime.bench.trajectory import trajectory
from runtime.config import AgentConfig

STEPS, WINDOW = 8, 3


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS, 128, 96)


def _arms(engines, names, traj, arch="llama"):
    """The arms with their drift measured (``--replay-drift``: off by default, it prefills
    the exact prompt from scratch once more a step)."""
    return run_arms(engines(arch), names, traj, attrs.evolve(AGENT, window=WINDOW,
                                                              decode_tokens=6,
                                                              replay_drift=True))


def _tokens(steps):
    return [s["output_tokens"] for s in steps]


@pytest.mark.parametrize("name", ["kamera", "random-evict", "recency-evict"])
def test_splicing_policies_are_refused_on_hybrid_models(engines, name) -> None:
    e = engines("qwen35")
    with pytest.raises(PolicyRefusedError, match="does not support hybrid"):
        make_policy(name, model_info(e), SegmentFactory(e).kit)
    assert POLICIES[name].manifest.quality == "approximate"
    (res,) = _arms(engines, [name], trajectory(2, 64, 64), arch="qwen35")
    assert res.refused


def test_kamera_prefills_only_the_new_content_and_holds_the_exact_bytes(engines,
                                                                      traj) -> None:
    """Each screenshot is stored once (its canonical forward one step after it was new) and
    placed in the same plan; from then on its store-written rows are re-rotated where the
    sequence holds them, so nothing stays in the store between steps."""
    scratch, kam, own = _arms(engines, ["terminal-scratch", "kamera@m8", "kamera@own"], traj)
    factory = SegmentFactory(engines("llama"))
    gen = len(factory.kit.generation_prompt)
    for t in range(1, STEPS):
        s, ref = kam.steps[t], scratch.steps[t]
        new_shot = factory.screenshot(t, traj.frames[t].screenshot).n_tokens
        # the new action, the new screenshot (with its label) and the generation prompt
        assert s["prefill_tokens"] == s["new_content_tokens"] == ref["new_content_tokens"]
        assert s["prefill_tokens"] <= new_shot + gen + 40
        assert s["context_tokens"] == ref["context_tokens"]
        assert s["approximate"] and s["drift_kl"] is not None and s["drift_kl"] >= 0.0
        # the canonical forward of the previous screenshot (after the head, whose rows are
        # copied), from its rows in context the sequence still holds
        prev_shot = factory.screenshot(t - 1, traj.frames[t - 1].screenshot).n_tokens
        assert s["store_tokens"] == s["critical_store_tokens"] == prev_shot
        assert s["stored_bytes"] == 0 and s["splice_s"] > 0.0
        assert s["kv_bytes"] == ref["kv_bytes"]  # the window's cells, no store beside them
    assert kam.steps[0]["store_tokens"] == 0  # the first screenshot is stored at step 1
    assert kam.steps[0]["drift_kl"] < 1e-6  # step 0 is a full prefill of the same prompt
    # the placed rows are the store's (canonical + patch), not the screenshots' own KV
    assert [s["drift_kl"] for s in kam.steps[2:]] != [s["drift_kl"] for s in own.steps[2:]]


def test_kamera_under_overlap_stores_in_the_prefetch_and_computes_the_same(engines,
                                                                           traj) -> None:
    """Under overlap the previous screenshot's canonical forward runs in the prefetch (while
    the VM acts): the critical path prefills only the new content and stores nothing, and
    the actions and drift are plain kamera's — overlap moves the work, not the numbers."""
    plain, over = _arms(engines, ["kamera@m8", "kamera@m8+overlap"], traj)
    factory = SegmentFactory(engines("llama"))
    assert _tokens(over.steps) == _tokens(plain.steps)
    assert [s["drift_kl"] for s in over.steps] == [s["drift_kl"] for s in plain.steps]
    for t in range(1, STEPS):
        s = over.steps[t]
        prev_shot = factory.screenshot(t - 1, traj.frames[t - 1].screenshot).n_tokens
        assert s["critical_store_tokens"] == 0 and s["store_tokens"] == prev_shot
        assert s["critical_path_prefill_tokens"] < plain.steps[t]["prefill_tokens"]
        assert s["stored_bytes"] == plain.steps[t]["stored_bytes"]


def test_kamera_full_rank_is_closer_to_exact_than_rank_zero(engines, traj) -> None:
    full, zero = _arms(engines, ["kamera@full", "kamera@m0"], traj)
    kl_full = sum(s["drift_kl"] for s in full.steps[1:])
    kl_zero = sum(s["drift_kl"] for s in zero.steps[1:])
    assert kl_full < kl_zero


@pytest.mark.parametrize("name", ["random-evict", "recency-evict"])
def test_token_evictors_keep_their_budget(engines, traj, name) -> None:
    whole, half = _arms(engines, [f"{name}@100%", f"{name}@50%"], traj)
    scratch, = _arms(engines, ["terminal-scratch"], traj)
    for t in range(1, STEPS):
        assert whole.steps[t]["prefill_tokens"] == half.steps[t]["prefill_tokens"]
        assert half.steps[t]["prefill_tokens"] < scratch.steps[t]["prefill_tokens"]
    for t in range(WINDOW, STEPS):  # half the retained screenshots' image cells are gone
        assert half.steps[t]["kv_bytes"] < whole.steps[t]["kv_bytes"]
        assert whole.steps[t]["kv_bytes"] == scratch.steps[t]["kv_bytes"]


def test_arm_options_parse_and_reach_the_policy() -> None:
    assert ArmSpec.parse("kamera@m32").option == "m32"
    assert ArmSpec.parse("random-evict@25%+overlap") == ArmSpec("random-evict", True,
                                                                option="25%")
    agent = ArmSpec.parse("recency-evict@50%").agent(AgentConfig())
    assert agent.policy == "recency-evict" and agent.policy_option == "50%"
    for bad in ("kamera@32", "random-evict@0%", "terminal-slot@m8"):
        with pytest.raises(ValueError):
            ArmSpec.parse(bad)
    with pytest.raises(ValueError, match="takes no option"):
        AgentConfig(policy="terminal-slot", policy_option="m8")


def test_kamera_own_is_the_slide_alone(engines, traj) -> None:
    """``kamera@own``: survivors keep their own KV, re-rotated; no store, the exact policy's
    bytes; the same computation as a token evictor that keeps every token."""
    scratch, own, whole = _arms(engines, ["terminal-scratch", "kamera@own",
                                          "random-evict@100%"], traj)
    assert [s["drift_kl"] for s in own.steps] == [s["drift_kl"] for s in whole.steps]
    assert _tokens(own.steps) == _tokens(whole.steps)
    for s, ref in zip(own.steps[1:], scratch.steps[1:]):
        assert s["stored_bytes"] == 0 and s["store_tokens"] == 0
        assert s["kv_bytes"] == ref["kv_bytes"]
        assert s["prefill_tokens"] == ref["new_content_tokens"]


def test_the_store_is_freed_with_its_episode(engines, traj) -> None:
    """The store's entries live until placed, at most as long as the episode's published
    state: after the run (the ledger's integrity check ran at every idle point) none is
    left."""
    import gc

    (res,) = _arms(engines, ["kamera@m8"], traj)
    assert sum(s["store_tokens"] for s in res.steps) > 0  # entries were made (and placed)
    gc.collect()
    mem = engines("llama").memory()
    assert (mem.live_stored_kv, mem.live_stored_kv_bytes) == (0, 0)


async def test_a_stopped_prefetch_leaves_its_entry_for_the_next_step(engines) -> None:
    """A kamera prefetch makes the previous screenshot's entry at its start; stopped by
    critical work before it places it, it publishes the entry (counted by the ledger), and
    the episode's next step places it from there — no canonical forward on the critical
    path — after which nothing is held beside the window."""
    from preempt_helpers import PreemptHook, warmed_pair
    from replay_helpers import OPTIONS
    from scheduler.ledger import MemoryLedger
    from scheduler.scheduler import Scheduler

    engine = engines("llama")
    factory = SegmentFactory(engine)
    traj_ = trajectory(4, 96, 64)
    ledger = MemoryLedger(1 << 30)
    hook = PreemptHook()

    def kamera():
        return make_policy("kamera", model_info(engine), factory.kit, window=WINDOW,
                           decode_tokens=4, option="m8")

    async with Scheduler(engine, ledger, factory, options=OPTIONS, fault=hook,
                         spare_sequence=True) as sched:
        a, b = await warmed_pair(sched, factory, traj_, kamera)
        assert a.state.stored == () and a.state.placed  # step 2 placed step 1's screenshot
        pre, _ = await hook.stop_prefetch(sched, factory, traj_, a, b)
        assert pre is not None and pre.preempted and pre.store_tokens > 0
        (entry,) = a.state.stored  # step 2's screenshot: stored, not yet placed
        label, nbytes = entry.label, entry.nbytes
        del entry  # (the engine counts live entries: the integrity checks compare)
        assert label not in a.state.placed
        assert ledger.held_by("a") >= nbytes > 0
        sched.check_integrity()
        rec = await sched.step(a, lambda: (factory.screenshot(3, traj_.frames[3].screenshot),))
        assert rec.status == "ok" and rec.store_tokens == 0
        assert a.state.stored == () and label in a.state.placed
        sched.check_integrity()
        for ep in (a, b):
            await sched.close_episode(ep)
    assert ledger.snapshot().held == 0


async def test_kamera_is_refused_where_no_spare_sequence_is_kept(engines) -> None:
    """kamera's canonical forwards run on the scheduler's spare sequence: a scheduler (or an
    episode pool: ``kvagent serve``, ``KvAgent``) without one refuses it when the episode
    opens — a clear error, a 400 through the HTTP API — instead of failing its second step;
    relocate (drift measured there, if any) still opens."""
    from runtime.pool import EpisodePool
    from runtime.serve.http.errors import api_error
    from scheduler.errors import NoSpareSequenceError
    from scheduler.ledger import MemoryLedger
    from scheduler.scheduler import Scheduler

    engine = engines("llama")
    factory = SegmentFactory(engine)
    kit, info = factory.kit, model_info(engine)
    kamera = make_policy("kamera", info, kit, window=WINDOW, option="m8")
    assert kamera.requires_spare_sequence()
    own = make_policy("kamera", info, kit, window=WINDOW, option="own")
    assert not own.requires_spare_sequence()
    async with Scheduler(engine, MemoryLedger(1 << 30), factory) as sched:
        with pytest.raises(NoSpareSequenceError, match="needs a spare sequence"):
            sched.open_episode("a", kamera)
        ep = sched.open_episode("b", make_policy("relocate", info, kit, window=WINDOW))
        await sched.close_episode(ep)
    pool = EpisodePool(factory, MemoryLedger(1 << 30), max_episodes=1)
    with pytest.raises(PolicyRefusedError) as refused:
        pool.check_policy(kamera)
    error = api_error(refused.value)
    assert error.status == 400 and "spare sequence" in error.body()["error"]["message"]


def test_kvagent_serve_refuses_kamera_at_startup_in_one_line(forged) -> None:
    """``kvagent serve --policy kamera``: on an attention model the host keeps no spare
    sequence, on a hybrid the model refuses the policy — either way one clear line and exit
    status 2 before serving, no traceback."""
    import subprocess
    import sys

    for arch, says in (("llama", "needs a spare sequence"),
                       ("qwen35", "does not support hybrid models")):
        m = forged(arch)
        res = subprocess.run(
            [sys.executable, "-m", "runtime.cli", "serve", "--port", "0", "--threads", "1",
             "--ctx", "2048", "--model", str(m.model_path), "--mmproj", str(m.mmproj_path),
             "--policy", "kamera"], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr[-2000:]
        assert f"kvagent serve: error: policy 'kamera' {says}" in res.stderr
        assert "Traceback" not in res.stderr, res.stderr[-2000:]
