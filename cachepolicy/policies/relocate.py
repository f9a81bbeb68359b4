"""``relocate`` (attention-only models): drop the span of the screenshot leaving the window
(the oldest one not pinned) from the KV cache, shift the survivors' positions down (seq_rm +
seq_add) and prefill only the new content.

Approximate: the survivors keep what they absorbed from the dropped image, and their cached
keys were computed at their old positions' context.  Asked to (``measure_drift``:
``--replay-drift``, bench-eval's default), each step measures the drift (next-token KL and
top-1 agreement) against an exact from-scratch terminal prefill on a spare sequence.

Refused at configuration where llama.cpp cannot shift positions (``manifest.shifts_positions``
against ``ModelInfo.shift_problem``):
on the Qwen-VL models (multi-section RoPE: qwen2vl, qwen3vl, qwen3vlmoe) ``seq_add`` is
refused, so the first slide of the window would fail mid-episode (measured on the forged
models: the 4th step's cut raised ``UnsafeEditError``)."""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog
from cachepolicy.layouts import chronological, terminal
from cachepolicy.pieces import merge_text
from cachepolicy.plan import (
    CacheView, Plan, PolicyManifest, RemoveSpan, Start, StartKind,
)
from cachepolicy.policies.registry import register


@register
class RelocatePolicy(CachePolicy):
    name = "relocate"
    pins = True
    manifest = PolicyManifest(
        changes="removes the oldest screenshot's KV span and shifts later positions",
        evidence="the sequence's runs aligned with the published layout keys",
        adds_work="a position shift (RoPE re-rotation) of the survivors per step",
        omitted_recoverable=False, quality="approximate", bounded=True,
        # the spare sequence is only the drift reference's: ``CachePolicy`` asks for it when
        # ``measure_drift`` is on, and no scheduler holds one aside for relocate otherwise
        supports=frozenset({ModelKind.ATTENTION}), shifts_positions=True)

    def _drift(self, reference: tuple[Piece, ...]) -> tuple[Piece, ...]:
        """The drift reference of a plan: the exact prompt, where drift is measured."""
        return merge_text(reference) if self.measure_drift else ()

    def select(self, log: ContextLog, view: CacheView, *, new: frozenset[str] = frozenset()) -> Plan:
        return self._plan(log, view, self.window, decode=True)

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """What the next step does before its screenshot exists: the window's slide (the
        screenshot leaving it cut out, the survivors shifted) and this step's action text —
        the next prompt without its new screenshot and generation prompt, which are all its
        step then prefills.  The same edits and pieces in the same order as the step would
        make them itself, so its cache (and its answer) is the same; only the K-shift and
        the text leave the critical path.  None where the slide would take the pinned
        screenshots' place (a window of one)."""
        if self.window - 1 <= self.pinned:
            return None
        return self._plan(log, view, self.window - 1, decode=False)

    def _plan(self, log: ContextLog, view: CacheView, window: int, *, decode: bool) -> Plan:
        pieces = tuple(p for p in chronological(log, self.kit, window, pinned=self.pinned)
                       if p.is_image or p.tokens)
        if not decode:  # a prefetch: no generation prompt
            pieces = pieces[:-1]
        reference, _ = terminal(log, self.kit, self.window, pinned=self.pinned)
        keys = [p.key for p in pieces]
        held = list(view.state.layout_keys)
        hist = view.seq.history
        if held and held[-1] == "gen":
            held.pop()
        kept = [k for k in held if k in keys]
        consistent = (bool(held) and len(hist) >= len(held)
                      and keys[: len(kept)] == kept)
        drift = self._drift(reference) if decode else ()
        trim_after = len(pieces) - 1 if decode else len(pieces)
        if not consistent:  # first step, or the sequence is not what we published
            return self.plan_reusing(log, view, pieces, reuse=False, decode=decode,
                                     drift_reference=drift, trim_after=trim_after)
        spans: list[RemoveSpan] = []
        for i, key in enumerate(held):
            if key in keys:
                continue
            run = hist[i]
            if spans and spans[-1].p1 == run.pos0:
                spans[-1] = RemoveSpan(spans[-1].p0, run.end_pos)
            else:
                spans.append(RemoveSpan(run.pos0, run.end_pos))
        # drop the generation prompt and the decoded tokens (unless already trimmed away)
        end = hist[len(held)].pos0 if len(hist) > len(held) else view.seq.next_pos
        start = Start(StartKind.TRIM, pos=end)
        return self.plan_reusing(log, view, pieces, start=(start, len(kept)),
                                 edits=tuple(reversed(spans)), decode=decode,
                                 drift_reference=drift, trim_after=trim_after)
