"""``faithful``: the log verbatim, in order — for a client that sends its whole prompt every
request (``kvagent serve``'s faithful chat mode: the request replaces the log).

Each segment is one chat message's text or image (its ``step`` encodes the message:
``message * PLACES + part``).  Reuse is the longest prefix the sequence already holds; on
hybrid models that needs a recurrent checkpoint where a later request may diverge, so
checkpoints are taken at message boundaries likely to be restore points — after the first
message (the system prompt), after the second, and before the first message holding an
image (where agents slide their screenshot window) — at most three.  The sequence itself
ends at the prompt end after a step (decoding happens in the engine's lanes), so a client
that only appends continues from there without a checkpoint.  ``prefetch`` prefills what was
appended after the prompt (the predicted next turn).
"""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog, Segment, SegmentKind
from cachepolicy.pieces import Piece, image_piece, merge_text, text_piece
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.tail import DEFAULT_BUDGET

#: Parts per message in a segment's ``step`` (message m, part p → m * PLACES + p).
PLACES = 1000
MAX_ANCHORS = 3


def verbatim(log: ContextLog) -> tuple[tuple[Piece, ...], list[int]]:
    """The log's segments as pieces, each message starting a new piece; returns the pieces
    and the piece index where each message starts (in order)."""
    raw: list[Piece] = []
    firsts: list[int] = []  # raw index of each message's first non-empty piece
    message = None
    for s in log.segments:
        if s.step // PLACES != message:
            message = s.step // PLACES
            firsts.append(-1)
        for p in _pieces(s):
            if firsts[-1] < 0 and (p.is_image or p.tokens):
                firsts[-1] = len(raw)
            raw.append(p)
    firsts = [f for f in firsts if f >= 0]
    pieces = merge_text(raw, keep_before=frozenset(firsts))
    # a message's first piece starts a merged piece: find it by its first source, in order
    starts, j = [], 0
    for f in firsts:
        while pieces[j].sources[:1] != raw[f].sources[:1]:
            j += 1
        starts.append(j)
    return pieces, starts


def _pieces(s: Segment) -> list[Piece]:
    if s.kind is SegmentKind.SCREENSHOT:
        return [text_piece(f"{s.key}:intro", s.intro, (s.key,)), image_piece(s),
                text_piece(f"{s.key}:outro", s.outro, (s.key,))]
    return [text_piece(s.key, s.tokens, (s.key,))]


@register
class FaithfulPolicy(CachePolicy):
    name = "faithful"
    adds_generation_prompt = False  # the request's last segment opens the assistant turn
    manifest = PolicyManifest(
        changes="the sequence after the longest prefix it shares with the request; "
                "checkpoints at up to three message boundaries",
        evidence="digests of the sequence's runs and of the checkpoints vs the request's pieces",
        adds_work="re-prefills from the first message that differs",
        omitted_recoverable=True, quality="exact", bounded=False,
        supports=frozenset(ModelKind), may_degrade=False)

    def _anchors(self, log: ContextLog, starts: list[int]) -> list[tuple[int, str]]:
        by_message: dict[int, bool] = {}
        for s in log.segments:
            by_message[s.step // PLACES] = (by_message.get(s.step // PLACES, False)
                                            or s.kind is SegmentKind.SCREENSHOT)
        images = [k for k, (m, has) in enumerate(by_message.items()) if has]
        wanted = [1, 2] + ([images[0]] if images else [])
        bounds = sorted({starts[k] for k in wanted if 0 < k < len(starts)})
        return [(b, f"message@{b}") for b in bounds[:MAX_ANCHORS]]

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        pieces, starts = verbatim(log)
        return self.plan_reusing(log, view, pieces, anchors=self._anchors(log, starts),
                                 trim_after=len(pieces))

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        pieces, starts = verbatim(log)
        return self.plan_reusing(log, view, pieces, anchors=self._anchors(log, starts),
                                 decode=False, trim_after=len(pieces))


@register
class FaithfulTailPolicy(FaithfulPolicy):
    """``faithful-tail`` (``--policy faithful-tail --replay-budget B``; kvagent serve's
    faithful chat mode itself stays exact ``faithful``): faithful's prompt and checkpoints, reused to the TRUE point of divergence instead of the last
    message boundary with a checkpoint — approximate.  Where a request diverges past its
    last restore point (an agent that folds an old screenshot into text), the attention KV is
    kept up to a replay budget before the divergence, the recurrent state starts from the
    nearest older checkpoint (or zero) and the budget is re-prefilled (``cachepolicy.tail``)."""

    name = "faithful-tail"
    default_tail = DEFAULT_BUDGET
    manifest = PolicyManifest(
        changes="the sequence after the replay cut before the first token that differs; "
                "checkpoints at up to three message boundaries (replay bases)",
        evidence="the sequence's runs against the request's pieces, token by token",
        adds_work="re-prefills r rows before the point of divergence (from the nearest older "
                  "checkpoint or zero), then what differs",
        omitted_recoverable=True, quality="approximate", bounded=False,
        supports=frozenset({ModelKind.HYBRID}), may_degrade=False)
