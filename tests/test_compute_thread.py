"""Every computation of an engine runs on its one compute thread, whichever thread calls
(so libgomp keeps one pool and spins at barriers instead of sleeping: see
cachepolicy/engine/compute_thread.py), and closing the engine joins that thread."""

from __future__ import annotations

import threading

import llama_cpp
import pytest
from llama_cpp import mtmd_cpp

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.compute_thread import ComputeThread
from cachepolicy.errors import EngineError
from cachepolicy.oracle.checks import oracle_screenshot
from cachepolicy.engine.sampling import SamplingParams


def _spy(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> set[int]:
    """The threads ``module.name`` is called on, from now on."""
    seen: set[int] = set()
    real = getattr(module, name)

    def spy(*args: object) -> object:
        seen.add(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(module, name, spy)
    return seen


def _in_thread(fn) -> None:
    errors: list[BaseException] = []

    def body() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001  re-raised in the test's thread
            errors.append(exc)

    t = threading.Thread(target=body)
    t.start()
    t.join(60)
    assert not t.is_alive() and not errors, errors


def _workers(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.mark.parametrize("beside", [False, True])
def test_decodes_and_encodes_run_on_the_engine_threads(forged, monkeypatch: pytest.MonkeyPatch,
                                                       beside: bool) -> None:
    m = forged("qwen35")
    decodes = _spy(monkeypatch, llama_cpp, "llama_decode")
    encodes = _spy(monkeypatch, mtmd_cpp, "mtmd_encode_chunk")
    before = len(_workers("kvagent-"))
    e = Engine(m.model_path, m.mmproj_path,
               EngineConfig(n_ctx_per_seq=1024, n_seq_max=2, n_batch=32, n_threads=1,
                            encoder_beside=beside))
    callers = {threading.get_ident()}
    try:
        prompt = e.tokenize("open the terminal and list the files")

        def step(seq: int) -> None:
            callers.add(threading.get_ident())
            e.encode_image(oracle_screenshot(variant=seq), use_cache=False)
            logits = e.prefill_tokens(seq, prompt)
            e.generate(seq, logits, 4, SamplingParams(temperature=0.0), stop_at_eog=False)
            e.clear(seq)

        step(0)
        _in_thread(lambda: step(1))
        _in_thread(lambda: step(0))
        assert len(callers) >= 2  # (a finished thread's ident may be reused)
        assert len(decodes) == 1 and not decodes & callers  # one thread, none of the callers'
        assert len(encodes) == 1 and not encodes & callers
        assert (encodes == decodes) is (not beside)  # beside: the encoder's own thread
        assert len(_workers("kvagent-")) == before + (2 if beside else 1)
    finally:
        e.close()
    assert len(_workers("kvagent-")) == before  # closing joined them


def test_compute_thread_runs_calls_returns_errors_and_refuses_after_close() -> None:
    t = ComputeThread("kvagent-test")
    caller = threading.get_ident()
    assert t.run(threading.get_ident) != caller
    assert t.run(lambda: t.run(threading.get_ident)) == t.run(threading.get_ident)  # nested
    with pytest.raises(ZeroDivisionError):
        t.run(lambda: 1 / 0)
    t.close()
    assert not _workers("kvagent-test")
    with pytest.raises(EngineError, match="closed"):
        t.run(threading.get_ident)
