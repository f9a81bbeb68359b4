"""The exactness oracle on forged tiny models: every check bitwise, and able to fail."""

from __future__ import annotations

import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.oracle.checks import run_checks

ARCHES = ["llama", "qwen35", "qwen35moe"]


@pytest.mark.parametrize("vision", [False, True])
@pytest.mark.parametrize("arch", ARCHES)
def test_every_check_is_bitwise(engines, arch: str, vision: bool) -> None:
    results = run_checks(engines(arch, vision))
    names = {r.name for r in results}
    assert {"split_prefill", "restore_same_seq", "restore_other_seq"} <= names
    if arch == "llama":
        assert "tail_trim" in names
    else:
        assert {"partial_only_truncate", "middle_removal_refused",
                "tail_trim_without_checkpoint_refused"} <= names
    if vision:
        assert {"image_restore_before_image", "image_restore_after_image",
                "encoder_run_to_run", "encoder_after_eviction"} <= names
    failed = [(r.name, r.max_abs_diff, r.detail) for r in results if not r.bitwise]
    assert failed == []
    assert all(r.max_abs_diff == 0.0 for r in results)


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_oracle_catches_flash_attention(forged, arch: str) -> None:
    """With flash attention on, split prefill drifts: the oracle must report it, not pass."""
    m = forged(arch, vision=False)
    config = EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=64, n_threads=1,
                          flash_attn=True)
    with Engine(m.model_path, None, config) as engine:
        results = {r.name: r for r in run_checks(engine)}
    assert not results["split_prefill"].bitwise
    assert results["split_prefill"].max_abs_diff > 0
