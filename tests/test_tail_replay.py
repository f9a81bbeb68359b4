"""The approximate policies (tail-replay, noevict-tail, faithful-tail) on the forged tiny
qwen35 with vision, through the loop that ships: what they reuse, what they recompute, that
a budget covering the whole prefix is the exact reference bitwise, that a short one is not
(and every such step is marked), and that exact policies never reuse an approximate state."""

from __future__ import annotations

import attrs
import pytest

from cachepolicy.context_log import ContextLog
from cachepolicy.engine.checkpoint import CheckpointKind, is_approximate
from cachepolicy.errors import PolicyError, PolicyRefusedError
from cachepolicy.pieces import Piece, text_piece
from cachepolicy.plan import CacheState, CacheView, StartKind
from cachepolicy.policies import POLICIES, make_policy
from cachepolicy.segments import SegmentFactory, model_info
from cachepolicy.tail import ReplayBudget, content_match, cut_back, tail_start
from replay_helpers import AGENT, check_accounts, run_prefetch, run_step, step_segments
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.transaction import EpisodeCache

STEPS, WINDOW = 8, 3


@pytest.fixture(scope="module")
def traj():
    return trajectory(STEPS, 128, 96)


def _arm(engines, name, traj, **agent):
    (res,) = run_arms(engines("qwen35"), [name], traj,
                      attrs.evolve(AGENT, window=WINDOW, decode_tokens=6, **agent))
    return res


def test_a_budget_of_the_whole_prefix_is_terminal_scratch_bitwise(engines, traj) -> None:
    """r >= the matched prefix: the cut reaches position 0 — a full prefill of terminal
    scratch's own pieces, bitwise (the drift against it is exactly 0 at every step)."""
    whole = _arm(engines, "tail-replay", traj, replay_budget="100%", replay_drift=True)
    scratch = _arm(engines, "terminal-scratch", traj)
    assert whole.output_sha256 == scratch.output_sha256
    assert all(s["drift_kl"] == 0.0 and s["drift_top1_agree"] for s in whole.steps)
    assert not any(s["approximate"] for s in whole.steps)
    assert [s["context_tokens"] for s in whole.steps] == [s["context_tokens"]
                                                         for s in scratch.steps]


@pytest.mark.parametrize("budget", ["0", "16"])
def test_a_short_replay_recomputes_its_budget_and_differs(engines, traj, budget) -> None:
    """r = 0 from the zero state: not the reference (KL > 0: the check can fail); every step
    after the first replays, is marked approximate and prefills what terminal-slot does plus
    its budget, with no checkpoint held."""
    res = _arm(engines, "tail-replay", traj, replay_budget=budget, replay_drift=True)
    slot = _arm(engines, "terminal-slot", traj)
    r = int(budget)
    for s, ref in zip(res.steps[1:], slot.steps[1:]):
        assert s["start"] == "replay" and s["approximate"] and s["replay_tokens"] == r
        assert s["checkpoint_bytes"] == 0 < ref["checkpoint_bytes"]
        # the content match may run a token or two past terminal-slot's checkpoint
        assert ref["prefill_tokens"] - 2 <= s["prefill_tokens"] - r <= ref["prefill_tokens"]
        assert s["context_tokens"] == ref["context_tokens"]
    assert all(s["drift_kl"] > 0.0 for s in res.steps[1:])


def test_with_overlap_the_replay_moves_into_the_prefetch(engines, traj) -> None:
    res = _arm(engines, "tail-replay+overlap", traj, replay_budget="16")
    plain = _arm(engines, "tail-replay", traj, replay_budget="16")
    assert res.output_sha256 == plain.output_sha256
    for s in res.steps[1:]:  # the critical step continues what the prefetch replayed
        assert s["start"] == "keep" and s["approximate"] and s["replay_tokens"] == 16
        assert s["critical_path_prefill_tokens"] < s["prefill_tokens"]


def test_noevict_tail_continues_to_the_true_point_of_divergence(engines, traj) -> None:
    """The next step's assistant turn opens with the generation prompt the sequence ends
    with: noevict-tail keeps it (no checkpoint, no replay) where noevict cuts back to its
    checkpoint before it and prefills it again."""
    tail = _arm(engines, "noevict-tail", traj)
    exact = _arm(engines, "noevict", traj)
    gen = len(SegmentFactory(engines("qwen35")).kit.generation_prompt)
    for s, ref in zip(tail.steps[1:], exact.steps[1:]):
        assert s["start"] == "keep" and not s["approximate"] and s["replay_tokens"] == 0
        assert s["prefill_tokens"] == ref["prefill_tokens"] - gen
        assert s["checkpoint_bytes"] == 0 < ref["checkpoint_bytes"]


def _view(e, seq: int, state: CacheState = CacheState()) -> CacheView:
    return CacheView(state, e.seq_info(seq))


def test_exact_policies_never_reuse_an_approximate_state(engines, traj) -> None:
    """After a tail-replay step the sequence holds the same content as terminal-slot's
    would, but marked: terminal-slot's planner neither keeps nor truncates into it."""
    e = engines("qwen35")
    factory = SegmentFactory(e)
    tail = make_policy("tail-replay", model_info(e), factory.kit, window=WINDOW,
                       decode_tokens=4, tail=ReplayBudget(tokens=0))
    slot = make_policy("terminal-slot", model_info(e), factory.kit, window=WINDOW,
                       decode_tokens=4)
    e.clear(0)
    ep = EpisodeCache("t", 0, tail)
    ledger = MemoryLedger(1 << 30)
    for i in range(3):
        run_step(e, ep, step_segments(factory, traj, i), ledger)
        check_accounts(e, ep, ledger)
    assert is_approximate(e.seq_info(0).history)
    log = ep.log.append(*step_segments(factory, traj, 3))
    assert slot.select(log, ep.view(e)).start.kind is StartKind.CLEAR
    # the tail policy itself reuses it (by content), replaying nothing at budget 0
    assert tail.select(log, ep.view(e)).start.kind is StartKind.REPLAY
    e.clear(0)


def test_the_content_match_and_the_cut(engines) -> None:
    """Token-level match into a merged piece, images whole, and a cut that does not split an
    image."""
    e = engines("qwen35")
    factory = SegmentFactory(e)
    shot = factory.screenshot(0, trajectory(1, 96, 64).frames[0].screenshot)
    from cachepolicy.pieces import image_piece
    img = image_piece(shot)
    a, b = tuple(range(300, 320)), tuple(range(400, 410))
    e.clear(0)
    e.prefill_tokens(0, a, logits=False)
    e.encode_image(shot.png)
    e.prefill_image(0, e.encode_image(shot.png))
    e.prefill_tokens(0, b, logits=False)
    hist = e.seq_info(0).history
    # the prompt merged b with more text, then diverges after 4 of b's tokens
    pieces = (text_piece("a", a), img, text_piece("b+", b[:4] + (7, 8, 9)))
    m = content_match(pieces, hist, len(pieces))
    assert (m.end.piece, m.end.offset, m.end.rows) == (2, 4, 20 + img.n_tokens + 4)
    assert not m.whole
    assert m.end.pos == 20 + img.n_pos + 4
    # 6 rows back: 4 of b's tokens, then the image (whole), then nothing of a
    cut = cut_back(pieces, m.end, 6)
    assert (cut.piece, cut.offset, cut.pos) == (1, 0, 20)
    cut = cut_back(pieces, m.end, 3)
    assert (cut.piece, cut.offset, cut.pos) == (2, 1, 20 + img.n_pos + 1)
    # a whole match: the sequence is a prefix of the prompt
    longer = (text_piece("a", a), img, text_piece("b", b + (1, 2)))
    m = content_match(longer, hist, len(longer))
    assert m.whole and m.end.pos == e.seq_info(0).next_pos
    ts = tail_start(longer, _view(e, 0), ReplayBudget(tokens=4), limit=len(longer))
    assert ts.start.kind is StartKind.KEEP and ts.reused == 3 and ts.split_at == 2
    assert ts.pieces[2].tokens == b and ts.pieces[3].tokens == (1, 2)
    e.clear(0)


def test_a_checkpoint_inside_the_budget_is_used_instead_of_a_replay(engines) -> None:
    e = engines("qwen35")
    a = tuple(range(300, 340))
    e.clear(0)
    e.prefill_tokens(0, a[:30], logits=False)
    ckpt = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    e.prefill_tokens(0, a[30:] + (5, 6, 7), logits=False)
    from cachepolicy.plan import NamedCheckpoint
    state = CacheState(checkpoints=(NamedCheckpoint("c", ckpt),))
    pieces: tuple[Piece, ...] = (text_piece("a", a + (1, 2, 3)), text_piece("gen", (9, 9)))
    # divergence at 40; a budget of 16 reaches back to 24: the checkpoint at 30 is within
    ts = tail_start(pieces, _view(e, 0, state), ReplayBudget(tokens=16), limit=1)
    assert ts.start.kind is StartKind.TRUNCATE and ts.start.pos == 30 and ts.replay is None
    # a budget of 4 stops at 36: a replay from the older checkpoint (base 30) or zero
    ts = tail_start(pieces, _view(e, 0, state), ReplayBudget(tokens=4), limit=1)
    assert ts.start.kind is StartKind.REPLAY and ts.start.pos == 36
    assert ts.start.checkpoint is ckpt and (ts.replay.base, ts.replay.rows) == (30, 4)
    ts = tail_start(pieces, _view(e, 0, state), ReplayBudget(tokens=4, base="zero"), limit=1)
    assert ts.start.checkpoint is None and ts.replay.base == 0
    e.clear(0)


def test_budgets_parse_and_refuse() -> None:
    assert ReplayBudget.parse("64") == ReplayBudget(tokens=64)
    assert ReplayBudget.parse("10%").rows(331) == 34
    assert str(ReplayBudget.parse("5%")) == "5%" and str(ReplayBudget.parse("0")) == "0"
    for bad in ("ten", "-3", "150%", ""):
        with pytest.raises(ValueError):
            ReplayBudget.parse(bad)
    with pytest.raises(ValueError):
        attrs.evolve(AGENT, replay_budget="lots")


def test_manifests_and_refusals(engines) -> None:
    for name in ("tail-replay", "noevict-tail", "faithful-tail"):
        assert POLICIES[name].manifest.quality == "approximate"
    e = engines("llama")
    with pytest.raises(PolicyRefusedError, match="does not support attention"):
        make_policy("tail-replay", model_info(e), SegmentFactory(e).kit)
    q = engines("qwen35")
    with pytest.raises(PolicyError, match="exact"):
        make_policy("terminal-slot", model_info(q), SegmentFactory(q).kit,
                    tail=ReplayBudget(tokens=4))
    slot = make_policy("terminal-slot", model_info(q), SegmentFactory(q).kit)
    twin = slot.with_tail(ReplayBudget(tokens=4))
    assert twin is not None and twin.manifest.quality == "approximate"
    assert slot.manifest.quality == "exact" and slot.tail is None  # the original is untouched
    assert make_policy("evict", model_info(e), SegmentFactory(e).kit).with_tail(
        ReplayBudget(tokens=4)) is None  # attention-only: every trim is exact already


def test_faithful_tail_reuses_past_the_last_message_checkpoint(engines) -> None:
    """A client that edits the end of an earlier message: faithful restores its last
    message-boundary checkpoint before the edit; faithful-tail keeps the attention KV up to
    the budget before the first changed token (and with a budget of the whole prefix it is
    faithful, bitwise)."""
    from cachepolicy.policies.faithful import PLACES

    e = engines("qwen35")
    factory = SegmentFactory(e)

    def request(edited: bool) -> tuple:
        words = ("the agent clicks the button and types a short report into the dialog box "
                 "then waits for the window to close ") * 3
        last = "and saves it." if not edited else "and closes it."
        return (factory.text(0, "You are a helpful agent."),
                factory.text(PLACES, "Open the file."),
                factory.text(2 * PLACES, words + last),
                factory.text(3 * PLACES, "<answer>"))

    results = {}
    for name, budget in (("faithful", None), ("faithful-tail", "16"),
                         ("faithful-tail", "100%")):
        kwargs = {"tail": ReplayBudget.parse(budget)} if budget else {}
        policy = make_policy(name, model_info(e), factory.kit, decode_tokens=4, **kwargs)
        e.clear(0)
        ep = EpisodeCache(name, 0, policy)
        ledger = MemoryLedger(1 << 30)
        first = _request(e, ep, request(False), ledger)
        second = _request(e, ep, request(True), ledger)
        check_accounts(e, ep, ledger)
        results[(name, budget)] = (first, second)
        e.clear(0)
    exact = results[("faithful", None)][1]
    tail = results[("faithful-tail", "16")][1]
    whole = results[("faithful-tail", "100%")][1]
    assert exact.start == "truncate" and not exact.approximate
    assert tail.start == "replay" and tail.approximate and tail.replay_tokens == 16
    assert tail.prefill_tokens < exact.prefill_tokens
    assert not whole.approximate and whole.output_tokens == exact.output_tokens


def _request(e, ep, segments, ledger):
    """A whole-prompt request: the segments replace the log (faithful chat mode)."""
    from replay_helpers import OPTIONS
    from scheduler.transaction import admit, begin, commit

    txn = begin(e, ep, segments, replace=True)
    admit(txn, ledger)
    return commit(e, txn, ledger, OPTIONS)
