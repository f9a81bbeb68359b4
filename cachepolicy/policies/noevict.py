"""``noevict``: append-only interleaved turns, every screenshot kept; reuse the longest
common prefix with what the sequence holds.  Context grows without bound.  ``noevict-tail``:
the same layout, reused to the true point of divergence without a checkpoint (approximate)."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import interleaved
from cachepolicy.pieces import Piece, merge_text
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.tail import DEFAULT_BUDGET

#: the anchor of the checkpoint after a whole prompt (its last piece): noevict's, and
#: chrono-slot's while its window fills
PROMPT_END = "prompt_end"


@register
class NoEvictPolicy(CachePolicy):
    name = "noevict"
    manifest = PolicyManifest(
        changes="appends to the sequence; trims the decoded tail back to the prompt end",
        evidence="digests of the sequence's runs vs the new prompt's pieces",
        adds_work="none beyond the new content; decode cost grows with the context",
        omitted_recoverable=True, quality="exact", bounded=False,
        supports=frozenset(ModelKind))

    def pieces(self, log: ContextLog) -> tuple[Piece, ...]:
        raw = interleaved(log, self.kit, None)
        # Keep each step's turn pieces apart from the next step's so earlier pieces keep their
        # digests as the log grows (merging would change a piece when text is appended to it).
        return merge_text(raw, keep_before=frozenset(
            i for i, p in enumerate(raw)
            if p.key.endswith(":intro") or p.key.startswith("open@") or p.key == "gen"))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces = self.pieces(log)
        # Next step the generation prompt and the decoded tokens give way to the assistant
        # turn (open + action + break), so the sequence is cut back to just before the
        # generation prompt: hybrids need a checkpoint there.
        return self.plan_reusing(log, view, pieces, anchors=[(len(pieces) - 1, PROMPT_END)])


@register
class NoEvictTailPolicy(NoEvictPolicy):
    """``noevict-tail``: noevict's layout without its checkpoint — approximate.  Reuse runs
    to the true point of divergence, token by token: the next step's assistant turn opens
    with the generation prompt the sequence ends with, so an appending step continues from
    the sequence's end (no replay).  Where the prompt diverges earlier (a changed history),
    the attention KV is kept up to a replay budget before the divergence and the recurrent
    state rebuilt from zero by re-prefilling that budget (``cachepolicy.tail``)."""

    name = "noevict-tail"
    default_tail = DEFAULT_BUDGET
    manifest = PolicyManifest(
        changes="appends to the sequence from the true point of divergence; no recurrent "
                "checkpoint",
        evidence="the sequence's runs against the new prompt, token by token",
        adds_work="none while the prompt only grows; a replay of r rows where it diverges",
        omitted_recoverable=True, quality="approximate", bounded=False,
        supports=frozenset({ModelKind.HYBRID}))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces = self.pieces(log)
        return self.plan_reusing(log, view, pieces, trim_after=len(pieces))
