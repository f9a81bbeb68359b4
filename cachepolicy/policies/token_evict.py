"""``random-evict`` and ``recency-evict`` (attention-only models): token eviction as the
floor any approximate policy must beat — approximate.

Both keep the prompt (head and action history, exact) and the newest screenshot whole; the
retained screenshots keep the KV the sequence held for them last step, re-rotated to their
new positions, but only a fraction ``f`` of their image tokens (``random-evict@50%``): the
KV budget of a step is the prompt + the newest screenshot + ``f`` of the retained
screenshots' image tokens.  Dropped cells leave their positions empty (the survivors keep
their offsets).

* ``random-evict``: each retained screenshot keeps ``ceil(f·n)`` of its n image cells,
  chosen uniformly at random (seeded by the screenshot and the step: reruns agree);
* ``recency-evict``: the budget ``round(f·Σn)`` is filled from the newest retained
  screenshot to the oldest, and a screenshot over its share drops its earliest cells first —
  the oldest screenshot's tokens go first.
"""

from __future__ import annotations

import math

from cachepolicy.plan import PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.splice import Drop, PlaceUnit, Source
from cachepolicy.splicing import ATTENTION_ONLY, Held, SplicingPolicy, Unit, _seed

DEFAULT_KEEP = 0.5


def _manifest(how: str) -> PolicyManifest:
    return PolicyManifest(
        changes="the sequence after the action history: retained screenshots' KV re-rotated, "
                f"a share of their image cells dropped ({how})",
        evidence="the sequence's runs aligned with the published layout keys",
        adds_work="per step one state read and write of the sequence",
        omitted_recoverable=False, quality="approximate", bounded=True,
        supports=ATTENTION_ONLY, needs_scratch_sequence=True)


class _TokenEvict(SplicingPolicy):
    option_help = "<percent>% of the retained screenshots' image tokens kept (50%, 25%)"
    drop = Drop.RANDOM

    def configure(self, option: str | None) -> None:
        self.keep = self.parse_option(option) if option else DEFAULT_KEEP

    @classmethod
    def parse_option(cls, text: str) -> float:
        t = text.strip()
        try:
            value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
        except ValueError:
            raise ValueError(f"{cls.name} takes the share of tokens kept (50%, 0.5), "
                             f"not {text!r}") from None
        if not 0 < value <= 1:
            raise ValueError(f"{cls.name}: the share kept must be in (0, 100%], not {text!r}")
        return value

    def targets(self, retained: tuple[Unit, ...]) -> dict[str, int]:
        """Image cells each retained unit keeps."""
        return {u.label: max(1, math.ceil(self.keep * u.image_tokens)) for u in retained}

    def place(self, unit: Unit, held: Held | None, in_store: bool,
              units: tuple[Unit, ...], generation: int) -> PlaceUnit | None:
        if held is None:
            return None  # the sequence does not hold it: prefill it whole
        retained = units[:-1]  # the newest stays whole
        keep = self.targets(retained).get(unit.label)
        return PlaceUnit(unit.first, unit.n_pieces, unit.label, Source.SEQUENCE,
                         held_pos0=held.pos0, keep=keep, drop=self.drop,
                         seed=_seed(unit.label, generation))


@register
class RandomEvictPolicy(_TokenEvict):
    name = "random-evict"
    manifest = _manifest("uniformly at random")


@register
class RecencyEvictPolicy(_TokenEvict):
    name = "recency-evict"
    manifest = _manifest("the oldest screenshot's first")
    drop = Drop.OLDEST

    def targets(self, retained: tuple[Unit, ...]) -> dict[str, int]:
        budget = round(self.keep * sum(u.image_tokens for u in retained))
        out: dict[str, int] = {}
        for u in reversed(retained):  # newest first
            out[u.label] = min(u.image_tokens, budget)
            budget -= out[u.label]
        return out
