"""``window-replay`` (hybrid models under multi-section RoPE: qwen35): the terminal layout
with the retained screenshots' attention KV kept — approximate, opt-in.

terminal-slot re-prefills the whole window every step on a hybrid: the new history line
enters before the retained screenshots, and a recurrent state cannot have a line inserted
into its past.  window-replay keeps what it can and recomputes a budget:

* the prefix ``[head][history]`` is terminal-slot's, exactly (restore the region
  checkpoint, prefill the new line, take the next region checkpoint);
* the retained screenshots' pieces (``[region, cut)``) are not prefilled: their attention
  KV is read out of the sequence as it held them last step, moved by the new line's shift and
  re-rotated per M-RoPE component (``kv_rope``; llama.cpp refuses its own K-shift there), and
  written back (``cachepolicy.splice``: units from the sequence).  The recurrent state does
  not absorb them: it stays at the region checkpoint.  With pinned screenshots the kept
  pieces come in two runs, each moved by its own shift (text joining them is prefilled);
* the budget's tail of the retained window (``[cut, end)``: ``window-replay@10%`` of its rows,
  ``@256`` rows; a screenshot straddling the cut is replayed whole) is prefilled from that
  recurrent state — its recurrent state and its attention KV recomputed — then the new
  screenshot and the generation prompt, as terminal-slot prefills them.

What is exact: the prefix, and every piece after the cut as a function of the state before
it; approximate: the placed pieces' KV (computed last step, in last step's context, one
more f16 rounding of their keys) and the recurrent state, which skipped them.  A budget
covering the retained window places nothing: the plan is terminal-slot's own, bitwise.  A
step that placed anything is marked ``approximate`` (``Execution.approximate``: the plan
spliced) and its placed runs carry tagged digests, so no exact path ever reuses it.  Each
step's drift (next-token KL and top-1 against terminal-scratch's prompt from scratch) is
measured on the spare sequence where asked (``measure_drift``: ``--replay-drift``,
bench-eval's default), as relocate's is — a from-scratch prefill more per step.

With overlap the prefetch does it (terminal-slot's prefetch, with the kept screenshots placed
and the tail replayed) and the step continues from there: its critical path is the new
screenshot and the generation prompt, as terminal-slot+overlap's.  Critical work of other
episodes may stop the prefetch, but not before it wrote the kept screenshots back
(``Splice.hold_until_placed``: its start cut them out of the sequence); stopped before the
replayed tail, the step continues there and prefills the rest — work moved onto the critical
path, none added.  A first step, or a sequence that does not hold last step's window as this
policy published it, prefills the window (terminal-slot's plan).
"""

from __future__ import annotations

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog
from cachepolicy.engine.checkpoint import ModelKind, RunKind
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.layouts import PromptKit, terminal_steps
from cachepolicy.pieces import Piece, digests
from cachepolicy.plan import CacheView, ModelInfo, Plan, PolicyManifest, Start, StartKind
from cachepolicy.policies.registry import register
from cachepolicy.policies.terminal_slot import REGION
from cachepolicy.splice import PlaceUnit, Source, Splice
from cachepolicy.tail import DEFAULT_BUDGET, ReplayBudget


@attrs.frozen
class Retained:
    """The window's pieces the sequence holds from last step: ``held[j]`` is where piece
    ``j``'s content starts in the sequence now; ``end`` is one past the last such piece."""

    held: dict[int, int]
    end: int


def retained(pieces: tuple[Piece, ...], region: int, view: CacheView) -> Retained | None:
    """The window pieces (from ``region`` on) whose content the sequence holds, as last
    step's plan published it (one run per piece, ``CacheState.layout_keys``) — or None.  An
    image is held under its key with as many positions; a text piece where its tokens lie,
    one by one, shifted as the screenshot before or after it is (its tokens may lie inside a
    merged piece of last step's; a piece joining a kept screenshot to one that left the
    window is not held).  With pinned screenshots the held pieces come in two runs, each
    with its own shift."""
    keys, hist = view.state.layout_keys, view.seq.history
    if not keys or len(hist) < len(keys):
        return None
    images = {k: hist[i] for i, k in enumerate(keys)
              if hist[i].kind is RunKind.EMBEDDINGS}
    tokens: dict[int, int] = {}
    for run in hist[: len(keys)]:
        if run.kind is RunKind.TEXT:
            tokens.update(zip(range(run.pos0, run.end_pos), run.tokens))
    starts = {region: sum(p.n_pos for p in pieces[:region])}
    for j in range(region, len(pieces)):
        starts[j + 1] = starts[j] + pieces[j].n_pos
    shift: dict[int, int] = {}  # image piece -> how far it moved
    for j in range(region, len(pieces)):
        old = images.get(pieces[j].key) if pieces[j].is_image else None
        if old is not None and old.n_pos == pieces[j].n_pos:
            shift[j] = starts[j] - old.pos0
    if not shift:
        return None
    held: dict[int, int] = {}
    for j in range(region, len(pieces)):
        p = pieces[j]
        if p.is_image:
            if j in shift:
                held[j] = starts[j] - shift[j]
            continue
        before = [shift[k] for k in shift if k < j][-1:]
        after = [shift[k] for k in shift if k > j][:1]
        for d in after + before:  # an intro moves with the image it opens
            if all(tokens.get(starts[j] - d + o) == t for o, t in enumerate(p.tokens)):
                held[j] = starts[j] - d
                break
    return Retained(held, max(held) + 1)


def replay_from(pieces: tuple[Piece, ...], kept: Retained, budget: ReplayBudget,
                region: int) -> int:
    """The first replayed piece: the budget's rows of the held pieces, counted back from
    their end, whole pieces (a screenshot straddling the cut is replayed whole)."""
    matched = sum(pieces[j].n_tokens for j in kept.held)
    left = budget.rows(matched)
    cut = kept.end
    while cut > region and left > 0:
        cut -= 1
        if cut in kept.held:
            left -= pieces[cut].n_tokens
    return cut


@register
class WindowReplayPolicy(CachePolicy):
    name = "window-replay"
    pins = True
    takes_option = True
    option_help = ("the replay budget: rows (256) or a share (10%) of the retained "
                   "screenshots' rows, recomputed from the region checkpoint; 100% is "
                   "terminal-slot")
    manifest = PolicyManifest(
        changes="the sequence after the screenshot-region checkpoint: the retained "
                "screenshots' attention KV before the budget's cut is moved and re-rotated "
                "(M-RoPE, in numpy), not recomputed; the recurrent state skips it",
        evidence="the sequence's runs aligned with the published layout keys (images by "
                 "key, text token by token); the region checkpoint",
        adds_work="per step one state read and write of the sequence; re-prefills the "
                  "budget's tail of the retained screenshots (recurrent state and attention "
                  "KV) from the region checkpoint, then the new screenshot as terminal-slot",
        omitted_recoverable=True, quality="approximate", bounded=True,
        supports=frozenset({ModelKind.HYBRID}), needs_scratch_sequence=True)

    def __init__(self, model: ModelInfo, kit: PromptKit, *, window: int = 3,
                 decode_tokens: int = 16, option: str | None = None,
                 pinned: int = 0, measure_drift: bool = False) -> None:
        super().__init__(model, kit, window=window, decode_tokens=decode_tokens,
                         pinned=pinned, measure_drift=measure_drift)
        if model.window_problem is not None:
            raise PolicyRefusedError(f"policy {self.name!r} cannot run on this model: "
                                     f"{model.window_problem}")
        self.budget = self.parse_option(option) if option else DEFAULT_BUDGET

    @classmethod
    def parse_option(cls, text: str) -> ReplayBudget:
        """``256`` (rows) or ``10%`` (of the retained window's rows): tail replay's budget."""
        return ReplayBudget.parse(text)

    def with_tail(self, budget: ReplayBudget) -> CachePolicy | None:
        """No tail-replay twin for the memory ladder's replay rung: its plans start from the
        region checkpoint, which this policy always holds, and place by content already."""
        return None

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        pieces, region = terminal_steps(log, self.kit, self.window, pinned=self.pinned)
        plan = self.plan_reusing(log, view, pieces, anchors=[(region, REGION)],
                                 drift_reference=pieces if self.measure_drift else ())
        if plan.reused_pieces > region:
            return plan  # the sequence already holds this window exactly: nothing to place
        after_prefetch = self._continue(log, view, pieces, region)
        if after_prefetch is not None:
            return after_prefetch
        return self._placing(plan, view, region, decode=True)

    def prefetch(self, log: ContextLog, view: CacheView) -> Plan | None:
        """While the VM acts: terminal-slot's prefetch (the new history line, the advanced
        region checkpoint, the K-1 screenshots the next window keeps), with the kept
        screenshots placed and the budget's tail replayed — so the next step's critical path
        prefills only the new screenshot and the generation prompt."""
        if self.window < 2 or not log.actions:
            return None
        pieces, region = terminal_steps(log, self.kit, self.window - 1,
                                        generation_prompt=False, pinned=self.pinned)
        if pieces and not pieces[-1].is_image and len(pieces) > region:
            pieces = pieces[:-1]  # its closing text joins the next screenshot's intro
        plan = self.plan_reusing(log, view, pieces, anchors=[(region, REGION)], decode=False)
        if plan.reused_pieces > region:
            return plan
        return self._placing(plan, view, region, decode=False)

    def _continue(self, log: ContextLog, view: CacheView, pieces: tuple[Piece, ...],
                  region: int) -> Plan | None:
        """The step after this policy's prefetch: the sequence holds the step's first ``n``
        pieces as the prefetch left them — the exact prefix (digests), then the window's
        kept pieces at their own positions (content) — so it continues there (KEEP) and
        prefills the rest.  Approximate (the prefetch placed), so the plan carries an empty
        splice: the step is marked.  None where the sequence holds anything else."""
        keys, hist = view.state.layout_keys, view.seq.history
        n = len(keys)
        if not region < n < len(pieces) or tuple(p.key for p in pieces[:n]) != keys:
            return None
        if len(hist) != n or hist[region - 1].digest != digests(pieces)[region - 1]:
            return None
        kept = retained(pieces[:n], region, view)
        at = sum(p.n_pos for p in pieces[:region])
        for j in range(region, n):
            if kept is None or kept.held.get(j) != at:
                return None
            at += pieces[j].n_pos
        if at != view.seq.next_pos:
            return None
        plan = self.plan_reusing(log, view, pieces, anchors=[(region, REGION)],
                                 start=(Start(StartKind.KEEP, pos=at), n),
                                 drift_reference=pieces if self.measure_drift else ())
        return attrs.evolve(plan, splice=Splice())

    def _placing(self, plan: Plan, view: CacheView, region: int, *, decode: bool) -> Plan:
        """``plan`` (terminal-slot's) with the held window pieces before the budget's cut
        placed from the sequence instead of prefilled."""
        pieces = plan.pieces
        kept = retained(pieces, region, view)
        if kept is None:
            return plan
        # a decoding plan's last piece (the generation prompt) is never placed
        cut = min(replay_from(pieces, kept, self.budget, region),
                  len(pieces) - 1 if decode else len(pieces))
        place = tuple(PlaceUnit(j, 1, pieces[j].key, Source.SEQUENCE, held_pos0=pos0)
                      for j, pos0 in sorted(kept.held.items()) if j < cut)
        if not place:
            return plan  # the budget covers the retained window: terminal-slot's plan
        # the sequence read out, its rows, the composed blob: three copies at most
        workspace = 3 * plan.forecast.successor_seq_bytes
        forecast = attrs.evolve(plan.forecast,
                                workspace_bytes=plan.forecast.workspace_bytes + workspace)
        # a prefetch stopped by other episodes' critical work still writes the kept
        # screenshots back (the start cut them out of the sequence: issue 48's N = 4
        # fallbacks); it may stop before the replayed tail, which the step then prefills
        return attrs.evolve(plan, splice=Splice(place=place, hold_until_placed=True),
                            forecast=forecast)
