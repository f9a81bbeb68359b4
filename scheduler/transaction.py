"""One step of one episode as a transaction: append → select → reserve → execute → publish
→ release.

* append: the new segments go into a new log (generation + 1);
* select: the policy plans from the log and the cache view (pure);
* reserve: the plan's forecast (bytes beyond what the parent holds) against the ledger;
* execute: the engine runs the plan on the episode's sequence;
* publish: compare-and-publish — the successor becomes the episode's state only if the
  episode still shows the parent this transaction started from (generation fence);
* release: the reservation is returned; the parent's checkpoints that the successor does not
  keep lose their last reference and are freed.
Any failure before publication leaves the parent published and usable: the engine's own
bookkeeping says what the sequence holds, and the parent's checkpoints are untouched.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import attrs
import structlog

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.engine.checkpoint import is_approximate
from cachepolicy.errors import StalePublishError
from cachepolicy.executor import Execution, decode, prefill
from cachepolicy.plan import CacheState, CacheView, Plan
from cachepolicy.splice import Source
from cachepolicy.engine.drafts import Drafting
from cachepolicy.engine.sampling import SamplingParams
from scheduler.ledger import MemoryLedger, Reservation
from scheduler.records import StepRecord
from scheduler.trim import cut_to_reuse_point

if TYPE_CHECKING:  # the engine's type only: a thin client imports this module (StepOptions)
    from cachepolicy.engine import Engine

log = structlog.get_logger("kvagent.transaction")
_txn_ids = itertools.count(1)


@attrs.define(eq=False)
class EpisodeCache:
    """One episode's sequence, context log and published cache state."""

    episode_id: str
    seq: int
    policy: CachePolicy
    log: ContextLog = attrs.Factory(ContextLog)
    state: CacheState = attrs.Factory(CacheState)
    steps_done: int = 0
    seed: int = 0  # the episode's sampling seed (mixed with the step index at each step)
    options: StepOptions | None = None  # the episode's own step options (None: the scheduler's)
    #: the spare sequence its plans may prefill a reference prompt on (its policy's manifest
    #: asked for one: ``needs_scratch_sequence``); the scheduler's, shared by every episode
    #: that asked, and used only in the prefill phase, which holds the engine gate
    scratch_seq: int | None = None
    #: the episode allows approximation under memory pressure (``AgentConfig.replay_rung``):
    #: its policy's tail-replay variant (``CachePolicy.with_tail``), which plans its steps
    #: while its state was hit by the replay rung or is approximate; None: never
    replay_twin: CachePolicy | None = None
    publish_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def view(self, engine: Engine) -> CacheView:
        return CacheView(self.state, engine.seq_info(self.seq))

    def publish(self, parent_log: ContextLog, parent: CacheState, new_log: ContextLog,
                successor: CacheState, ledger: MemoryLedger,
                reservation: Reservation | None) -> None:
        """Compare-and-publish: the successor replaces ``parent`` only if the episode still
        shows it; the ledger's holding changes in the same critical section."""
        with self.publish_lock:
            if self.state is not parent or self.log is not parent_log:
                raise StalePublishError(
                    f"episode {self.episode_id}: generation {self.state.generation} was "
                    f"published after this transaction started from generation "
                    f"{parent.generation}")
            ledger.publish(self.episode_id, successor.held_bytes, reservation)
            self.log, self.state = new_log, successor


FaultHook = Callable[[str], None]


@attrs.frozen
class StepOptions:
    decode_tokens: int = 16
    sampling: SamplingParams = attrs.Factory(SamplingParams)
    stop_at_eog: bool = False
    stop: tuple[str, ...] = ()  # decoding ends once the text holds one of these
    #: jump-forward and drafts (speed only: the tokens are plain decoding's)
    drafting: Drafting = attrs.Factory(Drafting)
    #: called with each decoded token as it comes (in the engine's worker thread): streaming
    on_token: Callable[[int], None] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class PrefetchRecord:
    """What a prefetch transaction did (it decodes nothing)."""

    episode_id: str
    generation: int
    prefill_tokens: int
    prefill_s: float  # the vision encoder excluded (``encode_s``)
    planned: bool  # False: the policy had nothing to prefetch (only the log advanced)
    preempted: bool = False  # stopped early for critical work; what it did was published
    encode_s: float = 0.0
    approximate: bool = False  # the sequence's state after it is approximate
    replay_tokens: int = 0  # rows its tail replay recomputed
    #: KV splicing: tokens its canonical forwards prefilled for the store, and their seconds
    store_tokens: int = 0
    store_s: float = 0.0


@attrs.define(eq=False)
class Transaction:
    """One step (or prefetch) of one episode, between ``begin`` and ``commit`` / ``abort``."""

    txn_id: str
    episode: EpisodeCache
    parent_log: ContextLog
    parent: CacheState
    new_log: ContextLog
    plan: Plan | None  # None: a prefetch with nothing to compute
    prefetch: bool
    reservation: Reservation | None = None
    degraded: str = ""  # why the plan is not the episode's own policy's plan
    #: a guess (``CachePolicy.guess``): planned on a log with a guessed screenshot that is
    #: never published — the episode keeps its log, its state gains the guess's pieces
    guess: bool = False

    @property
    def need_bytes(self) -> int:
        return self.plan.forecast.extra_bytes if self.plan is not None else 0


def begin(engine: Engine, episode: EpisodeCache, segments: tuple[Segment, ...], *,
          prefetch: bool = False, policy: CachePolicy | None = None,
          degraded: str = "", replace: bool = False, guess: bool = False) -> Transaction:
    """append + select: a new log and the plan for it (``policy`` overrides the episode's own
    policy, e.g. a downgraded one; ``replace``: the segments are the whole new log;
    ``guess``: the segments are a guess, planned on but never appended).  Nothing is
    reserved or executed yet."""
    prefix = "g" if guess else "p" if prefetch else "t"
    txn_id = f"{episode.episode_id}/{prefix}{next(_txn_ids)}"
    parent_log, parent = episode.log, episode.state
    new_log = parent_log.replace(*segments) if replace else parent_log.append(*segments)
    chooser = policy or episode.policy
    view = episode.view(engine)
    if policy is None and episode.replay_twin is not None and (
            parent.replay_next or is_approximate(view.seq.history)):
        # the replay rung took this episode's checkpoints or recurrent state, or its state is
        # approximate already: an exact plan would throw the sequence away
        chooser = episode.replay_twin
    if guess:
        return Transaction(txn_id, episode, parent_log, parent, parent_log,
                           chooser.guess(new_log, view), True, degraded=degraded, guess=True)
    if prefetch:
        plan = chooser.prefetch(new_log, view)
    else:
        plan = chooser.select(new_log, view, new=frozenset(s.key for s in segments))
    return Transaction(txn_id, episode, parent_log, parent, new_log, plan, prefetch,
                       degraded=degraded)


def admit(txn: Transaction, ledger: MemoryLedger) -> None:
    """reserve: the plan's forecast beyond what the parent holds, or BudgetExceededError."""
    txn.reservation = ledger.reserve(txn.txn_id, txn.need_bytes)


def abort(txn: Transaction, ledger: MemoryLedger) -> None:
    """Give the reservation back without executing (idempotent)."""
    if txn.reservation is not None:
        ledger.release(txn.reservation)


@contextmanager
def _rolls_back(engine: Engine, txn: Transaction, ledger: MemoryLedger) -> Iterator[None]:
    """Any failure inside rolls the transaction back: the parent stays published (the
    sequence brought back into account), the reservation is returned."""
    ep = txn.episode
    try:
        yield
    except BaseException as exc:
        log.info("txn_rollback", episode_id=ep.episode_id, seq_id=ep.seq, txn_id=txn.txn_id,
                 error=type(exc).__name__, reason=str(exc), prefetch=txn.prefetch)
        rollback(engine, txn, ledger)
        raise


def commit_prefill(engine: Engine, txn: Transaction, ledger: MemoryLedger, *,
                   should_stop: Callable[[], bool] | None = None) -> Execution | None:
    """Phase 1 (holds the engine's gate): execute the plan's prefill (and, on the episode's
    spare sequence if it has one, the plan's drift reference).  None for a prefetch the
    policy had nothing for."""
    if txn.plan is None:
        return None
    plan, ep = txn.plan, txn.episode
    log.debug("txn_execute", episode_id=ep.episode_id, seq_id=ep.seq, txn_id=txn.txn_id,
              policy=plan.policy, start=plan.start.kind.value,
              prefill_tokens=plan.prefill_tokens, prefetch=txn.prefetch)
    with _rolls_back(engine, txn, ledger):
        return prefill(engine, plan, ep.seq, scratch_seq=ep.scratch_seq,
                       should_stop=should_stop)


def commit_finish(engine: Engine, txn: Transaction, ledger: MemoryLedger,
                  options: StepOptions, prefilled: Execution | None, *,
                  fault: FaultHook | None = None,
                  should_stop: Callable[[], bool] | None = None) -> StepRecord | PrefetchRecord:
    """Phase 2 (needs no gate: decode rows join the engine's shared decode calls): decode,
    then publish + release.  Any failure before publication rolls back."""
    ep = txn.episode
    if txn.plan is None or prefilled is None:  # only the log advances
        ep.publish(txn.parent_log, txn.parent, txn.new_log,
                   attrs.evolve(txn.parent, generation=txn.new_log.generation), ledger, None)
        return PrefetchRecord(ep.episode_id, txn.new_log.generation, 0, 0.0, False)
    plan = txn.plan
    with _rolls_back(engine, txn, ledger):
        exe = decode(engine, plan, ep.seq, prefilled, decode_tokens=options.decode_tokens,
                     sampling=step_sampling(options.sampling, ep.seed, txn.new_log),
                     stop_at_eog=options.stop_at_eog, should_stop=should_stop,
                     stop=options.stop, on_token=options.on_token,
                     drafting=options.drafting)
        if fault is not None:
            fault("before_publish")
        successor = _successor(engine, ep, plan, exe, txn.parent)
        if txn.guess:  # the log did not change: neither does the state's generation
            successor = attrs.evolve(successor, generation=txn.parent.generation)
        ep.publish(txn.parent_log, txn.parent, txn.new_log, successor, ledger, txn.reservation)
        text = engine.detokenize(exe.output_tokens) if not txn.prefetch else ""
        text = cut_at_stop(text, options.stop)
    abort(txn, ledger)  # release (a no-op after a successful publish)
    log.debug("txn_publish", episode_id=ep.episode_id, seq_id=ep.seq, txn_id=txn.txn_id,
              generation=txn.new_log.generation, held=successor.held_bytes,
              checkpoints=len(successor.checkpoints), prefetch=txn.prefetch)
    if txn.prefetch:
        return PrefetchRecord(ep.episode_id, txn.new_log.generation, exe.prefill_tokens,
                              exe.prefill_s, True, preempted=exe.stopped_at is not None,
                              encode_s=exe.encode_s, approximate=exe.approximate,
                              replay_tokens=exe.replay_tokens,
                              store_tokens=exe.store_tokens, store_s=exe.store_s)
    ep.steps_done += 1
    return _record(txn, exe, successor, ledger, text)


def rollback(engine: Engine, txn: Transaction, ledger: MemoryLedger) -> None:
    """Roll back a transaction whose phases did not all run (e.g. cancelled between them)."""
    try:
        if txn.episode.state is txn.parent:
            settle_rollback(engine, txn.episode, ledger)
    finally:
        abort(txn, ledger)


def commit(engine: Engine, txn: Transaction, ledger: MemoryLedger,
           options: StepOptions = StepOptions(), *, fault: FaultHook | None = None,
           should_stop: Callable[[], bool] | None = None) -> StepRecord | PrefetchRecord:
    """Both phases in one call (callers that hold the engine themselves)."""
    prefilled = commit_prefill(engine, txn, ledger, should_stop=should_stop)
    return commit_finish(engine, txn, ledger, options, prefilled, fault=fault,
                         should_stop=should_stop)


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """The text up to (not including) the first stop string it holds."""
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(cuts)] if cuts else text


def settle_rollback(engine: Engine, ep: EpisodeCache, ledger: MemoryLedger) -> None:
    """After a failure before publication the parent stays published, but the engine's
    sequence may hold more than the parent accounted for (a plan restored, then prefilled
    some pieces).  Cut it back to the parent's reuse point — or clear it — so that what it
    holds is never more than the ledger holds for it, and publish what it really holds.
    (Engine errors here propagate: the sequence's state is unknown.)"""
    with ep.publish_lock:
        parent = ep.state
        held = engine.held_bytes(ep.seq)
        if held == parent.seq_bytes:
            return
        if held > parent.seq_bytes:
            cut = cut_to_reuse_point(engine, ep.seq, parent)
            if cut is None or cut > parent.seq_bytes:
                engine.clear(ep.seq)
                cut = 0
            held = cut
        successor = attrs.evolve(parent, seq_bytes=held, layout_keys=(),
                                 trim_pos=min(parent.trim_pos, engine.seq_info(ep.seq).next_pos))
        ledger.publish(ep.episode_id, successor.held_bytes, None)  # never grows: no refusal
        ep.state = successor
    log.info("txn_rollback_settled", episode_id=ep.episode_id, seq_id=ep.seq,
             seq_bytes=held)


def step_sampling(params: SamplingParams, episode_seed: int, log_: ContextLog) -> SamplingParams:
    """The step's sampling: the seed mixes the base seed, the episode's seed and the step
    index, so steps and episodes draw different numbers while any rerun of the same step
    (with or without overlap, after a rollback) draws the same ones."""
    if params.greedy:
        return params
    step = log_.step_count()
    seed = ((params.seed * 1_000_003 + episode_seed) * 1_000_033 + step) % (1 << 63)
    return attrs.evolve(params, seed=seed)


def _successor(engine: Engine, episode: EpisodeCache, plan: Plan, exe: Execution,
               parent: CacheState) -> CacheState:
    history = engine.seq_info(episode.seq).history
    if exe.stopped_at is not None:
        # A prefetch stopped early: the plan's anchors may not exist yet, so the parent's
        # checkpoints stay (still valid restore points: the sequence only grew past them).
        return CacheState(generation=plan.generation,
                          checkpoints=parent.checkpoints + exe.new_checkpoints,
                          seq_bytes=engine.held_bytes(episode.seq),
                          layout_keys=tuple(p.key for p in plan.pieces[: exe.stopped_at]),
                          trim_pos=min(parent.trim_pos, _end_of(plan, history, exe.stopped_at)),
                          trim_forgets=plan.trim_forgets and parent.trim_forgets,
                          **_store_after(plan, exe, parent, exe.stopped_at))
    kept = tuple(c for c in parent.checkpoints if c.label in plan.keep)
    return CacheState(generation=plan.generation, checkpoints=kept + exe.new_checkpoints,
                      seq_bytes=engine.held_bytes(episode.seq),
                      layout_keys=tuple(p.key for p in plan.pieces),
                      trim_pos=_end_of(plan, history, plan.trim_after),
                      trim_forgets=plan.trim_forgets,
                      **_store_after(plan, exe, parent, len(plan.pieces)))


def _store_after(plan: Plan, exe: Execution, parent: CacheState, done: int,
                 ) -> dict[str, tuple]:
    """The store entries and placed screenshots after ``plan`` ran its first ``done``
    pieces: an entry lives until its unit is placed, unless the plan retains it for a
    later recall (``cachepolicy.splice``); retained entries come in the plan's order,
    oldest use first."""
    if plan.splice is None:
        return {"stored": (), "placed": ()}
    reached = [u for u in plan.splice.place if u.first < done]
    placed = tuple(x for x in plan.splice.placed if x in {u.label for u in reached})
    used = {u.label for u in reached} | {u.entry_label for u in reached
                                         if u.source is Source.STORE}
    retain = plan.splice.retain
    offered = tuple(s for s in parent.stored if s.label in plan.splice.keep_stored
                    or s.label in retain or done < len(plan.pieces)) + exe.new_stored
    kept = [s for s in offered if s.label not in used or s.label in retain]
    order = {label: i for i, label in enumerate(retain)}
    kept.sort(key=lambda s: order.get(s.label, -1))  # stable: unretained ones first
    return {"stored": tuple(kept), "placed": placed}


def _end_of(plan: Plan, history: tuple, n_pieces: int) -> int:
    """The position after the first ``n_pieces`` pieces of the sequence: one run each, or,
    for a tail plan (runs split or rebased), the pieces' own positions."""
    if plan.tail:
        return plan.position_after(n_pieces)
    return history[n_pieces - 1].end_pos if 0 < n_pieces <= len(history) else 0


def new_content_tokens(txn: Transaction) -> int:
    """Tokens of content that did not exist at the previous step: the segments this
    transaction appended (the new screenshot with its label, the text delta) and the
    generation prompt, which every step adds anew.  Policy-independent, so arms compare."""
    added = txn.new_log.new_since(txn.parent_log)
    policy = txn.episode.policy
    return (sum(s.n_tokens for s in added)
            + (len(policy.kit.generation_prompt) if policy.adds_generation_prompt else 0))


def _record(txn: Transaction, exe: Execution, state: CacheState, ledger: MemoryLedger,
            text: str) -> StepRecord:
    plan, ep = txn.plan, txn.episode
    assert plan is not None
    return StepRecord(
        episode_id=ep.episode_id, step=ep.log.step_count() - 1, policy=plan.policy,
        generation=plan.generation, start=plan.start.kind.value,
        new_content_tokens=new_content_tokens(txn), prefill_tokens=exe.prefill_tokens,
        reused_tokens=plan.reused_tokens, critical_path_prefill_tokens=exe.prefill_tokens,
        prefill_s=exe.prefill_s, decode_tokens=len(exe.output_tokens), decode_s=exe.decode_s,
        context_tokens=plan.context_tokens, kv_bytes=state.seq_bytes,
        checkpoint_bytes=state.checkpoint_bytes,
        forecast_peak_bytes=plan.forecast.peak_bytes,
        ledger_peak_bytes=ledger.snapshot().peak, output_tokens=exe.output_tokens,
        output_text=text, encode_s=exe.encode_s,
        status="degraded" if txn.degraded else "ok", reason=txn.degraded,
        drift_kl=exe.drift_kl, drift_top1_agree=exe.drift_top1_agree,
        approximate=exe.approximate, replay_tokens=exe.replay_tokens,
        stored_bytes=state.stored_bytes, store_tokens=exe.store_tokens,
        splice_s=exe.splice_s, store_s=exe.store_s)
