"""Unit codes of low mutual coherence: what a designed match compares (the word copy's word
codes, the recogniser's class codes), so that the code asked for outscores every other."""

from __future__ import annotations

import numpy as np

__all__ = ["spread_codes"]


def spread_codes(n: int, width: int, seed: int) -> np.ndarray:
    """``n`` unit vectors in ``width`` dims, pushed apart (a few hundred steps of descent on
    their squared cosines): deterministic from ``seed``, numpy only (the same on every
    machine and core count)."""
    rng = np.random.default_rng(seed)
    c = rng.normal(size=(n, width))
    c /= np.linalg.norm(c, axis=1, keepdims=True)
    for _ in range(300):
        gram = c @ c.T
        np.fill_diagonal(gram, 0.0)
        c -= 0.05 * gram @ c
        c /= np.linalg.norm(c, axis=1, keepdims=True)
    return c.astype(np.float32)
