"""Byte accounting: the engine's numbers match what llama.cpp reports, and return to zero."""

from __future__ import annotations

import gc

import pytest

from cachepolicy.engine.checkpoint import CheckpointKind

TEXT = "a screenshot of a desktop with a terminal window and a browser showing a form"


@pytest.mark.parametrize("arch", ["llama", "qwen35", "qwen35moe"])
def test_state_bytes_grow_by_kv_bytes_per_token(engines, arch: str) -> None:
    e = engines(arch)
    toks = list(e.tokenize(TEXT)) * 3
    sizes = {}
    for n in (8, 24, len(toks)):
        e.clear(0)
        e.prefill_tokens(0, toks[:n], logits=False)
        sizes[n] = e.state_bytes(0)
        ckpt = e.checkpoint(0)
        assert ckpt.nbytes == sizes[n]  # the record holds exactly what llama.cpp serialised
    fixed = sizes[8] - 8 * e.kv_bytes_per_token
    for n, size in sizes.items():
        assert size == fixed + n * e.kv_bytes_per_token
    if arch == "llama":
        assert e.recurrent_bytes_per_seq == 0
    else:
        # the recurrent state is O(1): a PARTIAL_ONLY checkpoint has the same size at any length
        assert e.state_bytes(0, CheckpointKind.PARTIAL_ONLY) == e.recurrent_bytes_per_seq
        assert e.checkpoint(0, CheckpointKind.PARTIAL_ONLY).nbytes == e.recurrent_bytes_per_seq
        assert fixed > e.recurrent_bytes_per_seq  # full state = recurrent + attention KV


def test_memory_report_counts_live_checkpoints_and_returns_to_zero(engines) -> None:
    e = engines("qwen35")
    gc.collect()
    base = e.memory()
    e.prefill_tokens(0, e.tokenize(TEXT), logits=False)
    full = e.checkpoint(0)
    partial = e.checkpoint(0, CheckpointKind.PARTIAL_ONLY)
    report = e.memory()
    assert report.live_checkpoints == base.live_checkpoints + 2
    assert report.live_checkpoint_bytes == base.live_checkpoint_bytes + full.nbytes + partial.nbytes
    assert report.seq_state_bytes[0] == full.nbytes
    assert report.total_held == (sum(report.seq_state_bytes.values())
                                 + report.live_checkpoint_bytes + report.image_cache_bytes)
    del full, partial
    gc.collect()
    e.clear(0)
    after = e.memory()
    assert after.live_checkpoints == base.live_checkpoints
    assert after.live_checkpoint_bytes == base.live_checkpoint_bytes
    assert 0 not in after.seq_state_bytes


def test_image_cache_bytes_are_counted(engines) -> None:
    from cachepolicy.oracle.checks import oracle_screenshot

    e = engines("qwen35")
    before = e.memory().image_cache_bytes
    img = e.encode_image(oracle_screenshot(160, 96))
    assert e.memory().image_cache_bytes in (before + img.nbytes, before)  # new or already cached
    assert img.nbytes == img.embeddings.nbytes + img.positions0.nbytes
