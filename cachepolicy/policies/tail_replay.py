"""``tail-replay``: the terminal layout with NO recurrent checkpoint — approximate.

Per step the prompt diverges from what the sequence holds where the new action enters the
history (the previous step's screenshot region).  Instead of restoring a checkpoint there
(terminal-slot), the plan keeps the attention KV up to ``r`` rows before that point, starts
the recurrent state from zero (the policy holds no checkpoint to start from) and re-prefills
those ``r`` rows, then the action, the window and the generation prompt
(``cachepolicy.tail``; ``Engine.replay_cut``).  What is recomputed: the replayed rows through
every layer — their recurrent states and their attention KV, from the approximate state
below them — and everything after them, as terminal-slot recomputes it.  What is exact: the
attention KV before the cut.  A budget of at least the whole prefix is a full prefill (exact:
the reference terminal-scratch's pieces, bitwise).

With overlap the replay happens in the prefetch, off the critical path.  Saves the region
checkpoint (the model's recurrent state size per episode); an idle episode can be cut back
to its reuse point for free (``trim_forgets``: its next step replays from before it anyway).
"""

from __future__ import annotations

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.layouts import terminal_steps
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.tail import DEFAULT_BUDGET


@register
class TailReplayPolicy(CachePolicy):
    name = "tail-replay"
    pins = True
    default_tail = DEFAULT_BUDGET
    trim_forgets = True
    manifest = PolicyManifest(
        changes="the sequence after the replay cut; the attention KV before it is kept; no "
                "recurrent checkpoints",
        evidence="the sequence's runs against the new prompt, token by token (content, not "
                 "exact digests)",
        adds_work="re-prefills r rows (the replay budget) before the point of divergence, "
                  "through every layer, from a zero recurrent state",
        omitted_recoverable=True, quality="approximate", bounded=True,
        supports=frozenset({ModelKind.HYBRID}))

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        pieces, region = terminal_steps(log, self.kit, self.window, pinned=self.pinned)
        return self.plan_reusing(log, view, pieces, trim_after=region)

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """terminal-slot's prefetch (the action text, the K-1 retained screenshots) — the
        replay with it, off the critical path."""
        pieces, region = terminal_steps(log, self.kit, self.window - 1,
                                        generation_prompt=False, pinned=self.pinned)
        if pieces and not pieces[-1].is_image and len(pieces) > region:
            pieces = pieces[:-1]
        return self.plan_reusing(log, view, pieces, decode=False, trim_after=region)
