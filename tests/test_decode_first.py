"""Between prefill pieces a generation decoding on another sequence finishes first
(``Engine.yield_decode_round``): an answer ends some agent's critical path.  Before, a
prefill waited for one decode call only, and between a generation's tokens (while it
sampled) for none — on one thread the next step's prefill then ran between the tokens and
two answers came out together (docs/benchmarks.md §10, "The attention model at N = 4:
kamera@own beside relocate, and why the server idled")."""

from __future__ import annotations

import threading
import time

from cachepolicy.engine import Engine, EngineConfig


def _engine(forged) -> Engine:
    m = forged("llama", vision=False)
    return Engine(m.model_path, None, EngineConfig(n_ctx_per_seq=256, n_seq_max=2, n_batch=64,
                                                   n_threads=1, decode_rows=2))


def _hold_a_lane(e: Engine, between_tokens_s: float, took: threading.Event,
                 ended: list[float]) -> threading.Thread:
    """A generation on sequence 0 that decodes a token, 'samples' for ``between_tokens_s``
    (holding its lane, no call pending or running), decodes another and ends."""

    def work() -> None:
        with e.generating(0) as lane:
            lane.decode(5)
            took.set()
            time.sleep(between_tokens_s)
            lane.decode(6)
            ended.append(time.perf_counter())  # inside: before the lane is released

    thread = threading.Thread(target=work)
    thread.start()
    return thread


def test_a_prefill_waits_for_the_generation_decoding_now_to_end(forged) -> None:
    with _engine(forged) as e:
        e.prefill_tokens(0, [3 + i for i in range(12)], logits=False)
        took, ended = threading.Event(), []
        thread = _hold_a_lane(e, 0.6, took, ended)
        assert took.wait(timeout=30)
        e.yield_decode_round(timeout=30)  # between two pieces of sequence 1's prefill
        returned = time.perf_counter()
        assert e.memory().lanes_in_use == ()  # the whole generation went first
        thread.join(timeout=30)
        assert ended and returned >= ended[0]


def test_the_wait_is_bounded_and_free_without_generations(forged) -> None:
    with _engine(forged) as e:
        t0 = time.perf_counter()
        e.yield_decode_round(timeout=5)
        assert time.perf_counter() - t0 < 0.5  # nobody decodes: no wait
        e.prefill_tokens(0, [3 + i for i in range(12)], logits=False)
        took, ended = threading.Event(), []
        thread = _hold_a_lane(e, 3.0, took, ended)
        assert took.wait(timeout=30)
        t0 = time.perf_counter()
        e.yield_decode_round(timeout=0.3)
        waited = time.perf_counter() - t0
        assert 0.25 <= waited < 2.5 and not ended  # a long generation lets the piece through
        thread.join(timeout=30)
        assert ended
