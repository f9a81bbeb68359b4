"""The decode-shape checks: are the row classes the engine decodes with the ones this model
and CPU have, do runs with rolled-back guesses compute every row as plain calls do, and does
a generation with jump-forward and speculation choose what plain decoding chooses?

* ``row_classes`` — the probe (``row_probe``) again, uncached, against the classes the
  engine uses (a stale cache, or a wrong claim, fails it);
* ``decode_runs`` — teacher-forced: a feed of tokens through a lane in the RUNS shape — runs
  of every length of the class, guesses that are confirmed, guesses that are rolled back
  (a trim; on recurrent models a snapshot restored and the kept tokens re-fed), pad rows —
  against the same tokens fed straight to llama.cpp in calls of ``min_run`` tokens (plain
  decoding in that shape); every row's logits bitwise;
* ``speculative_generation`` — greedy and sampled generations under a grammar, with
  jump-forward and drafts and without: the same tokens, and every token that was chosen
  from logits chosen from bitwise the same logits.

Each switches the engine to the RUNS shape for its run and back afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.drafts import PLAIN, Drafting
from cachepolicy.engine.row_classes import DecodeMode, DecodeShape
from cachepolicy.engine.sampling import SamplingParams
from cachepolicy.oracle.sweeps import SweepResult

#: A small action language: literals the grammar forces, choices it leaves to the model.
ORACLE_GRAMMAR = r'''root ::= ("click(" num ", " num ")" | "type(\"" word (" " word)* "\")" | "wait()")
num ::= [0-9] | [1-9] [0-9] | [1-9] [0-9] [0-9]
word ::= [a-z] | [a-z] [a-z] | [a-z] [a-z] [a-z]
'''


@contextmanager
def shaped(engine: Engine, shape: DecodeShape) -> Iterator[None]:
    """The engine decodes in ``shape`` inside the block, in its own shape again after."""
    old = engine.decode_shape
    engine.set_decode_shape(shape)
    try:
        yield
    finally:
        engine.set_decode_shape(old)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def row_classes(engine: Engine) -> SweepResult:
    """The probe once more, uncached: the classes must be the engine's."""
    fresh = engine.measure_row_classes()
    ok = fresh == engine.row_classes
    detail = fresh.describe() if ok else (f"measured {fresh.describe()}; the engine decodes "
                                          f"with {engine.row_classes.describe()}")
    return SweepResult(ok, 0.0 if ok else float("inf"), detail)


def decode_runs(engine: Engine, prompt: Sequence[int], feed: Sequence[int]) -> SweepResult:
    """``feed`` after ``prompt`` (on sequence 0, cleared after), fed through a lane in runs
    with guesses, against plain calls of ``min_run`` tokens."""
    shape = engine.shape_for(True)
    engine.clear(0)
    engine.prefill_tokens(0, tuple(prompt), logits=False)
    try:
        with shaped(engine, shape):
            reference = _plain_rows(engine, feed, shape.min_run)
            got, schedule = _speculated_rows(engine, feed, shape)
    finally:
        engine.clear(0)
    worst, first_bad = 0.0, None
    for i, (a, b) in enumerate(zip(reference, got, strict=True)):
        worst = max(worst, _diff(a, b))
        if first_bad is None and not np.array_equal(a, b):
            first_bad = i
    how = f"{len(feed)} tokens in {schedule} ({shape.describe()})"
    return SweepResult(first_bad is None, worst,
                       how if first_bad is None else f"{how}; first differing row {first_bad}")


def _plain_rows(engine: Engine, feed: Sequence[int], per_call: int) -> list[np.ndarray]:
    """Straight to llama.cpp: calls of ``per_call`` tokens on a copy of sequence 0."""
    rows: list[np.ndarray] = []
    with engine.raw_decode(0) as raw:
        for start in range(0, len(feed) - len(feed) % per_call, per_call):
            rows += raw.run_tokens(feed[start:start + per_call])
    return rows


def _speculated_rows(engine: Engine, feed: Sequence[int],
                     shape: DecodeShape) -> tuple[list[np.ndarray], str]:
    """Each call: 1..3 known tokens, then guesses of every length the room allows, every
    third guess list with a wrong token in it (rolled back there).  Returns the rows of
    the feed's tokens in order and a description of the calls."""
    n = len(feed) - len(feed) % shape.min_run
    rows: list[np.ndarray] = []
    calls, rolled_back = 0, 0
    with engine.generating(0) as lane:
        i = 0
        while i < n:
            known = min(1 + calls % 3, n - i)
            room = min(lane.max_guesses, n - i - known)
            n_guess = min(room, calls % (shape.max_run + 1))
            guesses = list(feed[i + known:i + known + n_guess])
            wrong = calls % 3 == 2 and n_guess > 0
            if wrong:  # a wrong token midway: the rows up to it stand, the rest roll back
                at = n_guess // 2
                guesses[at] = (guesses[at] + 1) % engine.n_vocab
            out = lane.feed(list(feed[i:i + known]) + guesses, certain=known)
            good = known + (n_guess // 2 if wrong else n_guess)
            rows += out[:good]
            if n_guess:
                lane.keep(good)
            rolled_back += wrong
            calls += 1
            i += good
    return rows[:n], f"{calls} calls ({rolled_back} with a guess rolled back)"


def speculative_generation(engine: Engine, prompt: Sequence[int], *,
                           max_tokens: int = 24, seeds: Sequence[int] = (0, 1, 2)
                           ) -> SweepResult:
    """Generations under ``ORACLE_GRAMMAR`` with jump-forward and drafts against plain
    decoding (greedy and sampled): same tokens, same logits for every chosen token."""
    shape = engine.shape_for(True)
    worst, bad = 0.0, ""
    params = [SamplingParams(grammar=ORACLE_GRAMMAR)] + [
        SamplingParams(temperature=1.0, seed=s, grammar=ORACLE_GRAMMAR) for s in seeds]
    before = engine.decode_stats()
    engine.clear(0)
    try:
        logits = engine.prefill_tokens(0, tuple(prompt))
        assert logits is not None
        with shaped(engine, shape):
            for p in params:
                plain = _traced(engine, logits, max_tokens, p, PLAIN)
                fast = _traced(engine, logits, max_tokens, p, Drafting())
                d, why = _compare_traces(plain, fast)
                worst = max(worst, d)
                if why and not bad:
                    bad = f"{'greedy' if p.greedy else f'seed {p.seed}'}: {why}"
    finally:
        engine.clear(0)
    s = engine.decode_stats() - before
    how = (f"{len(params)} generations x2, {s.forced} forced, {s.accepted}/{s.drafted} "
           f"drafts confirmed")
    return SweepResult(not bad, worst, how if not bad else f"{how}; {bad}")


def _traced(engine: Engine, logits: np.ndarray, n: int, params: SamplingParams,
            drafting: Drafting) -> list[tuple[int, np.ndarray | None]]:
    trace: list[tuple[int, np.ndarray | None]] = []
    engine.generate(0, logits, n, params, drafting=drafting,
                    trace=lambda t, row: trace.append((t, None if row is None else row.copy())))
    return trace


def _compare_traces(plain: list[tuple[int, np.ndarray | None]],
                    fast: list[tuple[int, np.ndarray | None]]) -> tuple[float, str]:
    if [t for t, _ in plain] != [t for t, _ in fast]:
        return float("inf"), "other tokens"
    worst = 0.0
    for i, ((_, a), (_, b)) in enumerate(zip(plain, fast)):
        if a is None or b is None:
            continue
        worst = max(worst, _diff(a, b))
        if not np.array_equal(a, b):
            return worst, f"token {i} chosen from other logits"
    return worst, ""


def used_shape(engine: Engine) -> str:
    """How the engine decodes, for the report."""
    shape = engine.decode_shape
    return ("runs" if shape.mode is DecodeMode.RUNS else "lanes") + f": {shape.describe()}"
