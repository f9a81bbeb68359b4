"""Token choice from logits: greedy, or temperature / top-p with a seeded generator.

Pure numpy; the grammar mask (if any) is applied by the engine before these run.
"""

from __future__ import annotations

import attrs
import numpy as np


#: Beyond this a softmax is uniform to float precision; inf or NaN would poison it.
MAX_TEMPERATURE = 100.0


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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def choose_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    """Pick one token id.  Ties under greedy resolve to the lowest id (numpy argmax)."""
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
        return int(keep[rng.choice(len(keep), p=kept)])
    return int(rng.choice(len(probs), p=probs))
