"""``kvagent bench-kernels`` on forged XS models: the report's shape and its checks (no speed
is asserted: speed claims come from the command's own side-by-side run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cachepolicy.forge import forge_cached
from conftest import skip_without_fast_kernels
from runtime.cli import build_parser

SMALL = ("--prompt-tokens", "64", "--decode-tokens", "4", "--repeats", "1", "--threads", "1")


def _run(argv: list[str]) -> int:
    """The registered command's run function, in this process (without ``main``'s logging
    setup, which would bind structlog to pytest's captured stderr)."""
    args = build_parser().parse_args(["bench-kernels", *argv])
    return int(args.run(args))


def test_exact_and_fast_engines_side_by_side(tmp_path: Path, capsys) -> None:
    # a K-quant mixture of experts (the exact engine caps its prefill calls) and a dense
    # K-quant (no cap: both engines take n_batch rows)
    moe = forge_cached("qwen35moe", "XS", vision=False, quant="q4_k_m", cache_dir=tmp_path)
    dense = forge_cached("qwen35", "XS", vision=False, quant="q4_k_m", cache_dir=tmp_path)
    skip_without_fast_kernels(dense.model_path)
    out = tmp_path / "kernels.json"
    rc = _run(["--model", f"{moe.model_path},{dense.model_path}", "--n-batch", "32", *SMALL,
               "--json", str(out)])
    assert rc == 0
    printed = capsys.readouterr()
    assert "time.process_time" in printed.out and "rows exact/fast" in printed.out
    assert "pair 1/1 exact" in printed.err and "pair 1/1 fast" in printed.err

    report = json.loads(out.read_text())
    assert report["exact_prefill_bitwise"] is True
    assert [m["model"] for m in report["models"]] == [str(moe.model_path),
                                                      str(dense.model_path)]
    r_moe, r_dense = report["models"]
    assert r_moe["rows"] == {"exact": 7, "fast": 32}  # prefill_rows_for's cap, lifted when fast
    assert r_dense["rows"] == {"exact": 32, "fast": 32}
    for r in report["models"]:
        assert r["prefill_bitwise"]["exact"] is True  # warm-up vs the timed run, compared
        assert r["decode_identical"]["exact"] is True
        assert [(x["pair"], x["variant"]) for x in r["runs"]] == [(0, "exact"), (0, "fast")]
        for clock in ("cpu", "wall"):
            s = r[clock]
            assert min(*s["prefill_tok_s"].values(), *s["decode_tok_s"].values()) > 0
            assert s["prefill_fast_over_exact"] > 0 and s["decode_fast_over_exact"] > 0
    # the capped calls run other kernels than one 32-row call: the engines really differ
    assert r_moe["max_abs_diff_exact_fast"] > 0


def test_missing_model_exits_2_with_the_path(tmp_path: Path, capsys) -> None:
    missing = tmp_path / "nope.gguf"
    assert _run(["--model", str(missing), *SMALL]) == 2
    assert f"model file not found: {missing}" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [("--repeats", "0"), ("--prompt-tokens", "x"),
                                 ("--threads", "0")])
def test_bad_numbers_are_argparse_errors(bad: tuple[str, str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["bench-kernels", *bad])
    assert exc.value.code == 2
    assert bad[0] in capsys.readouterr().err
