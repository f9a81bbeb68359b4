"""The cache-policy interface and the shared planning helpers (the name registry is
``cachepolicy.policies.registry``, beside the policies).

A policy is configured once per model (``ModelInfo``, ``PromptKit``, window size) and then
``select(log, view) -> Plan`` is a pure function: it reads immutable records and returns one.
"""

from __future__ import annotations

import abc
import copy
from collections.abc import Sequence
from typing import ClassVar

import attrs

from cachepolicy.engine.checkpoint import CheckpointKind, ModelKind
from cachepolicy.engine.row_classes import MAX_RUN_ROWS
from cachepolicy.context_log import ContextLog
from cachepolicy.errors import PolicyError, PolicyRefusedError
from cachepolicy.layouts import PromptKit
from cachepolicy.pieces import Piece, digests, n_tokens, shown_keys
from cachepolicy.plan import (
    ByteForecast, CacheView, ModelInfo, Plan, PolicyManifest, RemoveSpan, Start, StartKind,
    TakeCheckpoint,
)
from cachepolicy.reuse import best_start
from cachepolicy.tail import ReplayBudget, on_history, position_after, tail_start

_FLOAT = 4
_ATTENTION = ModelKind.ATTENTION


class CachePolicy(abc.ABC):
    """Decides, per step, what the model sees and how much cached state is reused."""

    name: ClassVar[str]
    manifest: ClassVar[PolicyManifest]
    #: False for a layout whose segments hold the generation prompt themselves (faithful)
    adds_generation_prompt: ClassVar[bool] = True
    #: the replay budget of an approximate (tail-replay) policy when none is given; None for
    #: the exact ones, which take a budget only through ``with_tail``
    default_tail: ClassVar[ReplayBudget | None] = None
    #: the policy takes an ``option`` (``parse_option``: kamera's patch rank, the token
    #: evictors' share kept); bench arms name it ``<policy>@<option>``
    takes_option: ClassVar[bool] = False
    #: the policy lays out a window that may keep the episode's first screenshots
    #: (``pinned``, ``cachepolicy.layouts.window_of``); the chat layouts (evict, noevict,
    #: faithful) do not
    pins: ClassVar[bool] = False

    @classmethod
    def parse_option(cls, text: str) -> object:
        """The value of the policy's option ``text``; ValueError when it is not one."""
        raise ValueError(f"policy {cls.name!r} takes no option")

    @classmethod
    def pinning_problem(cls, window: int, pinned: int) -> str | None:
        """What is wrong with pinning the first ``pinned`` screenshots in a window of
        ``window`` under this policy, or None (the one statement of the rule: the policy,
        its configuration and the bench's arms all ask here)."""
        if pinned and not cls.pins:
            return f"policy {cls.name!r} cannot pin screenshots in its window"
        if not 0 <= pinned < window:
            return (f"a window of {window} has no room for the newest screenshot beside "
                    f"{pinned} pinned (pinned must be 0..{window - 1})")
        return None

    def __init__(self, model: ModelInfo, kit: PromptKit, *, window: int = 3,
                 decode_tokens: int = 16, tail: ReplayBudget | None = None,
                 measure_drift: bool = False, pinned: int = 0) -> None:
        if model.kind not in self.manifest.supports:
            supported = ", ".join(sorted(k.value for k in self.manifest.supports))
            raise PolicyRefusedError(
                f"policy {self.name!r} does not support {model.kind.value} models "
                f"(supports: {supported}); {self.manifest.changes}")
        if self.manifest.shifts_positions and model.shift_problem is not None:
            raise PolicyRefusedError(f"policy {self.name!r} cannot run on this model: "
                                     f"{model.shift_problem}")
        if window < 1:
            raise PolicyError("window must be >= 1 screenshot")
        if (problem := self.pinning_problem(window, pinned)) is not None:
            raise PolicyError(problem)
        if tail is not None and self.default_tail is None:
            raise PolicyError(f"policy {self.name!r} is exact: it takes no replay budget "
                              "(its approximate variant: with_tail)")
        self.model, self.kit, self.window, self.decode_tokens = model, kit, window, decode_tokens
        #: the episode's first ``pinned`` screenshots stay in the window to its end
        self.pinned = pinned
        #: plan by content and replay a tail where no exact restore point reaches
        #: (``cachepolicy.tail``); None: the exact planner only
        self.tail: ReplayBudget | None = tail if tail is not None else self.default_tail
        #: an approximate policy's plans carry their layout's exact prompt as the drift
        #: reference (next-token KL and top-1 on a spare sequence): opt-in, since it is a
        #: from-scratch prefill more per step — behind a server it would undo what the
        #: policy saves
        self.measure_drift = measure_drift
        if measure_drift:
            if self.tail is None and self.manifest.quality != "approximate":
                raise PolicyError(f"policy {self.name!r} is exact: nothing to measure")
            self.manifest = attrs.evolve(self.manifest, needs_scratch_sequence=True)

    def with_tail(self, budget: ReplayBudget) -> CachePolicy | None:
        """This policy's tail-replay variant — the same layout and checkpoints, planned by
        content with ``budget`` where no exact restore point reaches, its manifest
        ``approximate`` — or None on a model without a recurrent state (there every trim is
        exact).  What the memory ladder's replay rung plans an episode's next step with."""
        if not self.model.kind.has_recurrent_state:
            return None
        twin = copy.copy(self)
        twin.tail = budget
        twin.manifest = attrs.evolve(self.manifest, quality="approximate",
                                     supports=self.manifest.supports - {_ATTENTION})
        return twin

    @abc.abstractmethod
    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        """Plan the step for ``log``; ``new`` names the segments appended by this step."""

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """A prefill-only plan of what the next step will need before its screenshot exists
        (``log`` already holds this step's action).  None: the policy has nothing to prefetch."""
        return None

    def guess(self, log: ContextLog, view: CacheView) -> Plan | None:
        """A prefill-only plan of the next step's prompt as far as ``log`` — which holds a
        *guessed* screenshot (the current one again) — allows, with a restore point before the
        guessed image, so that a wrong guess costs the step one cut back.  None: the policy
        does not guess.  The episode's log never holds the guessed segment."""
        return None

    # ---------------------------------------------------------------- shared helpers

    def requires_spare_sequence(self) -> bool:
        """The policy cannot plan its steps without the scheduler's spare sequence (kamera's
        canonical forwards).  One that only measures drift there (relocate, the token
        evictors, ``measure_drift``) runs without it, unmeasured."""
        return False

    def checkpoint_kind(self) -> CheckpointKind:
        return (CheckpointKind.PARTIAL_ONLY if self.model.kind.has_recurrent_state
                else CheckpointKind.FULL)

    def plan_reusing(self, log: ContextLog, view: CacheView, pieces: Sequence[Piece], *,
                     anchors: Sequence[tuple[int, str]] = (), reuse: bool = True,
                     decode: bool = True, edits: tuple[RemoveSpan, ...] = (),
                     start: tuple[Start, int] | None = None,
                     drift_reference: tuple[Piece, ...] = (),
                     trim_after: int | None = None) -> Plan:
        """Build a plan that starts from the best restore point (or from scratch).

        ``anchors`` are (piece boundary, label) where the successor must hold a checkpoint:
        reused if the parent has one with the same history, taken during the prefill otherwise.
        Attention-only models need no checkpoint to cut back (a plain trim), so there an anchor
        costs nothing and none is taken.  ``trim_after`` (default: the first anchor, or 0) is
        how much of the prompt the next step can reuse.
        """
        pieces = tuple(pieces)
        if (self.tail is not None and reuse and start is None and not edits
                and self.model.kind.has_recurrent_state):
            return self._plan_tail(log, view, pieces, anchors=anchors, decode=decode,
                                   drift_reference=drift_reference, trim_after=trim_after)
        if start is None:
            start = (best_start(pieces, view, self.model.kind,
                                max_reuse=len(pieces) - 1 if decode else None)
                     if reuse else (Start(StartKind.CLEAR), 0))
        begin, reused = start
        want = digests(pieces)
        takes: list[TakeCheckpoint] = []
        keep: list[str] = []
        if self.model.kind.has_recurrent_state:
            for boundary, label in anchors:
                existing = [c for c in view.state.checkpoints
                            if boundary > 0 and c.checkpoint.digest == want[boundary - 1]]
                if existing and boundary <= reused:
                    keep.append(existing[0].label)
                elif boundary >= reused:  # taken when the prefill reaches the boundary
                    takes.append(TakeCheckpoint(boundary, self.checkpoint_kind(), label))
                # else: the boundary lies inside the reused prefix but its checkpoint is gone
                # (e.g. after a failed step); the next step will start further back.
        forecast = self._forecast(view, pieces, reused, takes, keep, decode)
        by_key = {s.key: s for s in log.segments}
        return Plan(policy=self.name, generation=log.generation,
                    visible=tuple(by_key[k] for k in shown_keys(pieces)),
                    pieces=pieces, start=begin, reused_pieces=reused, edits=edits,
                    checkpoints=tuple(takes), keep=tuple(keep), forecast=forecast,
                    decode=decode, drift_reference=drift_reference,
                    trim_after=(trim_after if trim_after is not None
                                else anchors[0][0] if anchors else 0))

    def _plan_tail(self, log: ContextLog, view: CacheView, pieces: tuple[Piece, ...], *,
                   anchors: Sequence[tuple[int, str]], decode: bool,
                   drift_reference: tuple[Piece, ...], trim_after: int | None) -> Plan:
        """``plan_reusing`` by content (``cachepolicy.tail``): the start may be a replay, a
        restore point may be any checkpoint of this sequence's history (approximate ones
        included), and a start inside a text piece splits it."""
        assert self.tail is not None
        if self.measure_drift and decode and not drift_reference:
            drift_reference = pieces  # the layout's own pieces, prefilled from scratch
        ts = tail_start(pieces, view, self.tail,
                        limit=len(pieces) - 1 if decode else len(pieces))
        pieces, reused = ts.pieces, ts.reused
        history = view.seq.history
        takes: list[TakeCheckpoint] = []
        keep: list[str] = []
        for layout_boundary, label in anchors:
            boundary = ts.moved(layout_boundary)
            at = position_after(pieces, boundary)
            existing = [c for c in view.state.checkpoints
                        if boundary > 0 and c.checkpoint.kind is CheckpointKind.PARTIAL_ONLY
                        and c.checkpoint.pos == at and on_history(c.checkpoint, history)]
            if existing and boundary <= reused:
                keep.append(existing[0].label)
            elif boundary >= reused:
                takes.append(TakeCheckpoint(boundary, self.checkpoint_kind(), label))
        forecast = self._forecast(view, pieces, reused, takes, keep, decode)
        by_key = {s.key: s for s in log.segments}
        trim = trim_after if trim_after is not None else anchors[0][0] if anchors else 0
        return Plan(policy=self.name, generation=log.generation,
                    visible=tuple(by_key[k] for k in shown_keys(pieces)),
                    pieces=pieces, start=ts.start, reused_pieces=reused, edits=(),
                    checkpoints=tuple(takes), keep=tuple(keep), forecast=forecast,
                    decode=decode, drift_reference=drift_reference,
                    trim_after=ts.moved(trim), tail=True, replay=ts.replay,
                    trim_forgets=self.trim_forgets)

    #: a tail policy without checkpoints: an idle sequence may be cut back to its reuse
    #: point with its recurrent state dropped (its next step replays a tail anyway)
    trim_forgets: ClassVar[bool] = False

    def _forecast(self, view: CacheView, pieces: tuple[Piece, ...], reused: int,
                  takes: Sequence[TakeCheckpoint], keep: Sequence[str],
                  decode: bool) -> ByteForecast:
        """An upper bound: the parent stays whole until publication, the successor is new."""
        m = self.model
        total = n_tokens(pieces) + (self.decode_tokens if decode else 0)
        new_ckpts = sum(m.checkpoint_bytes(t.kind, n_tokens(pieces[: t.after_piece]))
                        for t in takes)
        workspace = max((p.n_tokens * m.n_embd * _FLOAT for p in pieces[reused:] if p.is_image),
                        default=0) + m.n_vocab * _FLOAT
        if decode:  # a run's logits rows, and a recurrent lane's snapshot for its rollback
            workspace += MAX_RUN_ROWS * m.n_vocab * _FLOAT + m.recurrent_bytes_per_seq
        return ByteForecast(parent_bytes=view.state.held_bytes,
                            parent_seq_bytes=view.state.seq_bytes,
                            successor_seq_bytes=m.state_bytes(total),
                            new_checkpoint_bytes=new_ckpts, workspace_bytes=workspace)

