"""What decode calls cost per row class, and what a lone generation pays in each decode shape
— measured side by side in one process (``kvagent bench-decode``).

* **cost per call** — llama.cpp straight (``Engine.raw_decode``: no sampling): a lane call
  of R rows (R = 1..lanes, every lane a copy of one prompt) and a run of k tokens of one sequence
  (k = 1..``max_run``), each timed over a few calls, the shapes visited forward then
  backward every round; reported as medians relative to a one-row call of the same round;
* **a lone generation** — ``Engine.generate`` (the path agents use) on one prompt, per
  decoded token, in four variants alternated round by round: one-row lane calls (no
  padding, no sharing: the cost floor), the lanes shape (padded to its class), the runs
  shape without drafts (plain decoding in runs: a lone token is paired with a guess) and
  with jump-forward and drafts — the last two must give the same tokens.

Wall seconds (``time.perf_counter``) around the calls; ratios within a round, medians over
rounds, so a machine shared with other jobs weighs on every variant alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import attrs

from cachepolicy.engine import Engine
from cachepolicy.engine.drafts import PLAIN, Drafting
from cachepolicy.engine.row_classes import DecodeMode, DecodeShape
from cachepolicy.engine.sampling import SamplingParams

#: calls timed per shape and round
CALLS_PER_SHAPE = 4
#: the lone-generation variants, in the order of the first round
LONE_VARIANTS = ("one_row", "lanes", "runs_plain", "runs_drafts")


@attrs.frozen
class CallCosts:
    """Median seconds of one call per shape, and relative to a one-row call."""

    one_row_s: float
    lanes: dict[int, float]  # R rows → cost relative to one row
    runs: dict[int, float]  # k tokens → cost relative to one row


def call_costs(engine: Engine, prompt: Sequence[int], rounds: int) -> CallCosts:
    """Time lane calls of 1..lanes rows and runs of 1..max_run tokens (sequence 0 holds
    ``prompt`` while it runs; cleared after)."""
    lanes = engine.decode_lanes()
    max_run = engine.shape_for(True).max_run
    shapes = [("lanes", r) for r in range(1, len(lanes) + 1)] + [
        ("runs", k) for k in range(1, max_run + 1)]
    times: dict[tuple[str, int], list[float]] = {s: [] for s in shapes}
    engine.clear(0)
    engine.prefill_tokens(0, tuple(prompt), logits=False)
    token = int(prompt[-1])
    try:
        for rnd in range(rounds):
            for kind, n in shapes if rnd % 2 == 0 else reversed(shapes):
                # every lane a copy of the prompt (copied before, cleared after the timing)
                with engine.raw_decode(0, len(lanes)) as raw:
                    t0 = time.perf_counter()
                    for _ in range(CALLS_PER_SHAPE):
                        if kind == "lanes":
                            raw.run_lanes(token, n)
                        else:
                            raw.run_tokens([token] * n)
                    times[(kind, n)].append((time.perf_counter() - t0) / CALLS_PER_SHAPE)
    finally:
        engine.clear(0)
    one = times[("lanes", 1)]
    rel = {s: statistics.median(t / o for t, o in zip(times[s], one)) for s in shapes}
    return CallCosts(statistics.median(one),
                     {n: rel[("lanes", n)] for k, n in shapes if k == "lanes"},
                     {n: rel[("runs", n)] for k, n in shapes if k == "runs"})


@attrs.frozen
class LoneRun:
    variant: str
    seconds: float  # wall seconds of the generation
    tokens: tuple[int, ...]
    calls: int
    rows: int
    pad_rows: int
    drafted: int
    accepted: int


def lone_generation(engine: Engine, prompt: Sequence[int], n_tokens: int,
                    params: SamplingParams, rounds: int) -> list[LoneRun]:
    """One generation of ``n_tokens`` in each variant per round (orders rotate)."""
    shapes: dict[str, tuple[DecodeShape, Drafting]] = {
        "one_row": (DecodeShape(DecodeMode.LANES, 1, (1,), why="unpadded"), PLAIN),
        "lanes": (engine.shape_for(False), PLAIN),
        "runs_plain": (engine.shape_for(True), PLAIN),
        "runs_drafts": (engine.shape_for(True), Drafting()),
    }
    own = engine.decode_shape
    engine.clear(0)
    logits = engine.prefill_tokens(0, tuple(prompt))
    assert logits is not None
    out: list[LoneRun] = []
    try:
        for rnd in range(rounds):
            order = LONE_VARIANTS[rnd % len(LONE_VARIANTS):] + LONE_VARIANTS[:rnd % len(
                LONE_VARIANTS)]
            for variant in (order if rnd % 2 == 0 else tuple(reversed(order))):
                shape, drafting = shapes[variant]
                engine.set_decode_shape(shape)
                before = engine.decode_stats()
                t0 = time.perf_counter()
                toks = engine.generate(0, logits, n_tokens, params, stop_at_eog=False,
                                       drafting=drafting)
                wall = time.perf_counter() - t0
                s = engine.decode_stats() - before
                out.append(LoneRun(variant, wall, tuple(toks), s.calls, s.rows, s.pad_rows,
                                   s.drafted, s.accepted))
    finally:
        engine.set_decode_shape(own)
        engine.clear(0)
    return out


def lone_summary(runs: Sequence[LoneRun]) -> dict[str, dict[str, float]]:
    """Per variant: median seconds per token and the median of its per-round ratio to the
    one-row variant; calls, rows and drafts of one generation."""
    by: dict[str, list[LoneRun]] = {}
    for r in runs:
        by.setdefault(r.variant, []).append(r)
    base = by["one_row"]
    out: dict[str, dict[str, float]] = {}
    for variant, rs in by.items():
        n = len(rs[0].tokens)
        out[variant] = {
            "s_per_token": statistics.median(r.seconds / n for r in rs),
            "vs_one_row": statistics.median(r.seconds / b.seconds for r, b in zip(rs, base)),
            "calls": rs[0].calls, "rows": rs[0].rows, "pad_rows": rs[0].pad_rows,
            "drafted": rs[0].drafted, "accepted": rs[0].accepted}
    return out


def same_tokens(runs: Sequence[LoneRun], a: str, b: str) -> bool:
    """Every run of variants ``a`` and ``b`` decoded the same tokens."""
    toks = {r.tokens for r in runs if r.variant in (a, b)}
    return len(toks) == 1


def prompt_tokens(engine: Engine, n: int, variant: int = 0) -> list[int]:
    """A prompt of ``n`` tokens with repeats an agent's history has (other per variant)."""
    base = list(engine.tokenize("Step 3: click(412, 388)\nStep 4: type('report.txt')\n"
                                "the agent looks at the screen and clicks "))
    return ([variant + 3] + base * (n // max(1, len(base)) + 2))[: n - 7 * variant]
