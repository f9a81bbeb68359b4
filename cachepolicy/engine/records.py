"""Plain records and pure helpers of the engine (no llama.cpp in here)."""

from __future__ import annotations

import os

import attrs
import numpy as np

from cachepolicy.checkpoint import GENESIS, Run, RunKind, chain_digest
from cachepolicy.errors import UnsafeEditError


def chunk_sizes(n: int, n_batch: int) -> list[int]:
    """Split ``n`` rows into batches of at most ``n_batch``, never leaving a 1-row batch."""
    if n <= n_batch:
        return [n]
    k = -(-n // n_batch)
    sizes = [n_batch] * (k - 1) + [n - n_batch * (k - 1)]
    if sizes[-1] == 1:  # move one row over: both batches stay multi-row
        sizes[-2] -= 1
        sizes[-1] = 2
    return sizes


#: Bounds on the sizes that reach llama.cpp (its context fields are 32-bit; far beyond
#: these a value is a typo, and llama.cpp fails in odd ways or allocates without limit).
MAX_N_CTX_PER_SEQ = 1 << 20  # 1M positions, the longest context models are trained for
MAX_N_SEQ = 256  # llama.cpp's LLAMA_MAX_SEQ
MAX_N_BATCH = 8192
MAX_THREADS = 256  # libgomp fails far beyond the core count (100000 threads: a segfault)


def _within(low: int, high: int) -> object:
    def check(_inst: object, attr: attrs.Attribute, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(f"{attr.name} must be an integer in {low}..{high}, got {value!r}")
    return check


@attrs.frozen
class EngineConfig:
    """The engine's sizes, validated at construction (before anything is loaded):
    ``n_batch`` 2..8192 (a 1-row batch takes another kernel), ``n_ctx_per_seq`` n_batch..1M,
    ``n_seq_max`` 1..256, ``n_threads`` 1..256 — so ``n_ctx = n_ctx_per_seq * n_seq_max``
    stays far inside llama.cpp's 32-bit fields.  What such a context costs in memory is
    ``cachepolicy.engine.sizing``'s estimate."""

    n_ctx_per_seq: int = attrs.field(default=8192, validator=_within(2, MAX_N_CTX_PER_SEQ))
    n_seq_max: int = attrs.field(default=4, validator=_within(1, MAX_N_SEQ))
    #: also n_ubatch: llama.cpp never re-splits our batches
    n_batch: int = attrs.field(default=512, validator=_within(2, MAX_N_BATCH))
    n_threads: int = attrs.field(factory=lambda: max(1, os.cpu_count() or 1),
                                 validator=_within(1, MAX_THREADS))
    image_cache_bytes: int = attrs.field(default=256 * 2**20,
                                         validator=_within(0, 1 << 50))
    verbose: bool = False
    # Only for demonstrating what the oracle catches: with flash attention on, a split prefill
    # is no longer bitwise equal to a one-call prefill.
    flash_attn: bool = False

    def __attrs_post_init__(self) -> None:
        if self.n_ctx_per_seq < self.n_batch:
            raise ValueError(f"n_ctx_per_seq ({self.n_ctx_per_seq}) must be at least n_batch "
                             f"({self.n_batch})")

    @property
    def n_ctx(self) -> int:
        """The whole context llama.cpp allocates: every sequence's share."""
        return self.n_ctx_per_seq * self.n_seq_max


@attrs.frozen
class MemoryReport:
    """Bytes the engine holds, as llama.cpp reports them (sequence state sizes)."""

    kv_bytes_per_token: int  # attention layers only: what one more KV cell costs
    recurrent_bytes_per_seq: int  # the O(1) recurrent state (0 on attention-only models)
    seq_state_bytes: dict[int, int]  # llama_state_seq_get_size of each non-empty sequence
    live_checkpoints: int
    live_checkpoint_bytes: int
    image_cache_bytes: int

    @property
    def total_held(self) -> int:
        return (sum(self.seq_state_bytes.values()) + self.live_checkpoint_bytes
                + self.image_cache_bytes)


@attrs.frozen
class SeqInfo:
    seq: int
    next_pos: int
    n_tokens: int
    digest: bytes
    history: tuple[Run, ...]


def history_prefix_at(hist: list[Run], pos: int) -> list[Run]:
    """The runs that make up the first ``pos`` positions (a text run may be split)."""
    keep: list[Run] = []
    for run in hist:
        if run.end_pos <= pos:
            keep.append(run)
            continue
        if run.pos0 < pos:
            if run.kind is not RunKind.TEXT:
                raise UnsafeEditError(f"position {pos} falls inside an image")
            toks = np.asarray(run.tokens[: pos - run.pos0], dtype=np.int32)
            prev = keep[-1].digest if keep else GENESIS
            keep.append(Run(RunKind.TEXT, run.pos0, len(toks), len(toks),
                            chain_digest(prev, RunKind.TEXT, toks.tobytes()),
                            tuple(int(t) for t in toks)))
        break
    return keep

