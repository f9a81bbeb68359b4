"""``terminal-scratch``: the terminal layout, re-prefilled from scratch every step.

The exactness reference for terminal-slot: the same pieces with the same boundaries (each
history step its own piece, as terminal-slot needs them), no reuse.  Same boundaries make the
comparison bitwise on every model: pieces shorter than 8 rows, and the experts of K-quant MoE
models, take other kernels than inside a longer one-call prefill (see ``cachepolicy.engine``)."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import terminal_steps
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register


@register
class TerminalScratchPolicy(CachePolicy):
    name = "terminal-scratch"
    pins = True
    manifest = PolicyManifest(
        changes="the whole sequence, rebuilt every step",
        evidence="the log only",
        adds_work="a full prefill of [preamble][text history][K screenshots] every step",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces, _ = terminal_steps(log, self.kit, self.window, pinned=self.pinned)
        return self.plan_reusing(log, view, pieces, reuse=False)
