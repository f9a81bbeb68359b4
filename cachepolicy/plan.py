"""What a policy decides for one step: immutable records, no effects.

``select`` (pure) turns (log, cache view) into a ``Plan``; the executor carries it out.
"""

from __future__ import annotations

import enum

import attrs

from cachepolicy.engine.checkpoint import Checkpoint, CheckpointKind, ModelKind
from cachepolicy.engine.kv_patch import StoredKv
from cachepolicy.context_log import Segment
from cachepolicy.engine.records import SeqInfo
from cachepolicy.pieces import Piece
from cachepolicy.splice import Splice


@attrs.frozen
class ModelInfo:
    """What policies may know about the model (taken from the engine at configuration)."""

    kind: ModelKind
    kv_bytes_per_token: int
    recurrent_bytes_per_seq: int
    state_overhead_bytes: int  # a sequence state's size at zero tokens (headers, recurrent)
    n_embd: int
    n_vocab: int
    #: why the model's cached KV cannot be re-rotated and patched (None: it can; the
    #: splicing policies are refused otherwise)
    kv_edit_problem: str | None = None
    #: why llama.cpp cannot shift the model's cached positions (None: it can; relocate is
    #: refused otherwise)
    shift_problem: str | None = None
    #: why window-replay cannot keep the model's retained screenshots' attention KV (None:
    #: it can; ``kv_access.window_problem``)
    window_problem: str | None = "not asked"

    def state_bytes(self, n_tokens: int) -> int:
        return self.state_overhead_bytes + n_tokens * self.kv_bytes_per_token

    def checkpoint_bytes(self, kind: CheckpointKind, n_tokens: int) -> int:
        if kind is CheckpointKind.PARTIAL_ONLY:
            return self.recurrent_bytes_per_seq
        return self.state_bytes(n_tokens)


@attrs.frozen
class NamedCheckpoint:
    label: str  # e.g. "region" (terminal-slot's anchor) or "prompt_end" (noevict)
    checkpoint: Checkpoint = attrs.field(eq=False)

    @property
    def nbytes(self) -> int:
        return self.checkpoint.nbytes


@attrs.frozen
class StoredEntry:
    """One screenshot's entry in an episode's store: its canonical KV and conditioning
    patch (``cachepolicy.splice``), held in host memory, counted by the ledger."""

    label: str  # the screenshot segment's key
    kv: StoredKv = attrs.field(eq=False)
    #: the screenshot's pixels (``Piece.image_id``) and where its image piece lies in the
    #: entry: (offset from the entry's first position, positions) — what a recall places
    image_id: str | None = None
    image_part: tuple[int, int] | None = None

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


@attrs.frozen
class CacheState:
    """An episode's published cache assets.  Generation 0 with nothing = a fresh episode."""

    generation: int = 0
    checkpoints: tuple[NamedCheckpoint, ...] = ()
    seq_bytes: int = 0  # the sequence's state size when published (as llama.cpp reports)
    layout_keys: tuple[str, ...] = ()  # piece keys the sequence holds, in order (relocate)
    # Where the sequence can be cut while idle without costing the next step any reuse
    # (terminal-slot: the region checkpoint; scratch policies: 0).  Memory pressure uses it.
    trim_pos: int = 0
    #: the cut may drop the recurrent state too (``Engine.replay_cut`` with the zero base):
    #: the next step replays a tail before ``trim_pos`` anyway (tail-replay, no checkpoints)
    trim_forgets: bool = False
    #: the memory ladder's replay rung dropped this state's checkpoints or recurrent state:
    #: the next step is planned by the episode's tail-replay variant of its policy
    replay_next: bool = False
    #: the screenshot store (kamera): entries made and not yet placed (a stopped prefetch's),
    #: and with ``+recall`` the entries retained for a later recall
    stored: tuple[StoredEntry, ...] = ()
    #: kamera: the screenshots whose rows in the sequence are store-written (canonical +
    #: patch), re-rotated from there at the next slide
    placed: tuple[str, ...] = ()

    @property
    def checkpoint_bytes(self) -> int:
        return sum(c.nbytes for c in self.checkpoints)

    @property
    def stored_bytes(self) -> int:
        return sum(s.nbytes for s in self.stored)

    @property
    def held_bytes(self) -> int:
        return self.seq_bytes + self.checkpoint_bytes + self.stored_bytes

    def emptied(self) -> CacheState:
        """This state once its sequence is cleared (an episode closed or evicted): nothing
        held — no checkpoints, no sequence bytes, no screenshot store — so ``held_bytes``
        is 0 and the ledger's 0 is true; the generation and flags stay."""
        return attrs.evolve(self, checkpoints=(), seq_bytes=0, layout_keys=(), trim_pos=0,
                            stored=(), placed=())


@attrs.frozen
class CacheView:
    """What ``select`` sees: the published state and what the sequence really holds now."""

    state: CacheState
    seq: SeqInfo


class StartKind(enum.Enum):
    CLEAR = "clear"  # empty the sequence, prefill everything
    KEEP = "keep"  # the sequence already is a prefix of the prompt
    TRIM = "trim"  # attention-only: cut the sequence back to a run boundary
    TRUNCATE = "truncate"  # hybrid: PARTIAL_ONLY checkpoint + attention trim
    RESTORE = "restore"  # load a FULL checkpoint
    #: APPROXIMATE (tail replay, ``cachepolicy.tail``): keep the attention KV up to ``pos``,
    #: recurrent state from ``checkpoint`` (an older PARTIAL_ONLY one) or zero
    REPLAY = "replay"


@attrs.frozen
class Start:
    kind: StartKind
    pos: int = 0
    checkpoint: Checkpoint | None = attrs.field(default=None, eq=False)


@attrs.frozen
class RemoveSpan:
    """Relocate's edit: drop positions [p0, p1) and shift later positions down."""

    p0: int
    p1: int


@attrs.frozen
class Replay:
    """A tail replay: the attention KV kept up to position ``cut``, the recurrent state from
    position ``base`` (0: zero), ``rows`` rows of the matched prefix (of ``matched`` rows,
    which ends at the true point of divergence) prefilled again."""

    cut: int
    base: int
    rows: int
    matched: int


@attrs.frozen
class TakeCheckpoint:
    after_piece: int  # take it once pieces[:after_piece] are in the sequence
    kind: CheckpointKind
    label: str


@attrs.frozen
class ByteForecast:
    """Bytes live at the transaction's peak.

    The parent's checkpoints stay live until publication; the sequence's KV cells are edited in
    place, so the sequence costs the larger of its size before and after; new checkpoints and
    the workspace (logits, and one image's rows: retained screenshots' rows live in the
    embedding cache, whose capacity the scheduler holds; at most the image being prefilled
    may be outside it; a decoding plan's run of logits rows and, on recurrent models, the
    lane snapshot its rollbacks restore) come on top.  An upper bound.
    """

    parent_bytes: int  # already held by the published state (sequence + checkpoints)
    parent_seq_bytes: int  # the part of parent_bytes that is the sequence itself
    successor_seq_bytes: int  # the sequence after the step (decoded tokens included)
    new_checkpoint_bytes: int
    workspace_bytes: int

    @property
    def peak_bytes(self) -> int:
        return (self.parent_bytes - self.parent_seq_bytes
                + max(self.parent_seq_bytes, self.successor_seq_bytes)
                + self.new_checkpoint_bytes + self.workspace_bytes)

    @property
    def extra_bytes(self) -> int:
        """What must be reserved on top of what the parent already holds."""
        return self.peak_bytes - self.parent_bytes


@attrs.frozen
class Plan:
    policy: str
    generation: int  # the log generation this plan renders
    visible: tuple[Segment, ...] = attrs.field(eq=False)  # the segments shown, in order
    pieces: tuple[Piece, ...]  # the whole prompt, in order
    start: Start
    reused_pieces: int  # pieces[:reused_pieces] are already in the sequence after ``start``
    edits: tuple[RemoveSpan, ...]
    checkpoints: tuple[TakeCheckpoint, ...]
    keep: tuple[str, ...]  # labels of the parent's checkpoints the successor keeps
    forecast: ByteForecast
    decode: bool = True  # False for prefetch plans: prefill only
    trim_after: int = 0  # pieces[:trim_after] are what the next step can reuse
    # relocate: the exact reference prompt (terminal-scratch's pieces) to measure drift against
    drift_reference: tuple[Piece, ...] = attrs.field(default=(), eq=False)
    #: planned by content (``cachepolicy.tail``): the sequence's runs need not be one per
    #: piece, so positions are the pieces' (``position_after``)
    tail: bool = False
    replay: Replay | None = None  # this plan's tail replay (start REPLAY)
    trim_forgets: bool = False  # see ``CacheState.trim_forgets``
    #: approximate KV splicing (attention-only: kamera, random-evict, recency-evict)
    splice: Splice | None = None
    #: the parent's store entries the placed units read (``Splice.place`` from the store)
    splice_from: tuple[StoredEntry, ...] = attrs.field(default=(), eq=False)

    @property
    def prefill(self) -> tuple[Piece, ...]:
        return self.pieces[self.reused_pieces:]

    @property
    def prefill_tokens(self) -> int:
        return sum(p.n_tokens for p in self.prefill)

    @property
    def reused_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces[: self.reused_pieces])

    @property
    def context_tokens(self) -> int:
        return sum(p.n_tokens for p in self.pieces)

    def position_after(self, n_pieces: int) -> int:
        """The position after ``pieces[:n_pieces]`` (a prompt starts at position 0)."""
        return sum(p.n_pos for p in self.pieces[:n_pieces])



@attrs.frozen
class PolicyManifest:
    """A policy's declared contract (docs/runtime.md, "Cache policies")."""

    changes: str  # the state it changes
    evidence: str  # what it uses to decide
    adds_work: str  # the work it adds
    omitted_recoverable: bool  # can omitted history be brought back exactly?
    quality: str  # "exact" or "approximate"
    bounded: bool
    supports: frozenset[ModelKind]
    #: may the fallback ladder re-lay a step in terminal layout with fewer screenshots?
    #: False where the prompt is not the policy's to change (faithful: the client's own)
    may_degrade: bool = True
    #: do its plans prefill a reference prompt on a spare sequence beside the episode's
    #: (``Plan.drift_reference``: relocate measures its drift)?  The scheduler's owner then
    #: asks it for one (``Scheduler(spare_sequence=True)``); without one the plans run
    #: unmeasured
    needs_scratch_sequence: bool = False
    #: do its edits shift cached positions (``seq_add``)?  Refused where llama.cpp will not
    #: (``ModelInfo.shift_problem``: multi-section RoPE)
    shifts_positions: bool = False
