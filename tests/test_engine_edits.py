"""Edits the engine must refuse (and leave the sequence untouched), and the ones it allows."""

from __future__ import annotations

import numpy as np
import pytest

from cachepolicy.engine.checkpoint import CheckpointKind, ModelKind
from cachepolicy.errors import (
    ContextFullError, RestoreError, SingleTokenPrefillError, UnsafeEditError,
)

TEXT = "the agent clicks the button and types a short report into the dialog box"


def test_model_kind_comes_from_the_model(engines) -> None:
    assert engines("llama").kind is ModelKind.ATTENTION
    assert engines("qwen35").kind is ModelKind.HYBRID
    assert engines("qwen35moe").kind is ModelKind.HYBRID


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_hybrid_refuses_middle_removal_and_keeps_state(engines, arch: str) -> None:
    e = engines(arch)
    toks = e.tokenize(TEXT)
    e.prefill_tokens(0, toks, logits=False)
    before = e.seq_info(0)
    state_before = e.checkpoint(0).data
    with pytest.raises(UnsafeEditError, match="recurrent state"):
        e.remove_range(0, 2, 6)
    assert e.seq_info(0) == before
    assert e.checkpoint(0).data == state_before


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_hybrid_truncate_needs_a_matching_partial_checkpoint(engines, arch: str) -> None:
    e = engines(arch)
    toks = e.tokenize(TEXT)
    half = len(toks) // 2
    e.prefill_tokens(0, toks[:half], logits=False)
    partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    full = e.checkpoint(0)
    e.prefill_tokens(0, toks[half:], logits=False)
    before = e.seq_info(0)
    with pytest.raises(UnsafeEditError, match="PARTIAL_ONLY"):
        e.truncate(0, half)  # no checkpoint
    with pytest.raises(UnsafeEditError, match="PARTIAL_ONLY"):
        e.truncate(0, half, via=full)  # a FULL checkpoint is not the recurrent-only path
    with pytest.raises(UnsafeEditError, match="another history or position"):
        e.truncate(0, half - 1, via=partial)  # wrong position
    # A partial checkpoint of another history (other tokens, same length) must not splice in.
    e.prefill_tokens(1, tuple(reversed(toks[:half])), logits=False)
    foreign = e.checkpoint(1, CheckpointKind.PARTIAL_ONLY)
    with pytest.raises(UnsafeEditError, match="another history"):
        e.truncate(0, half, via=foreign)
    assert e.seq_info(0) == before
    e.truncate(0, half, via=partial)
    assert e.seq_info(0).next_pos == half
    assert e.seq_info(0).digest == partial.digest


def test_partial_checkpoints_do_not_restore_alone(engines) -> None:
    e = engines("qwen35")
    e.prefill_tokens(0, e.tokenize(TEXT), logits=False)
    partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    with pytest.raises(RestoreError, match="truncate"):
        e.restore(1, partial)


def test_attention_model_has_no_partial_checkpoint(engines) -> None:
    e = engines("llama")
    e.prefill_tokens(0, e.tokenize(TEXT), logits=False)
    with pytest.raises(UnsafeEditError, match="attention-only"):
        e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)


def test_checkpoint_of_another_model_is_refused(engines) -> None:
    a, b = engines("qwen35"), engines("qwen35moe")
    a.prefill_tokens(0, a.tokenize(TEXT), logits=False)
    ckpt = a.checkpoint(0)
    with pytest.raises(RestoreError, match="another model"):
        b.restore(0, ckpt)


def test_attention_model_middle_removal_shifts_positions(engines) -> None:
    e = engines("llama")
    first, second, third = e.tokenize("one two three"), e.tokenize("four five"), e.tokenize("six seven")
    for piece in (first, second, third):
        e.prefill_tokens(0, piece, logits=False)
    e.remove_range(0, len(first), len(first) + len(second))
    info = e.seq_info(0)
    assert info.next_pos == len(first) + len(third)
    assert [r.pos0 for r in info.history] == [0, len(first)]
    # The shifted survivor still continues (approximately: it absorbed the removed tokens).
    logits = e.prefill_tokens(0, e.tokenize("eight nine"))
    assert logits is not None and np.isfinite(logits).all()


def test_truncate_inside_an_image_is_refused(engines) -> None:
    from cachepolicy.oracle.checks import oracle_screenshot

    e = engines("llama")
    img = e.encode_image(oracle_screenshot())
    e.prefill_tokens(0, e.tokenize(TEXT), logits=False)
    start = e.seq_info(0).next_pos
    e.prefill_image(0, img)
    with pytest.raises(UnsafeEditError, match="inside an image"):
        e.truncate(0, start + 1)
    e.truncate(0, start)
    assert e.seq_info(0).next_pos == start


def test_single_token_prefill_is_refused_by_default(engines) -> None:
    e = engines("llama")
    with pytest.raises(SingleTokenPrefillError):
        e.prefill_tokens(0, e.tokenize("hi")[:1])
    assert e.seq_info(0).n_tokens == 0


def test_context_full_is_a_typed_error_and_changes_nothing(engines) -> None:
    e = engines("llama")
    too_many = list(e.tokenize(TEXT)) * 200
    with pytest.raises(ContextFullError):
        e.prefill_tokens(0, too_many[: e.config.n_ctx_per_seq + 1])
    assert e.seq_info(0).n_tokens == 0


def test_bad_sequence_id(engines) -> None:
    e = engines("llama")
    with pytest.raises(ValueError, match="out of range"):
        e.prefill_tokens(7, e.tokenize(TEXT))
