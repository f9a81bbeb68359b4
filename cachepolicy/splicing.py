"""The shared planner of the KV-splicing policies (attention-only, approximate): ``kamera``
(``policies/kamera.py``), ``random-evict`` and ``recency-evict`` (``policies/
token_evict.py``).

Layout: terminal-scratch's prompt, ``[head][action…][≤K screenshots][gen]``, with each
screenshot's intro, image and outro its own piece (a *unit*, ``cachepolicy.splice``) so that
its KV can be written and stored as one.  Per step the prefix ``[head][action…]`` is exact
(cut back and extended by the new action, as terminal-slot does; an attention model needs no
checkpoint for it); each window unit that is not new is written into the sequence by the
subclass's ``place`` (re-rotated to its position now); new units are prefilled in context,
and ``stores`` says whether store entries are made.  A unit's entry is made from its KV in
context once the sequence holds it from an earlier step — at the start of the next plan
(the newest screenshot's canonical forward therefore runs one plan later: under overlap in
the prefetch, off the critical path) — and placed in the same plan; from then on the unit
is a survivor whose store-written rows are re-rotated where the sequence holds them
(``CacheState.placed``).  A first step, or a sequence that is not what the episode
published, prefills the whole window.

Drift against the exact prompt (terminal-scratch's pieces, from scratch on the spare
sequence) is measured every step, as relocate's is.
"""

from __future__ import annotations

import abc
import hashlib

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.layouts import PromptKit, terminal, terminal_steps
from cachepolicy.pieces import Piece, digests
from cachepolicy.plan import CacheView, ModelInfo, Plan, Start, StartKind
from cachepolicy.reuse import best_start
from cachepolicy.splice import PlaceUnit, Source, Splice, StoreUnit, image_identity

ATTENTION_ONLY = frozenset({ModelKind.ATTENTION})


@attrs.frozen
class Unit:
    """One window screenshot's pieces ``pieces[first : first + n_pieces]``."""

    first: int
    n_pieces: int
    label: str  # the screenshot segment's key
    image_tokens: int


@attrs.frozen
class Held:
    """Where a unit the sequence holds from last step starts, and its image cells now."""

    pos0: int
    image_cells: int


def unit_layout(log: ContextLog, kit: PromptKit, window: int, *,
                generation_prompt: bool = True, pinned: int = 0,
                ) -> tuple[tuple[Piece, ...], int, tuple[Unit, ...]]:
    """The terminal layout with empty text pieces dropped and nothing merged; returns
    (pieces, region start, the window's units in order)."""
    raw, region = terminal(log, kit, window, generation_prompt=generation_prompt,
                           pinned=pinned)
    pieces: list[Piece] = []
    units: list[Unit] = []
    for i, p in enumerate(raw):
        if i == region:
            region = len(pieces)
        if not p.is_image and not p.tokens:
            continue
        pieces.append(p)
    by_label: dict[str, list[int]] = {}
    for j, p in enumerate(pieces[region:], start=region):
        if p.key == "gen":
            continue
        label = p.sources[0]
        by_label.setdefault(label, []).append(j)
    for label, idx in by_label.items():
        image = next(pieces[j] for j in idx if pieces[j].is_image)
        units.append(Unit(idx[0], len(idx), label, image.n_tokens))
    return tuple(pieces), region, tuple(units)


def _seed(label: str, generation: int) -> int:
    h = hashlib.blake2b(f"{label}@{generation}".encode(), digest_size=8)
    return int.from_bytes(h.digest(), "little")


class SplicingPolicy(CachePolicy, abc.ABC):
    """Base of the splicing policies; a subclass says where a retained unit comes from."""

    #: the policy's ``@<option>`` in bench arms (``kamera@m32``, ``random-evict@50%``)
    option_help: str = ""
    takes_option = True
    pins = True

    def __init__(self, model: ModelInfo, kit: PromptKit, *, window: int = 3,
                 decode_tokens: int = 16, option: str | None = None,
                 pinned: int = 0, measure_drift: bool = False) -> None:
        super().__init__(model, kit, window=window, decode_tokens=decode_tokens,
                         pinned=pinned, measure_drift=measure_drift)
        if model.kv_edit_problem is not None:
            raise PolicyRefusedError(f"policy {self.name!r} cannot run on this model: "
                                     f"{model.kv_edit_problem}")
        self.configure(option)

    @abc.abstractmethod
    def configure(self, option: str | None) -> None:
        """Read the policy's option (``parse_option``'s text); ValueError when it is bad."""

    @classmethod
    @abc.abstractmethod
    def parse_option(cls, text: str) -> object:
        """The option's value, or ValueError (for arms and the command line)."""

    @abc.abstractmethod
    def place(self, unit: Unit, held: Held | None, in_store: bool,
              units: tuple[Unit, ...], generation: int) -> PlaceUnit | None:
        """How a window unit that is not new is written (None: prefill it in context);
        ``in_store``: the episode's store has (or the plan's start makes) its entry."""

    def stores(self) -> bool:
        """Whether new units get a store entry (canonical KV + patch)."""
        return False

    def requires_spare_sequence(self) -> bool:
        return self.stores()  # a store entry's canonical forward runs there

    rank = 0
    #: how many store entries stay for recall after their unit is placed (0: none; a
    #: screenshot is then never placed from the store once it has left the window)
    recall = 0

    def continues_prefetch(self) -> bool:
        """Whether a step may keep the units its prefetch placed where they are
        (``_continue``): true where placing a held unit at its own position is the identity
        (kamera@own: its rows re-rotated by 0); not for the token evictors (the step thins
        the newest survivor, which the prefetch kept whole) nor a store's policies (the step
        may store)."""
        return False

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        reference, _ = terminal_steps(log, self.kit, self.window, pinned=self.pinned)
        if self.continues_prefetch():
            after_prefetch = self._continue(log, view, reference)
            if after_prefetch is not None:
                return after_prefetch
        return self._plan(log, view, self.window, decode=True, reference=reference)

    def _continue(self, log: ContextLog, view: CacheView,
                  reference: tuple[Piece, ...]) -> Plan | None:
        """The step after this policy's prefetch: the sequence holds the step's first ``n``
        pieces as the prefetch left them — the exact prefix (digests), then the window's
        survivors placed at the positions this step gives them (one run per piece, the
        published layout's keys) — so it continues there (KEEP) and prefills the new
        screenshot and the generation prompt.  Before, the step cut the survivors out and
        wrote them back unchanged: one more read and write of the whole sequence on the
        critical path, ~0.1 s a step at N = 4 (docs/benchmarks.md §10).  Approximate (the
        prefetch placed), so the plan carries an empty splice: the step is marked.  None
        where the sequence holds anything else."""
        pieces, region, _ = unit_layout(log, self.kit, self.window, pinned=self.pinned)
        keys, hist = view.state.layout_keys, view.seq.history
        n = len(keys)
        if not 0 < region < n < len(pieces) or tuple(p.key for p in pieces[:n]) != tuple(keys):
            return None
        if len(hist) != n or hist[region - 1].digest != digests(pieces)[region - 1]:
            return None
        at = 0
        for run, piece in zip(hist, pieces[:n]):
            if run.pos0 != at or run.n_pos != piece.n_pos:
                return None
            at += piece.n_pos
        if at != view.seq.next_pos:
            return None
        plan = self.plan_reusing(log, view, pieces, start=(Start(StartKind.KEEP, pos=at), n),
                                 drift_reference=reference if self.measure_drift else (),
                                 trim_after=region)
        return attrs.evolve(plan, splice=Splice())

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """While the VM acts: the exact prefix with this step's action, and the K-1
        screenshots the next window keeps, written (the newest stored first, from its KV in
        context) — so the next step's critical path prefills only the new screenshot."""
        if self.window < 2 or not log.actions:
            return None
        return self._plan(log, view, self.window - 1, decode=False, reference=())

    def _plan(self, log: ContextLog, view: CacheView, window: int, *, decode: bool,
              reference: tuple[Piece, ...]) -> Plan:
        pieces, region, units = unit_layout(log, self.kit, window, generation_prompt=decode,
                                            pinned=self.pinned)
        held = self._held(view)
        start = best_start(pieces[:region], view, self.model.kind)
        if start[1] == 0 or held is None:
            held = {}
        # the newest screenshot of a step's window is new; a prefetch's window has none
        newest = units[-1].label if units and decode else None
        stored = {s.label: s for s in view.state.stored}
        known = {s.label: (s.image_id, s.image_part) for s in view.state.stored}
        placed_before = set(view.state.placed) if held else set()
        place: list[PlaceUnit] = []
        store: list[StoreUnit] = []
        placed: list[str] = []
        recalled: list[str] = []
        for u in units:
            h = held.get(u.label)
            if u.label == newest and h is None:
                # new: prefilled in context (stored from the sequence next plan) — or, when
                # an entry holds its pixels, its image placed from there
                how = self._recall(u, pieces, known) if self.recall else None
                if how is not None:
                    place.append(how)
                    placed.append(u.label)
                    recalled.append(how.entry_label)
                continue
            if self.stores() and h is not None and u.label in placed_before:
                # store-written last step: a survivor, its rows re-rotated
                place.append(PlaceUnit(u.first, u.n_pieces, u.label, Source.SEQUENCE,
                                       held_pos0=h.pos0))
                placed.append(u.label)
                continue
            from_held = self.stores() and u.label not in stored and h is not None
            if from_held:
                store.append(StoreUnit(u.first, u.n_pieces, u.label, held_pos0=h.pos0))
                known[u.label] = image_identity(pieces[u.first:u.first + u.n_pieces])
            how = self.place(u, h, from_held or u.label in stored, units, log.generation)
            if how is None:
                continue  # prefilled in context (stored from the sequence next plan)
            place.append(how)
            if how.source is Source.STORE:
                placed.append(u.label)
        window = {u.label for u in units}
        splice = Splice(place=tuple(place), store=tuple(store),
                        canonical_prefix=1, rank=max(0, self.rank),
                        keep_stored=tuple(s for s in stored if s in window),
                        placed=tuple(placed),
                        retain=self._retained(known, recalled),
                        # without a store (kamera@own, random-evict, recency-evict) the
                        # survivors live only in the sequence's rows, which the start cuts
                        # out: a prefetch stopped before writing them back left the next
                        # step nothing to place (kamera@own's whole-window steps behind
                        # ``kvagent serve`` at N = 4, as window-replay's;
                        # tests/test_kamera_own_preempted.py, all three).  A store's
                        # stopped prefetch publishes the entries it made
                        # (tests/test_kamera.py): not changed here
                        hold_until_placed=not self.stores() and any(
                            p.source is Source.SEQUENCE for p in place))
        plan = self.plan_reusing(log, view, pieces, start=start, decode=decode,
                                 drift_reference=reference if self.measure_drift else (),
                                 trim_after=region)
        return self._with_splice(plan, view, splice, units)

    def _recall(self, unit: Unit, pieces: tuple[Piece, ...],
                known: dict[str, tuple[str | None, tuple[int, int] | None]],
                ) -> PlaceUnit | None:
        """The new unit's image placed from the entry of the most recently used screenshot
        with the same pixels (and as many image positions), or None: prefill it."""
        unit_pieces = pieces[unit.first:unit.first + unit.n_pieces]
        at = next((unit.first + i for i, p in enumerate(unit_pieces) if p.is_image), None)
        if at is None or pieces[at].image_id is None:
            return None
        image = pieces[at]
        for label, (image_id, part) in reversed(list(known.items())):
            if image_id == image.image_id and part is not None and part[1] == image.n_pos:
                return PlaceUnit(at, 1, unit.label, Source.STORE, entry=label, part=part)
        return None

    def _retained(self, known: dict[str, tuple[str | None, tuple[int, int] | None]],
                  recalled: list[str]) -> tuple[str, ...]:
        """The ``recall`` entries most recently made or used, oldest first (a recalled
        entry counts as used now); of two entries with the same pixels only the newer stays,
        so duplicates never crowd out other screens."""
        if not self.recall:
            return ()
        order = [x for x in known if x not in recalled] + list(dict.fromkeys(recalled))
        kept: list[str] = []
        pixels: set[str] = set()
        for label in reversed(order):
            image_id = known[label][0]
            if image_id is not None and image_id in pixels:
                continue
            if image_id is not None:
                pixels.add(image_id)
            kept.append(label)
            if len(kept) == self.recall:
                break
        return tuple(reversed(kept))

    def _held(self, view: CacheView) -> dict[str, Held] | None:
        """The units the sequence holds as the episode published them (one run per piece
        of last step's layout), or None when it does not."""
        keys, hist = view.state.layout_keys, view.seq.history
        if not keys or len(hist) < len(keys):
            return None
        out: dict[str, Held] = {}
        for i, key in enumerate(keys):
            label = key.split(":")[0]
            if not label.startswith("screenshot@"):
                continue
            if label not in out:
                out[label] = Held(hist[i].pos0, 0)
            if ":" not in key:  # the image piece
                out[label] = attrs.evolve(out[label], image_cells=hist[i].n_tokens)
        return out

    def _with_splice(self, plan: Plan, view: CacheView, splice: Splice,
                     units: tuple[Unit, ...]) -> Plan:
        m = self.model
        sizes = {u.first: sum(p.n_tokens for p in plan.pieces[u.first:u.first + u.n_pieces])
                 for u in units}
        # a stored unit: its canonical rows, and a patch of at most twice their bytes
        store_bytes = sum(3 * sizes[s.first] * m.kv_bytes_per_token for s in splice.store)
        # the sequence read out, its rows, the composed blob: three copies at most
        workspace = 3 * plan.forecast.successor_seq_bytes if splice.place else 0
        forecast = attrs.evolve(
            plan.forecast,
            new_checkpoint_bytes=plan.forecast.new_checkpoint_bytes + store_bytes,
            workspace_bytes=plan.forecast.workspace_bytes + workspace)
        reads = set(splice.keep_stored) | set(splice.retain) | {
            u.entry_label for u in splice.place if u.source is Source.STORE}
        kept = tuple(s for s in view.state.stored if s.label in reads)
        return attrs.evolve(plan, splice=splice, splice_from=kept, forecast=forecast)
