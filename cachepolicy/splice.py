"""What an approximate KV-splicing plan asks the executor to do (attention-only models):
write screenshots' KV rows into the sequence instead of prefilling them, and keep new
screenshots' canonical KV in the episode's store.  Records only (pure, no engine).

The layout is the terminal one, unmerged: ``[head][action…][intro image outro]…[gen]``.  A
screenshot's *unit* is its three pieces (intro, image, outro: the unit whose KV is stored and
placed).  Per step the prefix (head and actions) stays exact — trimmed back and extended by
the new action as terminal-slot does — and the window's units that are not new come from:

* the **store** (``kamera``), at a unit's first reuse: its canonical KV (computed once, in
  the canonical context: the episode's head alone, the unit right after it) plus its rank-m
  conditioning patch, re-rotated to the unit's position now (``kv_patch.place``) — in place of
  the KV the unit got in context;
* the **sequence** itself: the unit's rows as the sequence held them last step, re-rotated
  to their new position — a kamera survivor already written from the store (``placed``), or,
  for ``kamera@own``, ``random-evict`` and ``recency-evict``, the unit's own KV, with ``keep``
  of its image cells left (the others dropped: their positions stay empty).

New units are prefilled in context.  ``StoreUnit`` asks for a unit's store entry — a
canonical forward on the spare sequence and the patch to the unit's KV in context — at the
plan's start, from the rows the sequence holds from an earlier step (``held_pos0``): the
newest screenshot's canonical forward runs in the *next* plan, which under overlap is the
prefetch, off the critical path.  An entry lives until its unit is placed (normally in the
plan that made it; one a stopped prefetch did not reach waits in the episode's state for the
next plan): with a sliding window no screenshot comes back once it has left, so nothing is
kept longer — unless the policy *recalls* (``Splice.retain``): then the entries of the
screenshots most recently used stay, and a new screenshot whose pixels equal one of theirs
(the screen came back to an earlier state) has its image placed from that entry instead of
prefilled — see ``cachepolicy.splice_exec``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from cachepolicy.pieces import Piece


class Source(enum.Enum):
    STORE = "store"  # canonical KV + patch from the episode's store
    SEQUENCE = "sequence"  # the rows the sequence holds now (before the step's trim)


class Drop(enum.Enum):
    RANDOM = "random"  # uniformly at random among the unit's image cells
    OLDEST = "oldest"  # the image's earliest cells first


@attrs.frozen
class PlaceUnit:
    """Write the unit ``pieces[first : first + n_pieces]`` instead of prefilling it."""

    first: int
    n_pieces: int
    label: str  # the screenshot segment's key (the store's label)
    source: Source
    #: SEQUENCE: where the unit starts in the sequence before the step's trim
    held_pos0: int = 0
    #: SEQUENCE: image cells to keep (None: all the sequence holds)
    keep: int | None = None
    drop: Drop = Drop.RANDOM
    seed: int = 0  # the random choice of dropped cells (a pure function of the plan)
    #: STORE: the entry read (None: the unit's own ``label``) — a *recall* reads the entry
    #: of an earlier screenshot with the same pixels
    entry: str | None = None
    #: STORE: only the entry's cells at offsets [part[0], part[0] + part[1]) from its first
    #: position (a recall places the image piece alone: its intro and outro name another
    #: step and are prefilled in context)
    part: tuple[int, int] | None = None

    @property
    def entry_label(self) -> str:
        return self.label if self.entry is None else self.entry


@attrs.frozen
class StoreUnit:
    """Store the unit ``pieces[first : first + n_pieces]`` as canonical KV + a rank-``rank``
    patch to its KV in context, at the plan's start, from the sequence's rows at
    ``held_pos0`` (before the step's trim)."""

    first: int
    n_pieces: int
    label: str
    held_pos0: int


@attrs.frozen
class Splice:
    """A plan's KV splicing: units placed, units stored, store entries kept."""

    place: tuple[PlaceUnit, ...] = ()
    store: tuple[StoreUnit, ...] = ()
    #: pieces[:canonical_prefix] are the canonical context a stored unit follows
    canonical_prefix: int = 1
    rank: int = 0  # the conditioning patch's rank (0: canonical KV alone)
    keep_stored: tuple[str, ...] = ()  # labels of the parent's store entries kept
    #: labels of the units whose rows the plan leaves store-written (canonical + patch):
    #: the next plan re-rotates them where the sequence holds them
    placed: tuple[str, ...] = ()
    #: labels of store entries kept after their unit is placed, oldest use first: the
    #: screenshots a later step may recall (``kamera``'s ``recall<N>``); an entry not
    #: listed lives only until it is placed
    retain: tuple[str, ...] = ()
    #: a prefetch does not stop before it has written the units it places from the
    #: sequence (``Source.SEQUENCE``): its start cuts their rows out of the sequence, so
    #: after a stop there the next step has nothing to place (window-replay's kept
    #: screenshots; the executor's ``stop_from``)
    hold_until_placed: bool = False


def image_part(pieces: Sequence[Piece]) -> tuple[int, int] | None:
    """(offset from the unit's first position, positions) of a unit's image piece."""
    off = 0
    for piece in pieces:
        if piece.is_image:
            return off, piece.n_pos
        off += piece.n_pos
    return None


def image_identity(pieces: Sequence[Piece]) -> tuple[str | None, tuple[int, int] | None]:
    """A unit's pixels (its image piece's ``image_id``) and where the image lies in it
    (``image_part``): what a store entry records and a recall matches."""
    image_id = next((p.image_id for p in pieces if p.is_image), None)
    return image_id, image_part(pieces)
