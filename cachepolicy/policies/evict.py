"""``evict``: today's agents.  Interleaved turns, the last K screenshots as images, older
steps folded into text in the first user turn; the whole prompt re-prefilled every step."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import interleaved
from cachepolicy.pieces import merge_text
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register


@register
class EvictPolicy(CachePolicy):
    name = "evict"
    manifest = PolicyManifest(
        changes="the whole sequence, rebuilt every step",
        evidence="the log only",
        adds_work="a full prefill of the visible context every step",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces = merge_text(interleaved(log, self.kit, self.window))
        return self.plan_reusing(log, view, pieces, reuse=False)
