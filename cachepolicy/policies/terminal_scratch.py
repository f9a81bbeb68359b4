"""``terminal-scratch``: the terminal layout, re-prefilled from scratch every step.

The exactness reference for terminal-slot: same pieces' tokens, no reuse."""

from __future__ import annotations

from cachepolicy.base import CachePolicy, register
from cachepolicy.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import terminal
from cachepolicy.pieces import merge_text
from cachepolicy.plan import CacheView, Plan, PolicyManifest


@register
class TerminalScratchPolicy(CachePolicy):
    name = "terminal-scratch"
    manifest = PolicyManifest(
        changes="the whole sequence, rebuilt every step",
        evidence="the log only",
        adds_work="a full prefill of [preamble][text history][K screenshots] every step",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces, _ = terminal(log, self.kit, self.window)
        return self.plan_reusing(log, view, merge_text(pieces), reuse=False)
