"""The engine's own record of what each sequence holds: its runs (text or embedding spans,
with chained digests), from which its next position, token count and history follow.

This is the engine's bookkeeping, updated only by the engine's parts under its lock; the
scheduler's published cache states are a separate account that must agree with it.
"""

from __future__ import annotations

from cachepolicy.engine.checkpoint import Run, history_digest
from cachepolicy.engine.records import SeqInfo


class Sequences:
    def __init__(self, n_seq_max: int) -> None:
        self._runs: dict[int, list[Run]] = {s: [] for s in range(n_seq_max)}
        #: a ``seq_add`` moved cells since the last llama_decode: llama.cpp re-rotates their
        #: keys only at the next decode (any sequence's), so until then a serialised state
        #: would hold the new positions with the old keys
        self.shift_pending = False

    def runs(self, seq: int) -> list[Run]:
        """The (mutable) run list of ``seq``; ValueError for an id out of range."""
        if seq not in self._runs:
            raise ValueError(f"sequence id {seq} out of range 0..{len(self._runs) - 1}")
        return self._runs[seq]

    def replace(self, seq: int, runs: list[Run]) -> None:
        self.runs(seq)
        self._runs[seq] = runs

    def next_pos(self, seq: int) -> int:
        runs = self.runs(seq)
        return runs[-1].end_pos if runs else 0

    def n_tokens(self, seq: int) -> int:
        return sum(r.n_tokens for r in self.runs(seq))

    def info(self, seq: int) -> SeqInfo:
        runs = tuple(self.runs(seq))
        return SeqInfo(seq=seq, next_pos=runs[-1].end_pos if runs else 0,
                       n_tokens=sum(r.n_tokens for r in runs), digest=history_digest(runs),
                       history=runs)

    def non_empty(self) -> list[int]:
        return [s for s, runs in self._runs.items() if runs]
