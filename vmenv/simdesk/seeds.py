"""Which seeds train and which evaluate: a fixed hash rule over every non-negative seed.

A seed is an *evaluation* seed when the 64-bit BLAKE2b hash of its 8 little-endian bytes
(personalised ``simdesk-split``) is divisible by ``EVAL_MODULUS`` — one seed in eight, spread
over the whole range, the same for every task kind and every screen size.  All other seeds
train.  ``train_seeds`` never yields an evaluation seed and ``eval_seeds`` never a training
one, whatever range a caller walks; the rule never changes (changing it would leak
evaluation layouts into training sets made before).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from typing import Literal

Split = Literal["train", "eval"]
EVAL_MODULUS = 8
MAX_SEED = 2**63 - 1


def _check(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"a simdesk seed is an int in 0..{MAX_SEED}, got {seed!r}")
    return seed


def seed_split(seed: int) -> Split:
    """"eval" or "train" (raises ``ValueError`` for a negative, huge or non-int seed)."""
    digest = hashlib.blake2b(_check(seed).to_bytes(8, "little"), digest_size=8,
                             person=b"simdesk-split").digest()
    return "eval" if int.from_bytes(digest, "little") % EVAL_MODULUS == 0 else "train"


def is_eval_seed(seed: int) -> bool:
    return seed_split(seed) == "eval"


def train_seeds(start: int = 0) -> Iterator[int]:
    """Training seeds from ``start`` upwards, in order (endless)."""
    return (s for s in itertools.count(_check(start)) if seed_split(s) == "train")


def eval_seeds(n: int, start: int = 0) -> tuple[int, ...]:
    """The first ``n`` evaluation seeds from ``start`` upwards."""
    it = (s for s in itertools.count(_check(start)) if seed_split(s) == "eval")
    return tuple(itertools.islice(it, n))
