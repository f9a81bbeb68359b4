"""Generations decode in lanes, in one of two shapes (``row_classes.DecodeShape``): LANES —
generations share calls, padded to the smallest row count of one measured class — or RUNS —
one generation's tokens per call.  Either way a sequence's tokens are bitwise the same alone
or beside other generations."""

from __future__ import annotations

import contextlib
import threading
import time

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.row_classes import DecodeMode, RowClasses
from cachepolicy.engine.sampling import SamplingParams


def _engine(forged, arch: str, rows: int, *, runs: bool | None = False,
            classes: RowClasses | None = None) -> Engine:
    m = forged(arch, vision=False)
    return Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=512, n_seq_max=4, n_batch=64,
                                                   n_threads=1, decode_rows=rows,
                                                   decode_runs=runs), row_classes=classes)


def _prompt(seq: int) -> list[int]:
    return [3 + (7 * seq + i) % 200 for i in range(20 + 9 * seq)]  # other tokens, lengths


def _generate(e: Engine, seqs: list[int], tokens: int, *,
              gate: threading.Barrier | None = None,
              grammars: dict[int, str] | None = None,
              start_together: bool = False) -> dict[int, list[int]]:
    """Generations on ``seqs`` in threads (together when they overlap); ``grammars``
    constrains some of them.  ``start_together``: every lane is held (``raw_decode``) until
    each thread is about to wait for one, so the generations take their lanes at once
    instead of whenever the OS runs their threads — on a loaded machine a tiny model's whole
    generation can end before the next thread runs (a call shares only lanes held)."""
    for s in seqs:
        e.clear(s)
    logits = {s: e.prefill_tokens(s, _prompt(s)) for s in seqs}
    out: dict[int, list[int]] = {}
    ready = threading.Semaphore(0)

    def run(s: int) -> None:
        params = SamplingParams(temperature=1.0, seed=5, grammar=(grammars or {}).get(s))
        if gate is not None:
            gate.wait(timeout=30)
        ready.release()
        out[s] = e.generate(s, logits[s], tokens, params, stop_at_eog=False)

    threads = [threading.Thread(target=run, args=(s,)) for s in seqs]
    with e.raw_decode(seqs[0]) if start_together else contextlib.nullcontext():
        for t in threads:
            t.start()
        if start_together:
            for _ in seqs:
                assert ready.acquire(timeout=30)
            time.sleep(0.2)  # each thread from its release to the lane wait: a few statements
    for t in threads:
        t.join(timeout=60)
    return out


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_lane_calls_share_and_pad_only_to_their_class(forged, arch) -> None:
    with _engine(forged, arch, rows=4) as e:
        shape = e.decode_shape
        assert shape.mode is DecodeMode.LANES and shape.lanes == 4
        # f16 here: one row takes another kernel, two to four rows one class
        assert e.row_classes.lanes == ((1,), (2, 3, 4)) and shape.lane_rows == (2, 3, 4)
        before = e.decode_stats()
        together = _generate(e, [0, 1, 2], 12, start_together=True)
        shared = e.decode_stats() - before
        assert shared.rows == 3 * 11 and shared.calls < shared.rows  # they really shared
        before = e.decode_stats()
        solo = {s: _generate(e, [s], 12)[s] for s in range(3)}
        alone = e.decode_stats() - before
        # alone: one call per token, padded to 2 rows (not to the 4 lanes)
        assert alone.calls == alone.rows == alone.pad_rows == 3 * 11
        # more generations than lanes: the extra ones wait for a lane, same tokens
        crowd = _generate(e, [0, 1, 2, 3], 12, gate=threading.Barrier(4))
    assert together == solo
    assert {s: crowd[s] for s in range(3)} == solo
    assert all(len(v) == 12 for v in solo.values())


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_runs_alone_and_together_are_the_same(forged, arch) -> None:
    with _engine(forged, arch, rows=4, runs=True) as e:  # asked for: every generation in runs
        shape = e.decode_shape
        assert shape.mode is DecodeMode.RUNS and (shape.min_run, shape.max_run) == (2, 16)
        assert not shape.free_text_alone
        together = _generate(e, [0, 1, 2], 12, gate=threading.Barrier(3))
        before = e.decode_stats()
        solo = {s: _generate(e, [s], 12)[s] for s in range(3)}
        stats = e.decode_stats() - before
        assert stats.tokens == 3 * 11 and stats.rows >= stats.tokens
    assert together == solo


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_the_default_runs_shape_decodes_free_text_alone_in_one_row_calls(forged, arch) -> None:
    """f16's default shape is runs, but a generation no grammar constrains has nothing to
    ride in a run: it decodes in one-row calls, unpadded, never shared — so its tokens are
    those of a one-lane engine (one-row calls too), alone or beside other generations."""
    with _engine(forged, arch, rows=1) as one_lane:
        assert one_lane.decode_shape.lane_rows == (1,)
        reference = {s: _generate(one_lane, [s], 12)[s] for s in range(3)}
    with _engine(forged, arch, rows=4, runs=None) as e:
        shape = e.decode_shape
        assert shape.mode is DecodeMode.RUNS and shape.free_text_alone
        assert "without a grammar one-row calls" in shape.describe()
        together = _generate(e, [0, 1, 2], 12, gate=threading.Barrier(3))
        before = e.decode_stats()
        solo = {s: _generate(e, [s], 12)[s] for s in range(3)}
        stats = e.decode_stats() - before
        # one call per token fed: no pad row, no guess, nothing rolled back
        assert stats.calls == stats.rows == stats.tokens == 3 * 11
        assert stats.pad_rows == stats.drafted == stats.rewinds == 0
        # a constrained generation still decodes in runs (its forced text rides in them)
        e.clear(0)
        logits = e.prefill_tokens(0, _prompt(0))
        before = e.decode_stats()
        digits = e.generate(0, logits, 6, SamplingParams(grammar='root ::= "ab" [0-9]+'),
                            stop_at_eog=False)
        constrained = e.decode_stats() - before
        assert len(digits) == 6 and constrained.rows + constrained.pad_rows > constrained.calls
        # runs and one-row calls interleaved: each generation's tokens are its own alone
        grammars = {0: 'root ::= "ab" [0-9]+', 2: 'root ::= [a-z]+'}
        mixed = _generate(e, [0, 1, 2], 10, gate=threading.Barrier(3), grammars=grammars)
        apart = {s: _generate(e, [s], 10, grammars=grammars)[s] for s in range(3)}
    assert together == solo == reference
    assert mixed == apart and mixed[1] == reference[1][:10]


def test_lanes_are_empty_between_generations(forged) -> None:
    for runs in (False, True):
        with _engine(forged, "qwen35", rows=4, runs=runs) as e:
            _generate(e, [0, 1], 6, gate=threading.Barrier(2))
            assert e.seq_info(0).n_tokens == len(_prompt(0))
            assert e.memory().lanes_in_use == ()
            with e.generating(0):
                assert e.memory().lanes_in_use == (e.decode_lanes()[0],)
            assert e.memory().lanes_in_use == ()


def test_raw_decode_holds_every_lane_and_generations_wait(forged) -> None:
    """``Engine.raw_decode`` feeds lanes itself: while it is open a generation waits for a
    lane (it would share calls with rows it knows nothing of), and its rows are a plain
    call's; on exit the copies are gone and the generation runs."""
    with _engine(forged, "llama", rows=2) as e:
        for s in (0, 1):
            e.prefill_tokens(s, _prompt(s), logits=False)
        took, leave = threading.Event(), threading.Event()

        def work() -> None:
            with e.generating(1):
                took.set()
                leave.wait(timeout=30)

        with e.raw_decode(0, 2) as raw:
            thread = threading.Thread(target=work)
            thread.start()
            rows = raw.run_lanes(5, 2)
            assert not took.wait(timeout=0.3)  # the generation waits for the raw lanes
            assert e.memory().lanes_in_use == e.decode_lanes()[:2]
            assert np.array_equal(rows[0], rows[1])  # two copies of one sequence, one token
        assert took.wait(timeout=30)
        leave.set()
        thread.join(timeout=30)
        assert e.memory().lanes_in_use == ()
        assert e.decode_stats().calls == 0  # raw calls are not the lanes' counters


def test_rows_1_is_one_generation_per_call(forged) -> None:
    with _engine(forged, "llama", rows=1) as e:
        assert e.decode_shape.lane_rows == (1,)
        out = _generate(e, [0, 1], 6, gate=threading.Barrier(2))
        stats = e.decode_stats()
        assert stats.calls == stats.rows == 10 and stats.pad_rows == 0
        assert out == {s: _generate(e, [s], 6)[s] for s in (0, 1)}


def test_a_gap_between_lanes_is_padded(forged) -> None:
    """Calls span consecutive lanes: with lanes 0 and 2 busy and lane 1 free, lane 1 feeds
    a pad row and the call has three rows (in the class: no more padding)."""
    with _engine(forged, "qwen35", rows=4) as e:
        for s in range(3):
            e.prefill_tokens(s, _prompt(s), logits=False)
        entered = {s: threading.Event() for s in range(3)}
        leave_1, go = threading.Event(), threading.Barrier(3)
        lanes: dict[int, int] = {}

        def work(seq: int) -> None:
            with e.generating(seq) as lane:
                lanes[seq] = lane.lane
                entered[seq].set()
                if seq == 1:
                    leave_1.wait(timeout=30)
                    return
                go.wait(timeout=30)
                lane.decode(5)

        threads = {s: threading.Thread(target=work, args=(s,)) for s in range(3)}
        for s in range(3):  # lanes are taken lowest first: seq s gets lane s
            threads[s].start()
            assert entered[s].wait(timeout=30)
        leave_1.set()
        threads[1].join(timeout=30)
        before = e.decode_stats()
        go.wait(timeout=30)
        threads[0].join(timeout=30)
        threads[2].join(timeout=30)
        stats = e.decode_stats() - before
    assert lanes == {s: e.decode_lanes()[s] for s in range(3)}
    assert (stats.calls, stats.rows, stats.pad_rows) == (1, 2, 1)


def test_injected_lane_classes_change_the_padding(forged) -> None:
    """The shape follows the classes: claiming one class for every count (as on Q8_0)
    lets a lone generation decode unpadded — which on this f16 model changes its logits
    (``check-exact``'s ``decode_lanes`` catches it: tests/test_oracle.py)."""
    wrong = RowClasses(lanes=[[1, 2, 3, 4]], runs=range(2, 17))
    with _engine(forged, "qwen35", rows=4, classes=wrong) as e:
        assert e.decode_shape.lane_rows == (1, 2, 3, 4)
        _generate(e, [0], 5)
        stats = e.decode_stats()
        assert stats.calls == stats.rows == 4 and stats.pad_rows == 0


def test_bench_decode_reports_classes_costs_and_identical_tokens(forged, tmp_path) -> None:
    import json
    import subprocess
    import sys

    m = forged("llama", vision=False)
    out = tmp_path / "decode.json"
    res = subprocess.run([sys.executable, "-m", "runtime.cli", "bench-decode", "--model",
                          str(m.model_path), "--sequences", "3", "--context", "64",
                          "--tokens", "6", "--threads", "1", "--rounds", "2",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr
    report = json.loads(out.read_text())
    assert report["identical_to_one_at_a_time"] is True
    assert report["runs_drafts_identical_to_plain"] is True
    assert report["row_classes"] == {"lanes": [[1], [2, 3, 4]], "runs": list(range(2, 17))}
    assert set(report["call_costs"]["lanes"]) == {"1", "2", "3", "4"}
    assert report["call_costs"]["lanes"]["1"] == 1.0
    assert set(report["call_costs"]["runs"]) == {str(k) for k in range(1, 17)}
    lone = report["lone_generation"]
    assert set(lone) == {"one_row", "lanes", "runs_plain", "runs_drafts"}
    assert lone["lanes"]["pad_rows"] == lone["lanes"]["calls"] == 5  # padded to 2 rows
    assert lone["one_row"]["pad_rows"] == 0
    calls = report["decode_calls"]
    # lanes: together they may share calls (whether 6-token generations of a tiny model
    # overlap is up to the threads' timing: sharing itself is tested above, with a
    # barrier); one at a time, one call per token; the runs shape never shares one
    assert calls["lanes_batched"]["calls"] <= calls["lanes_one_at_a_time"]["calls"] == 15
    assert calls["lanes_batched"]["rows"] == calls["lanes_one_at_a_time"]["rows"] == 15
    assert calls["batched"]["tokens"] == calls["one_at_a_time"]["tokens"] == 15
    assert "row classes on this CPU: lane calls {1} | {2..4}; runs {2..16}" in res.stdout
    assert "padding costs a lone generation" in res.stdout


def test_runs_never_exceed_a_call_and_the_probe_measures_only_what_fits(forged) -> None:
    """A run longer than a call's rows would abort the process inside llama_decode (a
    GGML_ASSERT): the decoder refuses it, and an engine whose calls carry fewer rows than
    the probe's longest run (a mixture of experts' prefill cap) measures and uses runs up
    to its calls' rows only."""
    m = forged("llama", vision=False)
    with Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=512, n_seq_max=2, n_batch=6,
                                                 n_threads=1, decode_rows=2,
                                                 row_class_cache=False)) as e:
        assert max(e.row_classes.runs) <= 6 and e.decode_shape.max_run <= 6
        e.prefill_tokens(0, _prompt(0), logits=False)
        with e.raw_decode(0) as raw, pytest.raises(ValueError, match="exceeds a call's 6 rows"):
            raw.run_tokens([5] * 7)
        assert e.memory().lanes_in_use == ()  # the raw lane was cleared
        e.clear(0)
        out = _generate(e, [0], 12)
        assert len(out[0]) == 12


def test_the_default_shape_pads_a_lone_generation_only_where_its_classes_require() -> None:
    """auto: lanes where a lone generation's one-row calls share a class with more rows (or
    there is one lane) — it then pays nothing; runs where one-row calls are a class of their
    own (f16), since lanes would pad it to two rows too."""
    from cachepolicy.engine.row_classes import choose_shape

    f16 = RowClasses(lanes=[[1], [2, 3, 4]], runs=range(2, 17))
    q8 = RowClasses(lanes=[[1, 2, 3, 4]], runs=range(2, 17))
    assert choose_shape(f16, 4, runs=None).mode is DecodeMode.RUNS
    assert choose_shape(f16, 4, runs=None).free_text_alone  # asked-for runs: not
    assert not choose_shape(f16, 4, runs=True).free_text_alone
    assert choose_shape(f16, 1, runs=None).lane_rows == (1,)
    auto = choose_shape(q8, 4, runs=None)
    assert auto.mode is DecodeMode.LANES and auto.pad_to(1) == 1 and auto.lanes == 4
    assert choose_shape(q8, 4, runs=True).mode is DecodeMode.RUNS
    assert choose_shape(f16, 4, runs=False).pad_to(1) == 2
