"""Immutable records describing what a sequence holds: runs of fed content and checkpoints.

A sequence's history is a tuple of ``Run`` records, one per prefill call or decoded token.
Each run carries a digest chained over everything fed before it, so two histories that share
a prefix share the digests of that prefix.  Checkpoints carry the history they were taken at;
the engine uses that to refuse a truncate through a checkpoint of another history (which
would splice two unrelated states together without any error from llama.cpp).
"""

from __future__ import annotations

import enum
import hashlib

import attrs


class ModelKind(enum.Enum):
    """What kind of memory the model's layers keep."""

    ATTENTION = "attention"  # every layer keeps a KV cache: positions can be trimmed freely
    HYBRID = "hybrid"  # recurrent layers (O(1) state) plus some attention layers
    RECURRENT = "recurrent"  # recurrent layers only

    @property
    def has_recurrent_state(self) -> bool:
        return self is not ModelKind.ATTENTION


class CheckpointKind(enum.Enum):
    FULL = "full"  # the whole sequence state: attention KV and recurrent state
    PARTIAL_ONLY = "partial_only"  # the recurrent state only (llama.cpp's PARTIAL_ONLY flag)


class RunKind(enum.Enum):
    TEXT = "text"  # token ids, one position each
    EMBEDDINGS = "embeddings"  # embedding rows (an image), positions given explicitly
    #: no rows: the recurrent state was set to a base that did not absorb everything before
    #: this point (an approximate edit, ``cachepolicy.engine.replay``).  Its digest chains
    #: over the base, so every later digest differs from any exact history's
    REBASE = "rebase"


@attrs.frozen
class Run:
    """One contiguous piece of content fed to a sequence."""

    kind: RunKind
    pos0: int  # first position the run occupies
    n_pos: int  # positions the run advances (for images under M-RoPE: fewer than n_tokens)
    n_tokens: int  # KV cells / rows the run occupies
    digest: bytes  # chained digest of the whole history up to and including this run
    tokens: tuple[int, ...] = ()  # the token ids of a TEXT run (lets a trim split the run)
    #: a removal before the run shifted its positions (``remove_range``: relocate, the token
    #: evictors): its KV was computed elsewhere, beside content that is gone — the sequence
    #: holds an approximate state while it holds this run (``holds_shift``)
    shifted: bool = False

    @property
    def end_pos(self) -> int:
        return self.pos0 + self.n_pos


GENESIS = b"\x00" * 16


def chain_digest(previous: bytes, kind: RunKind, content_id: bytes) -> bytes:
    """Digest of a history extended by one run: content identity chained onto the prefix."""
    h = hashlib.blake2b(digest_size=16)
    h.update(previous)
    h.update(kind.value.encode())
    h.update(content_id)
    return h.digest()


def history_digest(history: tuple[Run, ...]) -> bytes:
    return history[-1].digest if history else GENESIS


def is_approximate(history: tuple[Run, ...] | list[Run]) -> bool:
    """Whether a sequence with this history holds an approximate state: some run was fed
    after its recurrent state was rebased (a ``REBASE`` run), or it ends rebased."""
    return any(r.kind is RunKind.REBASE for r in history)


def holds_shift(history: tuple[Run, ...] | list[Run]) -> bool:
    """Whether a sequence with this history holds KV a removal shifted (an approximate state
    on any model: what follows such a run attended to it)."""
    return any(r.shifted for r in history)


def without_trailing_rebase(history: tuple[Run, ...] | list[Run]) -> tuple[Run, ...]:
    """The history without the ``REBASE`` runs at its end: what the attention KV holds.  A
    rebase at the end describes only the recurrent state, which a restore replaces."""
    out = list(history)
    while out and out[-1].kind is RunKind.REBASE:
        out.pop()
    return tuple(out)


@attrs.frozen(eq=False)
class Checkpoint:
    """A snapshot of one sequence's state, restorable into the same or another sequence.

    ``pos`` is the next position the sequence would fill (not a token count: under M-RoPE an
    image's tokens advance the position by fewer than their count).
    """

    data: bytes = attrs.field(repr=lambda d: f"<{len(d)} bytes>")
    kind: CheckpointKind
    pos: int
    n_tokens: int
    history: tuple[Run, ...]
    model_id: str  # the engine's model identity: a checkpoint never crosses models

    @property
    def nbytes(self) -> int:
        return len(self.data)

    @property
    def digest(self) -> bytes:
        return history_digest(self.history)
