"""``noevict``: append-only interleaved turns, every screenshot kept; reuse the longest
common prefix with what the sequence holds.  Context grows without bound."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import interleaved
from cachepolicy.pieces import merge_text
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register


@register
class NoEvictPolicy(CachePolicy):
    name = "noevict"
    manifest = PolicyManifest(
        changes="appends to the sequence; trims the decoded tail back to the prompt end",
        evidence="digests of the sequence's runs vs the new prompt's pieces",
        adds_work="none beyond the new content; decode cost grows with the context",
        omitted_recoverable=True, quality="exact", bounded=False,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        raw = interleaved(log, self.kit, None)
        # Keep each step's turn pieces apart from the next step's so earlier pieces keep their
        # digests as the log grows (merging would change a piece when text is appended to it).
        pieces = merge_text(raw, keep_before=frozenset(
            i for i, p in enumerate(raw)
            if p.key.endswith(":intro") or p.key.startswith("open@") or p.key == "gen"))
        # Next step the generation prompt and the decoded tokens give way to the assistant
        # turn (open + action + break), so the sequence is cut back to just before the
        # generation prompt: hybrids need a checkpoint there.
        return self.plan_reusing(log, view, pieces, anchors=[(len(pieces) - 1, "prompt_end")])
