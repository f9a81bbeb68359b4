"""``kamera`` (attention-only models): position-invariant screenshot reuse — approximate.

Every screenshot is prefilled in context once, when it is the newest.  At the start of the
next plan (under overlap: the prefetch, off the critical path) its store entry is made — its
canonical KV (the episode's head, then the screenshot: computed once on the spare sequence)
and the rank-m truncated SVD of its conditioning Δ = (its KV in context) − (canonical KV) —
and written into the sequence in place of its KV in context, re-rotated to its position
(``cachepolicy.splice``).  From then on the screenshot is never prefilled again: at each
slide its store-written rows are re-rotated where the sequence holds them (one more f16
rounding of the keys per slide).  An entry lives until it is placed — normally in the plan
that made it, counted by the ledger meanwhile — so with the sliding window nothing is held
beside the window's own cells: the exact policy's bytes.  On the critical path a step
prefills the new action, the new screenshot and the generation prompt — and, without
overlap, runs the previous screenshot's canonical forward.

``m`` (``kamera@m32``; ``full``: every component) sets the patch's rank: 0 is plain
re-rotation of the canonical KV (the screenshot as if it had followed the head alone); full
rank reproduces the screenshot's KV as it was in its first context (up to the patch's f16
rounding), which is what re-rotating a survivor's own cached KV gives.

``kamera@own`` is the slide alone, without a store: a survivor keeps the KV the sequence
holds for it, re-rotated to its new position; a screenshot the sequence does not hold is
prefilled.
"""

from __future__ import annotations

from cachepolicy.plan import PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.splice import PlaceUnit, Source
from cachepolicy.splicing import ATTENTION_ONLY, Held, SplicingPolicy, Unit

#: ``full``: a rank no screenshot's Δ exceeds
FULL_RANK = 1 << 20
DEFAULT_RANK = 32
#: ``own``: no store; survivors keep their own cached KV, re-rotated
OWN = -1


@register
class KameraPolicy(SplicingPolicy):
    name = "kamera"
    option_help = ("m<rank> (m0, m8, m32, m64) or full: the conditioning patch's rank; own: "
                   "survivors' own KV re-rotated, no store")
    manifest = PolicyManifest(
        changes="the sequence after the action history: retained screenshots' KV written "
                "once from the store (canonical KV + rank-m patch), then re-rotated",
        evidence="the sequence's runs aligned with the published layout keys; the store",
        adds_work="per new screenshot a canonical forward (head + screenshot) on the spare "
                  "sequence and an SVD, in the plan after the one that prefilled it (the "
                  "prefetch under overlap); per step one state read and write of the sequence",
        omitted_recoverable=True, quality="approximate", bounded=True,
        supports=ATTENTION_ONLY, needs_scratch_sequence=True)

    def configure(self, option: str | None) -> None:
        self.rank = self.parse_option(option) if option else DEFAULT_RANK

    @classmethod
    def parse_option(cls, text: str) -> int:
        t = text.strip().lower()
        if t == "full":
            return FULL_RANK
        if t == "own":
            return OWN
        if t.startswith("m") and t[1:].isdigit() and int(t[1:]) <= 4096:
            return int(t[1:])
        raise ValueError(f"kamera takes m<rank> (m0..m4096), full or own, not {text!r}")

    def stores(self) -> bool:
        return self.rank != OWN

    def place(self, unit: Unit, held: Held | None, in_store: bool,
              units: tuple[Unit, ...], generation: int) -> PlaceUnit | None:
        if self.rank == OWN:
            return (PlaceUnit(unit.first, unit.n_pieces, unit.label, Source.SEQUENCE,
                              held_pos0=held.pos0) if held is not None else None)
        if not in_store:
            return None  # neither stored nor held (after a reset): prefill, then store
        return PlaceUnit(unit.first, unit.n_pieces, unit.label, Source.STORE)
