"""Generations decode in lanes, every llama_decode call feeding all lanes at once (idle ones
padded): a sequence's tokens are bitwise the same alone or beside other generations."""

from __future__ import annotations

import threading

import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.sampling import SamplingParams


def _engine(forged, arch: str, rows: int) -> Engine:
    m = forged(arch, vision=False)
    return Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=512, n_seq_max=4, n_batch=64,
                                                   n_threads=1, decode_rows=rows))


def _prompt(seq: int) -> list[int]:
    return [3 + (7 * seq + i) % 200 for i in range(20 + 9 * seq)]  # other tokens, lengths


def _generate(e: Engine, seqs: list[int], tokens: int, *,
              gate: threading.Barrier | None = None) -> dict[int, list[int]]:
    """Generations on ``seqs`` in threads (together when they overlap)."""
    for s in seqs:
        e.clear(s)
    logits = {s: e.prefill_tokens(s, _prompt(s)) for s in seqs}
    out: dict[int, list[int]] = {}
    params = SamplingParams(temperature=1.0, seed=5)

    def run(s: int) -> None:
        if gate is not None:
            gate.wait(timeout=30)
        out[s] = e.generate(s, logits[s], tokens, params, stop_at_eog=False)

    threads = [threading.Thread(target=run, args=(s,)) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return out


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_concurrent_generations_equal_their_solo_runs(forged, arch) -> None:
    with _engine(forged, arch, rows=4) as e:
        together = _generate(e, [0, 1, 2], 12, gate=threading.Barrier(3))
        calls, rows = e.batcher.calls, e.batcher.real_rows
        assert rows == 3 * 11 and calls < rows  # they really shared calls
        solo = {s: _generate(e, [s], 12)[s] for s in range(3)}
        assert e.batcher.calls - calls == 3 * 11  # alone: one call per token, padded
        # more generations than lanes: the extra ones wait for a lane, same tokens
        crowd = _generate(e, [0, 1, 2, 3], 12, gate=threading.Barrier(4))
    assert together == solo
    assert {s: crowd[s] for s in range(3)} == solo
    # the prompts stay in the sequences; the generated tokens lived in the lanes
    assert all(len(v) == 12 for v in solo.values())


def test_lanes_are_empty_between_generations(forged) -> None:
    with _engine(forged, "qwen35", rows=4) as e:
        _generate(e, [0, 1], 6, gate=threading.Barrier(2))
        assert e.seq_info(0).n_tokens == len(_prompt(0))
        assert e.memory().lanes_in_use == ()
        with e.batcher.generating(0):
            assert e.memory().lanes_in_use == (e.batcher.lanes[0],)
        assert e.memory().lanes_in_use == ()


def test_rows_1_is_one_generation_per_call(forged) -> None:
    with _engine(forged, "llama", rows=1) as e:
        out = _generate(e, [0, 1], 6, gate=threading.Barrier(2))
        assert e.batcher.calls == e.batcher.real_rows == 10
        assert out == {s: _generate(e, [s], 6)[s] for s in (0, 1)}


def test_bench_decode_reports_identical_tokens(forged, tmp_path) -> None:
    import json
    import subprocess
    import sys

    m = forged("llama", vision=False)
    out = tmp_path / "decode.json"
    res = subprocess.run([sys.executable, "-m", "runtime.cli", "bench-decode", "--model",
                          str(m.model_path), "--sequences", "3", "--context", "64",
                          "--tokens", "6", "--threads", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert report["identical_to_one_at_a_time"] is True
    calls = report["decode_calls"]
    assert calls["batched"]["rows"] == calls["one_at_a_time"]["rows"] == 3 * 5
    assert calls["batched"]["calls"] < calls["one_at_a_time"]["calls"] == 15
    assert "padding costs a lone generation" in res.stdout
