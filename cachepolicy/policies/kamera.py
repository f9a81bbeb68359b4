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

``+recall<N>`` (``kamera@m8+recall4``) is recall by content: the store keeps the N entries
last made or used (counted by the ledger: N units' canonical KV and patches beside the
window), and a new screenshot whose pixels equal one of theirs — the screen came back to an
earlier state, or did not change — has its image placed from that entry (re-rotated, with
its patch: conditioned on the context it first had) instead of prefilled; its intro and
outro, which name this step, are prefilled in context.  Without it, nothing is kept once
placed.
"""

from __future__ import annotations

import re

from cachepolicy.plan import PolicyManifest
from cachepolicy.policies.registry import register
from cachepolicy.splice import PlaceUnit, Source
from cachepolicy.splicing import ATTENTION_ONLY, Held, SplicingPolicy, Unit

#: ``full``: a rank no screenshot's Δ exceeds
FULL_RANK = 1 << 20
DEFAULT_RANK = 32
#: ``own``: no store; survivors keep their own cached KV, re-rotated
OWN = -1
_OPTION = re.compile(r"(?:m(?P<rank>\d{1,4})|(?P<full>full)|(?P<own>own))"
                     r"(?:\+recall(?P<recall>\d{1,2}))?", re.ASCII)


@register
class KameraPolicy(SplicingPolicy):
    name = "kamera"
    option_help = ("m<rank> (m0, m8, m32, m64) or full: the conditioning patch's rank; own: "
                   "survivors' own KV re-rotated, no store; +recall<N> (m8+recall4): keep "
                   "the N entries last made or used, and place a new screenshot's image "
                   "from the entry with its pixels")
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
        self.rank, self.recall = self.parse_option(option) if option else (DEFAULT_RANK, 0)

    @classmethod
    def parse_option(cls, text: str) -> tuple[int, int]:
        """(rank, recall entries) from ``m8``, ``full``, ``own``, ``m8+recall4``."""
        m = _OPTION.fullmatch(text.strip().lower())
        if m is None or (m["rank"] is not None and int(m["rank"]) > 4096):
            raise ValueError(f"kamera takes m<rank> (m0..m4096), full or own, optionally "
                             f"+recall<N> (N in 1..64), not {text!r}")
        rank = FULL_RANK if m["full"] else OWN if m["own"] else int(m["rank"])
        recall = int(m["recall"]) if m["recall"] is not None else 0
        if m["recall"] is not None and not 1 <= recall <= 64:
            raise ValueError(f"kamera's recall is +recall<N> with N in 1..64, not {text!r}")
        if recall and rank == OWN:
            raise ValueError("kamera@own keeps no store, so it cannot recall: use m<rank>"
                             "+recall<N>")
        return rank, recall

    def stores(self) -> bool:
        return self.rank != OWN

    def continues_prefetch(self) -> bool:
        return self.rank == OWN

    def place(self, unit: Unit, held: Held | None, in_store: bool,
              units: tuple[Unit, ...], generation: int) -> PlaceUnit | None:
        if self.rank == OWN:
            return (PlaceUnit(unit.first, unit.n_pieces, unit.label, Source.SEQUENCE,
                              held_pos0=held.pos0) if held is not None else None)
        if not in_store:
            return None  # neither stored nor held (after a reset): prefill, then store
        return PlaceUnit(unit.first, unit.n_pieces, unit.label, Source.STORE)
