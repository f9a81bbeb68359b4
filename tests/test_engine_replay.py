"""The engine's approximate edit, ``replay_cut`` (tail replay), on the real engine (forged tiny
qwen35): the replay of a whole prefix is a full prefill bitwise, a short replay is not — and
says so in the sequence's history, where no exact comparison can match it."""

from __future__ import annotations

import numpy as np
import pytest

from cachepolicy.engine.checkpoint import CheckpointKind, RunKind, is_approximate
from cachepolicy.errors import RestoreError, UnsafeEditError
from cachepolicy.oracle.checks import oracle_screenshot

PREFIX = ("You are a GUI agent. The screen shows a desktop with a file manager, a terminal and "
          "a browser. Step 1: click(120, 340). Step 2: type('report.txt'). Step 3: press enter "
          "and wait for the dialog. ")
DETOUR = "A detour the next prompt no longer holds: it diverges here."
SUFFIX = "Step 4: click the OK button of the dialog that says the file was saved."


def _reference(e, tokens) -> np.ndarray:
    e.clear(2)
    out = e.prefill_tokens(2, tokens)
    digest = e.seq_info(2).digest
    e.clear(2)
    return out, digest


def _held(e, prefix, detour) -> None:
    """Sequence 0 holds the matched prefix, then what the new prompt no longer has."""
    e.clear(0)
    e.prefill_tokens(0, prefix, logits=False)
    e.prefill_tokens(0, detour, logits=False)


def test_replaying_the_whole_prefix_is_a_full_prefill_bitwise(engines) -> None:
    e = engines("qwen35")
    prefix, detour, suffix = e.tokenize(PREFIX), e.tokenize(DETOUR), e.tokenize(SUFFIX)
    ref, ref_digest = _reference(e, prefix + suffix)
    _held(e, prefix, detour)
    cut = e.replay_cut(0, 0)  # r = the whole prefix, from the zero state
    assert (cut.pos, cut.skipped, cut.approximate) == (0, 0, False)
    out = e.prefill_tokens(0, prefix + suffix)
    assert np.array_equal(out, ref)
    assert e.seq_info(0).digest == ref_digest and not is_approximate(e.seq_info(0).history)
    e.clear(0)


def test_replaying_everything_after_a_checkpoint_base_is_exact(engines) -> None:
    """Base = a recurrent checkpoint at b, cut at b: the replay covers all it missed."""
    e = engines("qwen35")
    prefix, detour, suffix = e.tokenize(PREFIX), e.tokenize(DETOUR), e.tokenize(SUFFIX)
    b = len(prefix) // 2
    ref, ref_digest = _reference(e, prefix[:b] + prefix[b:] + suffix)
    e.clear(0)
    e.prefill_tokens(0, prefix[:b], logits=False)
    base = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    e.prefill_tokens(0, prefix[b:], logits=False)
    e.prefill_tokens(0, detour, logits=False)
    cut = e.replay_cut(0, b, base=base)
    assert not cut.approximate and e.seq_info(0).history == base.history
    out = e.prefill_tokens(0, prefix[b:] + suffix)
    # pieces differ from the reference's one call: split == one call for >= 8-row pieces
    e.prefill_tokens(2, prefix[:b], logits=False)
    ref2 = e.prefill_tokens(2, prefix[b:] + suffix)
    e.clear(2)
    assert np.array_equal(out, ref2)
    assert np.array_equal(out, ref)
    e.clear(0)


@pytest.mark.parametrize("replay", [0, 8, 24])
def test_a_short_replay_from_the_zero_state_differs_and_is_marked(engines, replay: int) -> None:
    e = engines("qwen35")
    prefix, detour, suffix = e.tokenize(PREFIX), e.tokenize(DETOUR), e.tokenize(SUFFIX)
    ref, ref_digest = _reference(e, prefix + suffix)
    _held(e, prefix, detour)
    c = len(prefix) - replay
    cut = e.replay_cut(0, c)
    assert (cut.pos, cut.base_pos, cut.skipped) == (c, 0, c)
    hist = e.seq_info(0).history
    assert hist[-1].kind is RunKind.REBASE and hist[-1].pos0 == c and e.seq_info(0).next_pos == c
    out = e.prefill_tokens(0, prefix[c:] + suffix, allow_single=True)
    assert not np.array_equal(out, ref)  # the check can fail: a zero state is not the state
    assert float(np.abs(out - ref).max()) > 0
    info = e.seq_info(0)
    assert is_approximate(info.history) and info.digest != ref_digest
    e.clear(0)


def test_an_older_checkpoint_base_is_approximate_too(engines) -> None:
    e = engines("qwen35")
    prefix, detour, suffix = e.tokenize(PREFIX), e.tokenize(DETOUR), e.tokenize(SUFFIX)
    ref, _ = _reference(e, prefix + suffix)
    b, c = 8, len(prefix) - 16
    e.clear(0)
    e.prefill_tokens(0, prefix[:b], logits=False)
    base = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    e.prefill_tokens(0, prefix[b:], logits=False)
    e.prefill_tokens(0, detour, logits=False)
    cut = e.replay_cut(0, c, base=base)
    assert (cut.base_pos, cut.skipped) == (b, c - b)
    out = e.prefill_tokens(0, prefix[c:] + suffix)
    assert not np.array_equal(out, ref)
    assert is_approximate(e.seq_info(0).history)
    e.clear(0)


def test_dropping_the_recurrent_state_frees_it_and_marks_the_sequence(engines) -> None:
    """The memory ladder's use: keep the attention KV, drop the recurrent state."""
    e = engines("qwen35")
    e.clear(0)
    e.prefill_tokens(0, e.tokenize(PREFIX), logits=False)
    end, before = e.seq_info(0).next_pos, e.held_bytes(0)
    cut = e.replay_cut(0, end)
    assert cut.skipped == end
    freed = before - e.held_bytes(0)
    assert 0.9 * e.recurrent_bytes_per_seq < freed <= e.recurrent_bytes_per_seq
    assert e.memory().seq_state_bytes[0] == e.held_bytes(0)
    assert is_approximate(e.seq_info(0).history) and e.seq_info(0).next_pos == end
    e.clear(0)


def test_an_exact_checkpoint_makes_a_rebased_sequence_exact_again(engines) -> None:
    """Truncating through a checkpoint taken before the approximation restores exactness;
    a checkpoint taken after it never splices into an exact history."""
    e = engines("qwen35")
    prefix, detour, suffix = e.tokenize(PREFIX), e.tokenize(DETOUR), e.tokenize(SUFFIX)
    b = len(prefix) - 10
    ref, ref_digest = _reference(e, prefix + suffix)
    e.clear(0)
    e.prefill_tokens(0, prefix[:b], logits=False)
    exact = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    e.prefill_tokens(0, prefix[b:], logits=False)
    e.replay_cut(0, b)  # rebased at b: the marker sits at the checkpoint's position
    e.prefill_tokens(0, prefix[b:], logits=False)
    approx = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)  # taken on the approximate history
    e.prefill_tokens(0, detour, logits=False)
    e.truncate(0, b, via=exact)
    assert e.seq_info(0).history == exact.history
    out = e.prefill_tokens(0, prefix[b:] + suffix)
    e.prefill_tokens(2, prefix[:b], logits=False)
    ref2 = e.prefill_tokens(2, prefix[b:] + suffix)
    e.clear(2)
    assert np.array_equal(out, ref2) and not is_approximate(e.seq_info(0).history)
    # the approximate checkpoint: same content and position as an exact sequence, refused
    e.clear(1)
    e.prefill_tokens(1, prefix, logits=False)
    e.prefill_tokens(1, detour, logits=False)
    with pytest.raises(UnsafeEditError, match="another history"):
        e.truncate(1, approx.pos, via=approx)
    e.clear(0)
    e.clear(1)


def test_refusals_leave_the_sequence_untouched(engines) -> None:
    e = engines("qwen35")
    prefix = e.tokenize(PREFIX)
    e.clear(0)
    e.prefill_tokens(0, prefix[:12], logits=False)
    full = e.checkpoint(0)
    partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    image = e.encode_image(oracle_screenshot())
    e.prefill_image(0, image)
    e.prefill_tokens(0, prefix[12:], logits=False)
    before, state = e.seq_info(0), e.checkpoint(0).data
    e.prefill_tokens(1, tuple(reversed(prefix[:12])), logits=False)
    foreign = e.checkpoint(1, CheckpointKind.PARTIAL_ONLY)
    e.clear(1)
    with pytest.raises(UnsafeEditError, match="inside an image"):
        e.replay_cut(0, 13)
    with pytest.raises(UnsafeEditError, match="PARTIAL_ONLY"):
        e.replay_cut(0, 12, base=full)
    with pytest.raises(UnsafeEditError, match="history"):
        e.replay_cut(0, 20, base=foreign)
    with pytest.raises(UnsafeEditError, match="history"):
        e.replay_cut(0, 8, base=partial)  # a base after the cut
    with pytest.raises(ValueError, match="outside"):
        e.replay_cut(0, before.next_pos + 1)
    with pytest.raises(RestoreError, match="another model"):
        engines("qwen35moe").replay_cut(0, 0, base=partial)
    assert e.seq_info(0) == before and e.checkpoint(0).data == state
    # the image is replayed whole: a cut at its start
    assert e.replay_cut(0, 12, base=partial).approximate is False
    e.clear(0)


def test_attention_models_have_nothing_to_rebase(engines) -> None:
    e = engines("llama")
    e.clear(0)
    e.prefill_tokens(0, e.tokenize(PREFIX), logits=False)
    with pytest.raises(UnsafeEditError, match="attention-only"):
        e.replay_cut(0, 8)
    e.clear(0)
