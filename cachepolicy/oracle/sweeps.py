"""Sweeping checks of the exactness oracle: many split points, chunk remainders, short pieces.

One split point can miss a kernel that depends on a batch's row count: a prompt may happen to
split where both sides take the same kernel.  These checks try every split point of a short
prompt (every length mod 16), every chunk remainder of a piece longer than ``n_batch``, and
pieces shorter than ``MIN_CHUNK_ROWS``; each is one named result whose ``max_abs_diff`` is
the worst over its paths and whose ``detail`` names the first path that differed.

The contract they check (``cachepolicy.engine``): pieces of at least ``MIN_CHUNK_ROWS`` rows
split anywhere equal one call; pieces of any length equal themselves after a restore.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from cachepolicy.engine import Engine
from cachepolicy.engine.records import MIN_CHUNK_ROWS

Tokens = tuple[int, ...]
#: sets sequence ``seq`` up (from empty) before a path's pieces are prefilled
Prepare = Callable[[int], None]

#: the longest short piece the probe tries (pieces of MIN_CHUNK_ROWS.. rows are swept anyway)
PROBE_ROWS = 2 * MIN_CHUNK_ROWS - 1


def remainder_tokens(n_batch: int) -> int:
    """How many tokens ``Sweeper.chunk_remainders`` needs."""
    return sum(n_batch + k for k in range(1, 17)) + 2 * MIN_CHUNK_ROWS


@attrs.frozen
class SweepResult:
    """Worst case over the paths of one sweep."""

    bitwise: bool
    max_abs_diff: float
    detail: str


def _diff(ref: np.ndarray, got: np.ndarray) -> float:
    return float(np.max(np.abs(ref.astype(np.float64) - got.astype(np.float64))))


class Sweeper:
    """Runs prefill paths on an engine's sequences 0 and 1 (both cleared before each path)."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine

    def fresh(self) -> None:
        for s in range(self.e.config.n_seq_max):
            self.e.clear(s)

    def run(self, prepare: Prepare | None, pieces: Sequence[Tokens], *, seq: int = 0,
            restore_after: int | None = None) -> np.ndarray:
        """Prefill ``pieces`` one engine call each; return the last piece's logits.

        With ``restore_after=k`` the first k pieces go to sequence 0, which is checkpointed,
        cleared and restored into sequence 1 before the rest (restore-and-continue).
        """
        self.fresh()
        if prepare is not None:
            prepare(seq)
        logits = None
        for i, piece in enumerate(pieces):
            if restore_after is not None and i == restore_after:
                ckpt = self.e.checkpoint(seq)
                self.e.clear(seq)
                seq = 1 - seq
                self.e.restore(seq, ckpt)
            logits = self.e.prefill_tokens(seq, piece, logits=i == len(pieces) - 1,
                                           allow_single=True)
        assert logits is not None
        self.fresh()
        return logits

    def sweep(self, ref: np.ndarray, paths: dict[str, Callable[[], np.ndarray]]) -> SweepResult:
        """Every path against one reference."""
        return self.pairs({label: (lambda p=path: (ref, p())) for label, path in paths.items()})

    @staticmethod
    def pairs(cases: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]]) -> SweepResult:
        """Each case computes its own (reference, result) pair."""
        worst, first_bad = 0.0, ""
        for label, case in cases.items():
            ref, got = case()
            if not np.array_equal(ref, got):
                worst = max(worst, _diff(ref, got))
                first_bad = first_bad or label
        ok = not first_bad
        return SweepResult(ok, worst, f"{len(cases)} paths" + ("" if ok else f"; first: {first_bad}"))

    # ------------------------------------------------------------------ the sweeps

    def split_points(self, x: Tokens, prepare: Prepare | None = None) -> SweepResult:
        """``x`` in two pieces, the first of MIN_CHUNK_ROWS..+15 rows (every length mod 16;
        so is the second's if ``x`` has 48 tokens), both at least MIN_CHUNK_ROWS rows."""
        ref = self.run(prepare, [x])
        cuts = range(MIN_CHUNK_ROWS, min(MIN_CHUNK_ROWS + 16, len(x) - MIN_CHUNK_ROWS + 1))
        return self.sweep(ref, {f"split at {c}": (lambda c=c: self.run(prepare, [x[:c], x[c:]]))
                                for c in cuts})

    def chunk_remainders(self, z: Tokens) -> SweepResult:
        """Pieces of n_batch + k rows for k = 1..16 (every remainder mod 16), one after the
        other behind a short head and before a short tail, against one call of all of it.
        The engine must chunk each long piece so that no chunk falls below MIN_CHUNK_ROWS rows;
        one path puts the 16 remainder chunks at 16 different positions, since whether a
        short chunk changes any bits depends on where it is.  ``z`` needs
        ``remainder_tokens(n_batch)`` tokens."""
        n_batch = self.e.config.n_batch
        pieces, off = [z[:MIN_CHUNK_ROWS]], MIN_CHUNK_ROWS
        for k in range(1, 17):
            pieces.append(z[off:off + n_batch + k])
            off += n_batch + k
        pieces.append(z[off:off + MIN_CHUNK_ROWS])
        ref = self.run(None, [z[:off + MIN_CHUNK_ROWS]])
        return self.sweep(ref, {"pieces of n_batch+1..16 rows": lambda: self.run(None, pieces)})

    def restore_points(self, x: Tokens) -> SweepResult:
        """Checkpoint after a first piece of every length MIN_CHUNK_ROWS..+15, restore into the
        other sequence, continue with the rest: equal to the same two pieces uninterrupted."""
        cuts = range(MIN_CHUNK_ROWS, min(MIN_CHUNK_ROWS + 16, len(x) - 1))
        return self.pairs({f"restore at {c}": (lambda c=c: (
            self.run(None, [x[:c], x[c:]]), self.run(None, [x[:c], x[c:]], restore_after=1)))
            for c in cuts})

    def short_pieces_restore(self, head: Tokens, y: Tokens, tail: Tokens) -> SweepResult:
        """Pieces of 1..7 rows (a 1-token piece included), restored after each of them in
        turn: equal to the same pieces prefilled without interruption."""
        pieces: list[Tokens] = [head]
        off = 0
        for n in range(1, MIN_CHUNK_ROWS):
            pieces.append(y[off:off + n])
            off += n
        pieces.append(tail)
        ref = self.run(None, pieces)
        return self.sweep(ref, {f"restore after piece {k}": (
            lambda k=k: self.run(None, pieces, restore_after=k)) for k in range(1, len(pieces))})

    def short_piece_rows(self, head: Tokens, y: Tokens) -> list[int]:
        """Which piece lengths r (1..PROBE_ROWS) are NOT bitwise a one-call prefill here: the
        path head | y[:r] against head + y[:r] in one call (the logits come from the short
        batch itself, where a kernel difference shows most).  Information about the model and
        CPU (its kernel classes), not a check of the contract: a sample, since whether a
        short batch changes any bits depends on the data."""
        bad = []
        for r in range(1, PROBE_ROWS + 1):
            ref = self.run(None, [head + y[:r]])
            if not np.array_equal(ref, self.run(None, [head, y[:r]])):
                bad.append(r)
        return bad
