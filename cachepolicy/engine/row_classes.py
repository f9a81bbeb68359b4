"""Which decode calls compute a row bitwise the same, and the decode shape an engine uses.

llama.cpp picks a matmul kernel by a computation's row count, and some models compute part of
a layer per sequence: qwen35's recurrent blocks project their output (``ssm_out``) once per
sequence, over that sequence's tokens in the call.  So two kinds of calls matter:

* **lane calls** — R generations, one token each (``R`` rows, one token per sequence);
* **run calls** — one generation, ``k`` consecutive tokens (``k`` rows of one sequence).

Row counts that give bitwise-identical rows form classes, measured per model and CPU
(``cachepolicy.engine.row_probe``, cached by the model file's identity).  Measured here (x86
AVX-512, repacking off): f16 lane calls {1} | {2..}; Q8_0 one class; K-quants {1..7} | {8..};
run calls of 2..16 tokens are one class on f16 and Q8_0 (2..7 on K-quants).  A one-token
call is never in the run class: attention multiplies each sequence's queries by its keys,
and ggml takes a vector kernel for one query row and a tiled one for two or more (they sum
in another order: measured equal on most rows and unequal on some, by context length and
tokens — a Q8_0 qwen35 agreed on 63 of 64 probe rows and then differed from the 36th token
of another text on); qwen35's recurrent blocks also project their output per sequence
(``ssm_out``), which on f16 differs on every row.

An engine therefore decodes in one of two shapes (``DecodeShape``), each exact in itself
(``choose_shape``: by default lanes where a lone generation needs no pad row, else runs):

* ``LANES`` — generations share lane calls, one token each, every call padded with empty
  lanes to the smallest row count of one class (``lane_rows``): a lone f16 generation pays
  one pad row, a Q8_0 one none;
* ``RUNS`` — every call holds one generation's run of ``min_run`` (2)..``max_run`` tokens:
  grammar-forced text (jump-forward) and drafted tokens (speculation) ride in the run, and a
  lone token is paired with a guess that is rolled back when it is wrong.  Generations do
  not share calls.  Chosen by default (``free_text_alone``), only generations a grammar
  constrains decode in runs: one without a grammar has no forced text to ride in a run, so
  it decodes alone in one-row calls — the class of its own a one-token call is, never
  shared and never speculated in, so its tokens still do not depend on what else decodes
  (on f16 here a two-row run costs 2.2x a one-row call, and a wrong guess on a recurrent
  model a rollback too).

Pure records and arithmetic; nothing here touches llama.cpp.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

#: The longest run the probe measures (and so the longest a run call may carry).
MAX_RUN_ROWS = 16


def _partition(value: object) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(sorted(int(r) for r in c)) for c in value)  # type: ignore[attr-defined]


@attrs.frozen
class RowClasses:
    """What the probe found on one model and CPU.

    ``lanes`` partitions the lane-call row counts 1..n (n = the lanes measured) into classes
    of bitwise-identical rows; ``runs`` lists the run lengths (2..``MAX_RUN_ROWS``) whose rows
    equal those of the same tokens fed two per call.
    """

    lanes: tuple[tuple[int, ...], ...] = attrs.field(converter=_partition)
    runs: tuple[int, ...] = attrs.field(converter=lambda v: tuple(sorted(int(x) for x in v)))

    def lane_class(self, rows: int) -> tuple[int, ...]:
        for c in self.lanes:
            if rows in c:
                return c
        raise ValueError(f"{rows} lane rows were not measured (classes {self.lanes})")

    @property
    def max_run(self) -> int:
        """The longest run of the class of 2: every length 2..max_run is in it."""
        m = 2
        while m + 1 in self.runs:
            m += 1
        return m

    def as_dict(self) -> dict[str, object]:
        return {"lanes": [list(c) for c in self.lanes], "runs": list(self.runs)}

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> RowClasses:
        return cls(lanes=d["lanes"], runs=d["runs"])  # type: ignore[arg-type]

    def describe(self) -> str:
        lanes = " | ".join(_span(c) for c in self.lanes)
        return f"lane calls {lanes}; runs {_span(self.runs)}"


def _span(rows: Iterable[int]) -> str:
    rows = sorted(rows)
    if rows and rows == list(range(rows[0], rows[-1] + 1)) and len(rows) > 1:
        return f"{{{rows[0]}..{rows[-1]}}}"
    return "{" + ",".join(str(r) for r in rows) + "}"


class DecodeMode(enum.Enum):
    LANES = "lanes"  # generations share calls, one token each
    RUNS = "runs"  # one generation per call, a run of its tokens


@attrs.frozen
class DecodeShape:
    """How an engine's decode calls are formed (every call of every generation alike)."""

    mode: DecodeMode
    lanes: int  # generations decoding at once (each holds one lane)
    lane_rows: tuple[int, ...] = ()  # LANES: the row counts a call may have (one class)
    min_run: int = 1  # RUNS: tokens per call
    max_run: int = 1
    why: str = ""
    #: RUNS: a generation without a grammar decodes alone in one-row calls instead (the
    #: default shape's choice; a shape asked for explicitly runs every generation in runs)
    free_text_alone: bool = False

    def pad_to(self, rows: int) -> int:
        """LANES: the row count a call holding ``rows`` consecutive lanes is padded to."""
        fits = [r for r in self.lane_rows if r >= rows]
        if not fits:
            raise ValueError(f"{rows} rows exceed the lane class {self.lane_rows}")
        return fits[0]

    def describe(self) -> str:
        if self.mode is DecodeMode.LANES:
            return (f"lanes: up to {self.lanes} generations share a call of "
                    f"{_span(self.lane_rows)} rows")
        alone = "; without a grammar one-row calls" if self.free_text_alone else ""
        return (f"runs: each call one generation's {self.min_run}..{self.max_run} tokens "
                f"({self.lanes} generations at once{alone})")


def lane_shape(classes: RowClasses, lanes: int) -> DecodeShape:
    """The lane class with the smallest pad that still lets generations share calls: among
    the classes holding a contiguous span of two counts or more, the one starting lowest;
    the lanes are capped at the span's end.  With no such class, one lane."""
    best: tuple[int, int] | None = None
    for c in classes.lanes:
        lo = hi = c[0]
        while hi + 1 in c:
            hi += 1
        if hi > lo and (best is None or lo < best[0]):
            best = (lo, hi)
    if best is None:
        return DecodeShape(DecodeMode.LANES, 1, (1,), why="no two lane counts compute alike: "
                           "one generation per call")
    lo, hi = best
    n = max(1, min(lanes, hi))
    if n < lo:  # the requested lanes lie below the sharing class: one lane, unpadded
        return DecodeShape(DecodeMode.LANES, n, (n,),
                           why=f"{n} lane(s) requested: generations take turns")
    return DecodeShape(DecodeMode.LANES, n, tuple(range(lo, n + 1)),
                       why=f"lane calls of {_span(range(lo, n + 1))} rows compute a row alike")


def run_shape(classes: RowClasses, lanes: int, *, max_run_cap: int = MAX_RUN_ROWS) -> DecodeShape:
    """Runs of the class of two-token calls, at most ``max_run_cap`` tokens (the prefill
    call's rows: a mixture-of-experts cap)."""
    top = max(2, min(classes.max_run, max_run_cap))
    why = (f"runs of 2..{top} tokens compute a row alike; a one-token call takes another "
           f"attention kernel, so a lone token is paired with a guess, rolled back if wrong")
    return DecodeShape(DecodeMode.RUNS, max(1, lanes), min_run=2, max_run=top, why=why)


def choose_shape(classes: RowClasses, lanes: int, *, runs: bool | None,
                 max_run_cap: int = MAX_RUN_ROWS) -> DecodeShape:
    """``runs`` False: lanes; True: runs; None (auto): lanes where they cost a lone
    generation no pad row (its one-row calls share a class with more rows, as on Q8_0 and
    K-quants here, or there is one lane: nothing is cheaper, and generations that meet
    share calls), else runs — where both shapes cost a lone generation a second row per
    call (f16's one-row calls take another kernel), runs make it a guess that may be right,
    and jump-forward and drafts ride in it; a generation without a grammar then decodes
    alone in one-row calls (``free_text_alone``: nothing forced rides in its runs, and a
    guess rarely pays for its row)."""
    by_lanes = lane_shape(classes, lanes)
    if runs is False or (runs is None and by_lanes.pad_to(1) == 1):
        return by_lanes
    shape = run_shape(classes, lanes, max_run_cap=max_run_cap)
    if runs is None:
        shape = attrs.evolve(shape, free_text_alone=True,
                             why=shape.why + "; a generation without a grammar decodes alone "
                                             "in one-row calls (nothing forced to ride in a run)")
    return shape


def run_chunks(n: int, min_run: int, max_run: int) -> list[int]:
    """Split ``n`` tokens into calls of ``min_run``..``max_run`` (the last may be shorter than
    ``min_run`` only when ``n`` is: the caller pads it)."""
    if n <= max_run:
        return [n]
    k = -(-n // max_run)
    sizes = [max_run] * (k - 1) + [n - max_run * (k - 1)]
    if sizes[-1] < min_run:
        sizes[-2] -= min_run - sizes[-1]
        sizes[-1] = min_run
    return sizes


def feed_chunks(n_known: int, n_guess: int, min_run: int, max_run: int) -> list[int]:
    """Calls for a feed of ``n_known`` tokens then ``n_guess`` guesses: every call holds
    ``min_run``..``max_run`` tokens (the whole feed fewer only if it is: the caller pads it)
    and the guesses all lie in the last call (``n_guess <= max_run - min_run``), so one
    snapshot before that call is enough to roll them back."""
    total = n_known + n_guess
    if total <= max_run:
        return [total]
    if n_guess > max_run - min_run:
        raise ValueError(f"{n_guess} guesses after {n_known} known tokens do not fit one "
                         f"call (runs of {min_run}..{max_run})")
    last = max_run
    rest = total - last
    if rest < min_run:
        last -= min_run - rest
        rest = min_run
    return run_chunks(rest, min_run, max_run) + [last]
