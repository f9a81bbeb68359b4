"""``terminal-slot``: the terminal layout with a checkpoint at the start of the screenshot
region.  Per step: restore the checkpoint (hybrid: PARTIAL_ONLY recurrent state + attention
trim; attention-only: a plain trim), prefill the text delta, advance the checkpoint, prefill
the window and the generation prompt.  Bit-exact with terminal-scratch: the same tokens in the
same pieces, and split prefill equals one-call prefill (see the engine's contract)."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import terminal_steps
from cachepolicy.pieces import Piece
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register

REGION = "region"
GUESS = "guess"


@register
class TerminalSlotPolicy(CachePolicy):
    name = "terminal-slot"
    pins = True
    manifest = PolicyManifest(
        changes="the sequence after the screenshot-region checkpoint; the checkpoint advances",
        evidence="digests of the sequence's runs and of the published checkpoint",
        adds_work="one checkpoint per step (the recurrent state on hybrids, nothing on "
                  "attention-only models)",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def _pieces(self, log: ContextLog, window: int,
                generation_prompt: bool) -> tuple[tuple[Piece, ...], int]:
        return terminal_steps(log, self.kit, window, generation_prompt=generation_prompt,
                              pinned=self.pinned)

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        pieces, region = self._pieces(log, self.window, True)
        return self.plan_reusing(log, view, pieces, anchors=[(region, REGION)])

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """Everything of the next window already known: the action text (then the advanced
        checkpoint) and the K-1 retained screenshots; stops after the last known image, whose
        closing text joins the next screenshot's intro."""
        pieces, region = self._pieces(log, self.window - 1, False)
        if pieces and not pieces[-1].is_image and len(pieces) > region:
            pieces = pieces[:-1]
        return self.plan_reusing(log, view, pieces, anchors=[(region, REGION)], decode=False)

    def guess(self, log: ContextLog, view: CacheView) -> Plan | None:
        """The next step's pieces but the last (its closing text and the generation prompt,
        whose logits the step decodes from), the guessed screenshot among them: the same
        pieces with the same boundaries the step prefills itself, so a right guess leaves the
        step the last piece and the decode, bitwise as without it.  A checkpoint before the
        guessed image (hybrids; a trim does on attention-only models) is where a wrong guess
        is cut back to — after the screenshot's label, which the step keeps."""
        pieces, region = self._pieces(log, self.window, True)
        if len(pieces) < region + 2 or not pieces[-2].is_image:
            return None
        pieces = pieces[:-1]
        return self.plan_reusing(log, view, pieces, decode=False,
                                 anchors=[(region, REGION), (len(pieces) - 1, GUESS)],
                                 trim_after=None)
