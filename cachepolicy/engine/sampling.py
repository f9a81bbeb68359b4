"""Token choice from logits: greedy, or temperature / top-p with a seeded generator.

Pure numpy; the grammar mask (if any) is applied by the engine before these run.

The random stream is consumed explicitly: a sampled choice draws exactly one uniform number
(``rng.random()``) and inverts the cumulative distribution, as numpy's ``Generator.choice``
does — so a token whose choice is certain (a grammar that admits one token) can be taken
without its logits while the stream stays where plain decoding leaves it
(``consume_choice``).  Greedy choice draws nothing.
"""

from __future__ import annotations

import attrs
import numpy as np


#: Beyond this a softmax is uniform to float precision; inf or NaN would poison it.
MAX_TEMPERATURE = 100.0


@attrs.frozen
class GrammarBudget:
    """What matching a grammar a client sent may cost: it runs in the grammar worker
    (``grammar_isolation``), each call on it within ``call_s`` seconds and all of one
    generation's calls within ``total_s``.  A grammar's per-token cost follows its ambiguity,
    which no reading of its text bounds, so the time is bounded where it is spent."""

    call_s: float = attrs.field(default=2.0, validator=attrs.validators.gt(0.0))
    total_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0.0))


@attrs.frozen
class SamplingParams:
    """How to pick the next token.  ``temperature == 0`` means greedy (argmax)."""

    temperature: float = attrs.field(default=0.0, validator=[attrs.validators.ge(0.0),
                                                              attrs.validators.le(MAX_TEMPERATURE)])
    top_p: float = attrs.field(default=1.0, validator=[attrs.validators.gt(0.0),
                                                      attrs.validators.le(1.0)])
    seed: int = 0
    grammar: str | None = None  # GBNF text; constrains every sampled token
    grammar_root: str = "root"
    #: None: a grammar kvagent wrote (matched in the engine's process); a budget: a
    #: client's grammar, matched in the grammar worker within it
    grammar_budget: GrammarBudget | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _pick(probs: np.ndarray, u: float) -> int:
    """The index whose cumulative probability first exceeds ``u`` (numpy's choice)."""
    cdf = probs.cumsum()
    cdf /= cdf[-1]
    return int(cdf.searchsorted(u, side="right"))


def choose_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick one token id.  Ties under greedy resolve to the lowest id (numpy argmax).
    Sampling draws one uniform number from ``rng`` per call, whatever the logits."""
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        keep = order[: int(np.searchsorted(cumulative, params.top_p) + 1)]
        kept = probs[keep] / probs[keep].sum()
        return int(keep[_pick(kept, rng.random())])
    return _pick(probs, rng.random())


def consume_choice(params: SamplingParams, rng: np.random.Generator) -> None:
    """Advance ``rng`` as one ``choose_token`` call does: for a token that was certain."""
    if not params.greedy:
        rng.random()
