"""One generation: tokens chosen exactly as plain decoding chooses them, fed in the engine's
decode shape — with grammar-forced tokens and prompt-lookup drafts riding in the same call
when the shape allows runs.

Plain decoding chooses token i+1 from the logits of token i (``Sampler.sample``: the
grammar's mask, then greedy or one draw from the seeded RNG), emits it, feeds it, and so on.
This loop emits the same tokens in the same order, draws the RNG the same number of times
and accepts the same tokens into the grammar; only the calls differ:

* **jump-forward** — when the grammar admits one token only, it is emitted without looking
  at any logits (``Sampler.take_forced`` still draws the RNG once, as sampling a certain
  token does), and it joins the tokens waiting to be fed; when it admits one *text* only
  (``Sampler.forced_text``: a vocabulary spells a character several ways, so this is the
  common case), that text's tokens are the draft;
* **speculation** — drafts (the forced text's tokens, else ``drafts.PromptLookup``) are fed
  after the waiting tokens, in the same call; then tokens are chosen from the call's rows
  one after another, each compared with the draft in its place; the first mismatch is
  emitted (it is what plain decoding chooses there) and the lane rolls back the drafts
  after it (``Lane.keep``).

Exact only if a row computed in a run equals the row plain decoding would compute — the run
class of ``row_classes``, which the engine measured, and ``check-exact``'s ``decode_runs``
and ``speculative_generation`` verify.  On a lane-shaped engine (``DecodeMode.LANES``), and
for a generation decoding alone (``Lane.alone``), every token is fed alone: forced tokens
then skip only the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from cachepolicy.engine.batcher import DecodeStats, Lane
from cachepolicy.engine.drafts import Drafting, PromptLookup
from cachepolicy.engine.errors import Preempted
from cachepolicy.engine.sampler import CharTokens, Sampler


@attrs.frozen(eq=False)
class Spelling:
    """What turning forced text into draft tokens needs from the engine."""

    chars: CharTokens
    tokenize: Callable[[str], Sequence[int]]

    def tokens(self, text: bytes) -> list[int]:
        """``text``'s tokens, cut back to whole characters."""
        for end in range(len(text), max(0, len(text) - 4) - 1, -1):
            try:
                return list(self.tokenize(text[:end].decode("utf-8"))) if end else []
            except UnicodeDecodeError:
                continue
        return []


def generate(lane: Lane, sampler: Sampler, logits: np.ndarray, max_tokens: int, *,
             drafting: Drafting, context: Sequence[int], is_eog: Callable[[int], bool],
             spelling: Spelling | None = None,
             stop_at_eog: bool = True, should_stop: Callable[[], bool] | None = None,
             stop_when: Callable[[list[int]], bool] | None = None,
             on_token: Callable[[int], None] | None = None,
             trace: Callable[[int, np.ndarray | None], None] | None = None,
             ) -> tuple[list[int], DecodeStats]:
    """Up to ``max_tokens`` tokens from ``logits`` (the prompt's last), and the counts of
    what was forced, drafted and accepted.  ``context`` is the prompt's text (the drafts'
    source); see ``Engine.generate`` for the stop rules.  ``trace`` (the oracle) sees each
    emitted token with the logits it was chosen from (None: forced, chosen from none)."""
    out: list[int] = []
    forced = drafted = accepted = 0
    if max_tokens <= 0:
        return out, DecodeStats()
    drafter = (PromptLookup(context, min_ngram=drafting.min_ngram,
                            max_ngram=drafting.max_ngram)
               if drafting.lookup and lane.runs else None)
    jump = drafting.jump_forward and sampler.constrained

    def emit(tok: int, chosen_from: np.ndarray | None) -> bool:
        """Emit ``tok``; True when the generation is over."""
        if trace is not None:
            trace(tok, chosen_from)
        out.append(tok)
        sampler.accept(tok)
        if on_token is not None:
            on_token(tok)
        if drafter is not None:
            drafter.push(tok)
        return ((stop_at_eog and is_eog(tok)) or len(out) >= max_tokens
                or (stop_when is not None and stop_when(out)))

    def check_stop() -> None:
        if should_stop is not None and should_stop():
            raise Preempted(f"stopped after {len(out)} decoded tokens")

    # drafts per call: doubled while they are all confirmed, cut to what was confirmed
    # (plus one) when one is not — a guess costs a row even when it is wrong
    window = min(4, drafting.max_draft)
    nxt = logits  # the logits the next token is chosen from (when nothing waits)
    waiting: list[int] = []  # emitted, not fed yet
    while True:
        if not waiting:
            tok = sampler.sample(nxt)
            if emit(tok, nxt):
                break
            waiting = [tok]
        over = False
        while jump and (f := sampler.forced()) is not None:
            sampler.take_forced(f)
            forced += 1
            if emit(f, None):
                over = True
                break
            waiting.append(f)
        if over:
            break
        check_stop()
        if not lane.runs:  # lane calls: one token each
            for i, t in enumerate(waiting):
                if i:
                    check_stop()
                nxt = lane.decode(t)
            waiting = []
            continue
        budget = min(window, lane.max_guesses, max_tokens - len(out) - 1)
        drafts = (_spelled(sampler, spelling, budget) if jump and spelling is not None
                  else []) or _drafts(drafter, lane, budget, len(waiting))
        rows = lane.feed(waiting + drafts, certain=len(waiting))
        drafted += len(drafts)
        n_known, confirmed = len(waiting), 0
        nxt, waiting = rows[n_known - 1], []
        for d in drafts:
            tok = sampler.sample(nxt)
            over = emit(tok, nxt)
            if tok != d:
                waiting = [tok]
                break
            confirmed += 1
            nxt = rows[n_known + confirmed - 1]
            if over:
                break
        if drafts:
            lane.keep(n_known + confirmed)
            accepted += confirmed
            window = (min(drafting.max_draft, 2 * window) if confirmed == len(drafts)
                      else max(1, confirmed + 1))
        if over:
            break
    return out, DecodeStats(tokens=max(0, len(out) - 1), forced=forced, drafted=drafted,
                            accepted=accepted)


#: The most bytes of forced text looked at per call (a token spells a few characters).
FORCED_TEXT_BYTES = 32


def _spelled(sampler: Sampler, spelling: Spelling, budget: int) -> list[int]:
    """The tokens of the text the grammar forces next (at most ``budget``)."""
    if budget <= 0:
        return []
    text = sampler.forced_text(spelling.chars, min(FORCED_TEXT_BYTES, 4 * budget))
    return spelling.tokens(text)[:budget]


def _drafts(drafter: PromptLookup | None, lane: Lane, limit: int, n_known: int) -> list[int]:
    """A prompt-lookup draft of at most ``limit`` tokens; when the call would be shorter
    than a run must be, any 1-gram's guess beats the lane's pad."""
    if drafter is None:
        return []
    drafts = drafter.propose(limit)
    short = lane.batcher.shape.min_run - n_known - len(lane.pending)
    if not drafts and short > 0:
        drafts = drafter.propose(min(limit, short), min_ngram=1)
    return drafts
