"""``chrono-slot``: the chronological layout (``cachepolicy.layouts.chronological_steps``:
each retained screenshot followed by its step's line, the lines of the steps that left the
window before it), exact, with a checkpoint at the start of the window and, while the
window still grows, one after the prompt's last image.

Where terminal-slot's new history line precedes the window — so every step re-prefills the
retained screenshots, also while the window is still filling — here a step's line follows
its screenshot: until the first screenshot leaves the window, the next prompt extends this
one up to its last image, and the step appends its line, the new screenshot and the
generation prompt (what an OSWorld client's interleaved request adds; llama-server appends
the same).  Once the window slides, the line of the step whose screenshot left joins the
lines before the window and the window is prefilled again from the region checkpoint, as
terminal-slot does (plus the K-1 lines inside it).  Exact: every start is a trim or a
checkpoint on the step's own history, so an answer is the one the same pieces prefilled from
scratch give (a fresh conversation's first step).

The prompt differs from terminal-slot's (the same content, in the client's order), so the
answers do too: the chat API's terminal mode runs it by default (``kvagent serve`` without
``--policy``); the shipped agents, trained on the terminal layout, keep terminal-slot.
"""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import chronological_steps
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.noevict import PROMPT_END  # the same anchor: a whole prompt
from cachepolicy.policies.registry import register
from cachepolicy.policies.terminal_slot import REGION  # the same anchor: the window's start


@register
class ChronoSlotPolicy(CachePolicy):
    name = "chrono-slot"
    manifest = PolicyManifest(
        changes="the sequence after its last image while the window fills, after the "
                "window-region checkpoint once it slides; the checkpoints advance",
        evidence="digests of the sequence's runs and of the published checkpoints",
        adds_work="a checkpoint per step at the window's start, and one after the last "
                  "image while the window grows (the recurrent state on hybrids, nothing "
                  "on attention-only models)",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces, region = chronological_steps(log, self.kit, self.window)
        anchors = [(region, REGION)]  # the first: where the memory ladder may cut back to
        if len(log.screenshots) < self.window:
            # the window still grows: the next step keeps everything up to this prompt's
            # last image (its line follows that image) — hybrids need the state there.  A
            # full window slides at the next step, which starts from the region instead
            anchors.append((len(pieces) - 1, PROMPT_END))
        return self.plan_reusing(log, view, pieces, anchors=anchors)

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """Everything of the next prompt already known: the lines before the next window,
        the K-1 retained screenshots and this step's line after the last of them (its piece
        with that screenshot's closing text); the next step prefills its screenshot's label,
        the screenshot and the generation prompt."""
        pieces, region = chronological_steps(log, self.kit, self.window - 1,
                                             generation_prompt=False)
        return self.plan_reusing(log, view, pieces, anchors=[(region, REGION)], decode=False)
