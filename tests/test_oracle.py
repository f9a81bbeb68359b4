"""The exactness oracle on forged tiny models: every check bitwise, and able to fail."""

from __future__ import annotations

import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.row_classes import RowClasses
from cachepolicy.oracle.checks import run_checks

ARCHES = ["llama", "qwen35", "qwen35moe"]
#: the Qwen-VL arches GUI agents ship in (attention only, M-RoPE): with their projectors only
VL_ARCHES = ["qwen2vl", "qwen3vl", "qwen3vlmoe"]
CASES = [(a, v) for v in (False, True) for a in ARCHES] + [(a, True) for a in VL_ARCHES]


@pytest.mark.parametrize(("arch", "vision"), CASES)
def test_every_check_is_bitwise(engines, arch: str, vision: bool) -> None:
    results = run_checks(engines(arch, vision))
    names = {r.name for r in results}
    assert {"split_prefill", "restore_same_seq", "restore_other_seq"} <= names
    if arch == "llama" or arch in VL_ARCHES:
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


DECODE_CHECKS = ("row_classes", "decode_lanes", "decode_runs", "speculative_generation")


def _decode_results(forged, classes: RowClasses | None) -> dict[str, object]:
    m = forged("qwen35", vision=False)
    config = EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=64, n_threads=1)
    with Engine(m.model_path, None, config, row_classes=classes) as engine:
        return {r.name: r for r in run_checks(engine) if r.name in DECODE_CHECKS}


def test_decode_checks_pass_and_report_what_they_did(forged) -> None:
    results = _decode_results(forged, None)
    assert all(r.bitwise for r in results.values())
    assert "rolled back" in results["decode_runs"].detail
    assert "drafts confirmed" in results["speculative_generation"].detail


def test_decode_checks_catch_wrong_row_classes(forged) -> None:
    """Claiming one lane class for 1..4 rows (true on Q8_0, not on f16) makes a lone
    generation decode unpadded: its logits differ from those it gets beside others.  (A
    wrong run class is caught on a K-quant model: tests/test_quantized.py.)"""
    one_lane_class = RowClasses(lanes=[[1, 2, 3, 4]], runs=range(2, 17))
    results = _decode_results(forged, one_lane_class)
    assert not results["row_classes"].bitwise
    assert not results["decode_lanes"].bitwise and results["decode_lanes"].max_abs_diff > 0
    assert results["decode_runs"].bitwise  # the runs claim is still true
    assert results["speculative_generation"].bitwise
