"""kamera's recall by content (``kamera@m8+recall<N>``) on the forged tiny llama with vision,
through the loop that ships (``run_arms``: scheduler, ledger and integrity checks after every
step): a new screenshot whose pixels equal a stored one's — the screen came back to a state
that left the window, or did not change — has its image placed from the store instead of
prefilled; the store keeps at most N entries, and nothing once the episode ends."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from cachepolicy.engine.kv_blob import KvRows
from cachepolicy.engine.kv_patch import StoredKv, make_patch, place
from cachepolicy.segments import SegmentFactory
from replay_helpers import AGENT
from runtime.bench.arms import ArmSpec, run_arms
from runtime.bench.trajectory import INSTRUCTION, screenshot
from vmenv.trajectory import Trajectory

WINDOW, W, H = 3, 128, 96
#: the screen each step shows: step 5 comes back to step 1's screen (which left the K = 3
#: window at step 4), step 6 does not change, step 7 is new
SHOWN = (0, 1, 2, 3, 4, 1, 1, 7)


@pytest.fixture(scope="module")
def revisits() -> Trajectory:
    pairs = [(screenshot(s, W, H), f"click({10 + i}, 20)") for i, s in enumerate(SHOWN)]
    return Trajectory.from_pairs(pairs + [(screenshot(99, W, H), None)],
                                 instruction=INSTRUCTION)


def _arms(engines, names, traj):
    out = run_arms(engines("llama"), names, traj,
                   attrs.evolve(AGENT, window=WINDOW, decode_tokens=6, replay_drift=True))
    for res in out:  # an episode that ends in error (an integrity check at close) fails
        assert res.episode is not None and res.episode.status != "error", res.episode
    return out


def test_a_revisited_screen_is_placed_from_the_store(engines, revisits) -> None:
    scratch, plain, recall = _arms(engines, ["terminal-scratch", "kamera@m8",
                                             "kamera@m8+recall4"], revisits)
    image_cells, _ = engines("llama").image_tokens(screenshot(1, W, H))
    for t, shown in enumerate(SHOWN):
        s, p, ref = recall.steps[t], plain.steps[t], scratch.steps[t]
        assert p["prefill_tokens"] == ref["new_content_tokens"]
        assert s["context_tokens"] == ref["context_tokens"] and (s["approximate"] or t == 0)
        seen_before = shown in SHOWN[:t]
        if seen_before:  # its image came from the store: only its label and the rest
            assert s["prefill_tokens"] == ref["new_content_tokens"] - image_cells
        else:
            assert s["prefill_tokens"] == ref["new_content_tokens"]
        assert 0.0 <= s["drift_kl"] < 5.0
    # the store keeps what a later step may recall; plain kamera keeps nothing between steps
    assert all(p["stored_bytes"] == 0 for p in plain.steps)
    assert recall.steps[-1]["stored_bytes"] > 0


def test_recall_keeps_only_the_entries_last_used(engines, revisits) -> None:
    """With one entry the store holds the newest screenshot's alone: step 5's screen (step
    1's) is gone by then and is prefilled; step 6 (unchanged) is recalled from step 5's."""
    one, four = _arms(engines, ["kamera@m8+recall1", "kamera@m8+recall4"], revisits)
    assert one.steps[5]["prefill_tokens"] > four.steps[5]["prefill_tokens"]
    assert one.steps[6]["prefill_tokens"] == four.steps[6]["prefill_tokens"]
    entry = max(s["stored_bytes"] for s in one.steps)  # one entry (they differ by a digit)
    for a, b in zip(one.steps[1:], four.steps[1:]):
        assert 0 < a["stored_bytes"] <= b["stored_bytes"] <= 4 * entry
    assert max(s["stored_bytes"] for s in four.steps) > 2 * entry


def test_the_retained_store_is_freed_with_its_episode(engines, revisits) -> None:
    import gc

    (res,) = _arms(engines, ["kamera@m8+recall4"], revisits)
    assert res.steps[-1]["stored_bytes"] > 0
    gc.collect()
    mem = engines("llama").memory()
    assert (mem.live_stored_kv, mem.live_stored_kv_bytes) == (0, 0)


def test_recall_options_parse() -> None:
    assert ArmSpec.parse("kamera@m8+recall4+overlap") == ArmSpec("kamera", True,
                                                                 option="m8+recall4")
    for bad in ("kamera@own+recall2", "kamera@m8+recall0", "kamera@m8+recall", "kamera@m8+r4",
                "kamera@m8+recall65", "kamera@m8+", "kamera@own+", "kamera@m8+recall\u0664",
                "kamera@m4097"):
        with pytest.raises(ValueError):
            ArmSpec.parse(bad)


def test_a_part_of_a_stored_chunk_places_as_the_same_cells_of_the_whole(engines) -> None:
    """``StoredKv.part`` (what a recall places: the image alone) gives exactly the cells
    the whole chunk would put at those positions, patch included."""
    engine = engines("llama")
    seq = 0
    engine.clear(seq)
    engine.prefill_tokens(seq, engine.tokenize("the screen came back to an earlier state"),
                          logits=False)
    own = engine.kv_read(seq)
    engine.clear(seq)
    engine.prefill_tokens(seq, engine.tokenize("a different context: the screen came back"),
                          logits=False)
    other = engine.kv_read(seq)
    engine.clear(seq)
    n = min(own.n_cells, other.n_cells)
    canon = own.between(0, n)
    shifted = KvRows(canon.pos, other.between(0, n).k, other.between(0, n).v)
    stored = StoredKv(canon, make_patch(engine.rope, shifted, canon, 4))
    whole = place(engine.rope, stored, 50)
    part = place(engine.rope, stored.part(2, 3), 52)
    assert np.array_equal(part.pos, whole.pos[2:5])
    for a, b in zip((*part.k, *part.v), (*whole.k, *whole.v)):
        assert np.array_equal(a, b[2:5])


def test_recall_under_overlap_computes_the_same(engines, revisits) -> None:
    """Under overlap the entries are made in the prefetch; a recalled step's critical path
    then prefills neither the image nor any canonical forward — and the actions and drift
    are plain recall's."""
    plain, over = _arms(engines, ["kamera@m8+recall4", "kamera@m8+recall4+overlap"], revisits)
    image_cells, _ = engines("llama").image_tokens(screenshot(1, W, H))
    assert [s["output_tokens"] for s in over.steps] == [s["output_tokens"] for s in plain.steps]
    assert [s["drift_kl"] for s in over.steps] == [s["drift_kl"] for s in plain.steps]
    for t in (5, 6):
        s = over.steps[t]
        assert s["critical_store_tokens"] == 0
        assert s["critical_path_prefill_tokens"] == s["new_content_tokens"] - image_cells


async def test_closing_or_evicting_a_recall_episode_frees_its_store(engines, revisits) -> None:
    """The store outlives each step with ``+recall``, so closing the episode (while its
    caller still holds it) and evicting it while idle must drop the entries with the rest
    of its state: the ledger's count and the engine's live entries agree after each."""
    from cachepolicy.policies import make_policy
    from cachepolicy.segments import model_info
    from replay_helpers import OPTIONS, step_segments
    from scheduler.ledger import MemoryLedger
    from scheduler.pressure import Evict
    from scheduler.scheduler import Scheduler

    engine = engines("llama")
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 30)

    def kamera():
        return make_policy("kamera", model_info(engine), factory.kit, window=WINDOW,
                           decode_tokens=4, option="m8+recall4")

    async with Scheduler(engine, ledger, factory, options=OPTIONS,
                         spare_sequence=True) as sched:
        a, b = sched.open_episode("a", kamera()), sched.open_episode("b", kamera())
        for i in range(3):
            for ep in (a, b):
                await sched.step(ep, lambda i=i: step_segments(factory, revisits, i))
        assert a.state.stored and ledger.held_by("a") >= a.state.stored_bytes > 0
        await sched.pressure.carry_out(Evict(sched._slots["a"]))
        assert a.state.stored == () and ledger.held_by("a") == 0
        sched.check_integrity()
        await sched.close_episode(b)  # ``b`` is still referenced here, as a driver holds it
        assert b.state.stored == ()
        sched.check_integrity()
        await sched.close_episode(a)
    assert ledger.snapshot().held == 0


def test_the_retained_entries_are_the_last_used_and_never_two_of_one_screen(engines) -> None:
    from cachepolicy.policies import make_policy
    from cachepolicy.segments import model_info

    engine = engines("llama")
    policy = make_policy("kamera", model_info(engine), SegmentFactory(engine).kit,
                         window=WINDOW, option="m0+recall2")
    part = (4, 16)
    known = {"s@0": ("A", part), "s@1": ("B", part), "s@2": ("C", part), "s@3": ("B", part)}
    assert policy._retained(known, []) == ("s@2", "s@3")
    assert policy._retained(known, ["s@0"]) == ("s@3", "s@0")  # a recall counts as a use
    # a newer entry with the same pixels replaces the older one in the LRU's slots
    assert policy._retained({**known, "s@4": ("C", part)}, []) == ("s@3", "s@4")
