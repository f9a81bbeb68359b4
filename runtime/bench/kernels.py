"""What the engine's exact kernels cost against the fast ones, measured side by side in one
process (``kvagent bench-kernels``).

Two engines on the same GGUF: ``EngineConfig.fast_kernels`` False (the default: no repacked
weight layouts, and on a mixture-of-experts model with K-quant experts prefill calls of at
most 7 rows) and True (both lifted).  Each measurement clears the sequence, prefills one
prompt with ``Engine.prefill_tokens`` and decodes a fixed number of tokens with
``Engine.generate`` (the path agents use: a decode lane, sampled tokens fed back).  The two
engines alternate ABBA; ratios are medians of the per-pair ratios.  Both clocks are kept:
wall seconds (``time.perf_counter``) and the process's CPU seconds (``time.process_time``,
all threads — on a shared machine other jobs inflate the first, not the second).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.sampling import SamplingParams
from runtime.bench.order import abba

#: the compared engines, in the order of the first pair
VARIANTS = ("exact", "fast")
CLOCKS = ("cpu", "wall")
#: sampled, not greedy: any change in the logits shows in the tokens
SAMPLING = SamplingParams(temperature=1.0, seed=11)
_PROMPT_TEXT = "the agent looks at the screen, finds the button and clicks it. "


@attrs.frozen
class KernelRun:
    """One measurement: a prefill then a decode on one engine, in both clocks."""

    pair: int
    variant: str
    prefill_wall_s: float
    prefill_cpu_s: float
    decode_wall_s: float
    decode_cpu_s: float


@attrs.frozen
class KernelComparison:
    """One model: every timed run, and what the engines did."""

    prompt_tokens: int
    decode_tokens: int
    rows: dict[str, int]  # prefill call rows each engine resolved (engine.config.n_batch)
    runs: tuple[KernelRun, ...]
    prefill_bitwise: dict[str, bool]  # every run's prompt logits bitwise the first, per engine
    decode_identical: dict[str, bool]  # every run decoded the same tokens, per engine
    max_abs_diff_exact_fast: float  # prompt logits of the exact vs the fast engine

    def rates(self, clock: str, phase: str, variant: str) -> list[float]:
        """Tokens per second of ``phase`` (prefill / decode) per pair, in ``clock``."""
        n = self.prompt_tokens if phase == "prefill" else self.decode_tokens
        return [n / getattr(r, f"{phase}_{clock}_s")
                for r in self.runs if r.variant == variant]

    def summary(self, clock: str) -> dict[str, Any]:
        """Median tok/s per engine and the median of the per-pair ratios fast/exact."""
        out: dict[str, Any] = {}
        for phase in ("prefill", "decode"):
            exact, fast = (self.rates(clock, phase, v) for v in VARIANTS)
            out[f"{phase}_tok_s"] = {"exact": statistics.median(exact),
                                     "fast": statistics.median(fast)}
            out[f"{phase}_fast_over_exact"] = statistics.median(
                f / e for e, f in zip(exact, fast, strict=True))
        return out

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["runs"] = [attrs.asdict(r) for r in self.runs]
        d.update({clock: self.summary(clock) for clock in CLOCKS})
        return d


def prompt_for(engine: Engine, n: int) -> list[int]:
    """An ``n``-token text prompt (the same for both engines: one tokenizer)."""
    base = list(engine.tokenize(_PROMPT_TEXT))
    return (base * (n // len(base) + 1))[:n]


def _once(engine: Engine, prompt: Sequence[int],
          decode_tokens: int) -> tuple[tuple[float, ...], np.ndarray, list[int]]:
    """Clear sequence 0, prefill ``prompt``, decode ``decode_tokens`` steps: the four
    timings (prefill wall, CPU; decode wall, CPU), the prompt's logits and the tokens."""
    engine.clear(0)
    w0, c0 = time.perf_counter(), time.process_time()
    logits = engine.prefill_tokens(0, prompt)
    w1, c1 = time.perf_counter(), time.process_time()
    assert logits is not None
    # decode_tokens + 1 sampled tokens: the first comes from the prompt's logits, each
    # further one from a decode step
    tokens = engine.generate(0, logits, decode_tokens + 1, SAMPLING, stop_at_eog=False)
    w2, c2 = time.perf_counter(), time.process_time()
    return (w1 - w0, c1 - c0, w2 - w1, c2 - c1), logits, tokens


def compare_kernels(engines: dict[str, Engine], prompt: Sequence[int], decode_tokens: int,
                    repeats: int, progress: Callable[[str], None]) -> KernelComparison:
    """``repeats`` ABBA pairs of exact / fast measurements, after one untimed warm-up run
    per engine (it pages the weights in; its outputs join the run-to-run checks)."""
    logits: dict[str, list[np.ndarray]] = {v: [] for v in VARIANTS}
    tokens: dict[str, list[list[int]]] = {v: [] for v in VARIANTS}
    for v in VARIANTS:
        _, lg, tk = _once(engines[v], prompt, decode_tokens)
        logits[v].append(lg)
        tokens[v].append(tk)
        progress(f"{v}: warm-up done (not timed)")
    runs = []
    for pair, vi in abba(repeats):
        v = VARIANTS[vi]
        (pw, pc, dw, dc), lg, tk = _once(engines[v], prompt, decode_tokens)
        logits[v].append(lg)
        tokens[v].append(tk)
        runs.append(KernelRun(pair, v, pw, pc, dw, dc))
        progress(f"pair {pair + 1}/{repeats} {v}: prefill {len(prompt)} tokens {pw:.3f} s wall "
                 f"/ {pc:.3f} s CPU, decode {decode_tokens} tokens {dw:.3f} s wall / "
                 f"{dc:.3f} s CPU")
    first = {v: logits[v][0] for v in VARIANTS}
    return KernelComparison(
        prompt_tokens=len(prompt), decode_tokens=decode_tokens,
        rows={v: engines[v].config.n_batch for v in VARIANTS}, runs=tuple(runs),
        # bitwise: the bytes, not ==, so that -0.0 vs 0.0 or NaN bits count
        prefill_bitwise={v: all(lg.tobytes() == first[v].tobytes() for lg in logits[v])
                         for v in VARIANTS},
        decode_identical={v: all(t == tokens[v][0] for t in tokens[v]) for v in VARIANTS},
        max_abs_diff_exact_fast=float(np.max(np.abs(
            first["exact"].astype(np.float64) - first["fast"].astype(np.float64)))))
