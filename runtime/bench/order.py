"""The order in which side-by-side benchmarks alternate their variants."""

from __future__ import annotations


def abba(repeats: int) -> list[tuple[int, int]]:
    """(repeat, variant index) of two variants in ABBA order — A B, B A, A B, … — so that a
    drift in the machine's load during a run weighs on both variants alike."""
    out = []
    for r in range(repeats):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        out += [(r, v) for v in order]
    return out
