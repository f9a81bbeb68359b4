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
from collections.abc import Callable

import attrs
import structlog

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import StalePublishError
from cachepolicy.executor import Execution, execute
from cachepolicy.plan import CacheState, CacheView, Plan
from cachepolicy.sampling import SamplingParams
from scheduler.ledger import MemoryLedger, Reservation
from scheduler.records import StepRecord

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
    _publish_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def view(self, engine: Engine) -> CacheView:
        return CacheView(self.state, engine.seq_info(self.seq))

    def publish(self, parent_log: ContextLog, parent: CacheState, new_log: ContextLog,
                successor: CacheState, ledger: MemoryLedger,
                reservation: Reservation | None) -> None:
        """Compare-and-publish: the successor replaces ``parent`` only if the episode still
        shows it; the ledger's holding changes in the same critical section."""
        with self._publish_lock:
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
    scratch_seq: int | None = None  # a spare sequence for relocate's drift measurement


def run_step(engine: Engine, episode: EpisodeCache, segments: tuple[Segment, ...],
             ledger: MemoryLedger, options: StepOptions = StepOptions(), *,
             fault: FaultHook | None = None) -> StepRecord:
    """Run one step transaction synchronously (call it from the engine's worker thread)."""
    txn_id = f"{episode.episode_id}/t{next(_txn_ids)}"
    bound = log.bind(episode_id=episode.episode_id, seq_id=episode.seq, txn_id=txn_id)
    parent_log, parent = episode.log, episode.state
    new_log = parent_log.append(*segments)  # append
    plan = episode.policy.select(new_log, episode.view(engine),  # select
                                 new=frozenset(s.key for s in segments))
    reservation = ledger.reserve(txn_id, plan.forecast.extra_bytes)  # reserve
    bound.debug("txn_admit", policy=plan.policy, start=plan.start.kind.value,
                reserved=reservation.nbytes, prefill_tokens=plan.prefill_tokens)
    try:
        exe = execute(engine, plan, episode.seq, decode_tokens=options.decode_tokens,  # execute
                      sampling=options.sampling, stop_at_eog=options.stop_at_eog,
                      scratch_seq=options.scratch_seq)
        if fault is not None:
            fault("before_publish")
        successor = _successor(engine, episode, plan, exe, parent)
        episode.publish(parent_log, parent, new_log, successor, ledger, reservation)  # publish
    except BaseException as exc:
        bound.info("txn_rollback", error=type(exc).__name__, reason=str(exc))
        raise
    finally:
        ledger.release(reservation)  # release (a no-op after a successful publish)
    episode.steps_done += 1
    bound.debug("txn_publish", generation=new_log.generation,
                held=successor.held_bytes, checkpoints=len(successor.checkpoints))
    return _record(episode, plan, exe, successor, ledger)


def _successor(engine: Engine, episode: EpisodeCache, plan: Plan, exe: Execution,
               parent: CacheState) -> CacheState:
    kept = tuple(c for c in parent.checkpoints if c.label in plan.keep)
    return CacheState(generation=plan.generation, checkpoints=kept + exe.new_checkpoints,
                      seq_bytes=engine.state_bytes(episode.seq),
                      layout_keys=tuple(p.key for p in plan.pieces))


def _record(episode: EpisodeCache, plan: Plan, exe: Execution, state: CacheState,
            ledger: MemoryLedger) -> StepRecord:
    return StepRecord(
        episode_id=episode.episode_id, step=episode.log.step_count() - 1, policy=plan.policy,
        generation=plan.generation, start=plan.start.kind.value,
        new_content_tokens=plan.new_content_tokens, prefill_tokens=exe.prefill_tokens,
        reused_tokens=plan.reused_tokens, critical_path_prefill_tokens=exe.prefill_tokens,
        prefill_s=exe.prefill_s, decode_tokens=len(exe.output_tokens), decode_s=exe.decode_s,
        context_tokens=plan.context_tokens, kv_bytes=state.seq_bytes,
        checkpoint_bytes=state.checkpoint_bytes,
        forecast_peak_bytes=plan.forecast.peak_bytes,
        ledger_peak_bytes=ledger.snapshot().peak, output_tokens=exe.output_tokens,
        drift_kl=exe.drift_kl, drift_top1_agree=exe.drift_top1_agree)


@attrs.frozen
class PrefetchRecord:
    """What a prefetch transaction did (it decodes nothing)."""

    episode_id: str
    generation: int
    prefill_tokens: int
    prefill_s: float
    planned: bool  # False: the policy had nothing to prefetch (only the log advanced)


def run_prefetch(engine: Engine, episode: EpisodeCache, segments: tuple[Segment, ...],
                 ledger: MemoryLedger, *, fault: FaultHook | None = None,
                 should_stop: Callable[[], bool] | None = None) -> PrefetchRecord:
    """Append what is known before the next screenshot (the action text) and prefill what
    the policy can already compute for the next step, as one transaction.

    ``should_stop`` is polled between pieces; a stop raises ``Preempted`` and rolls back like
    any failure (nothing is published, the parent stays usable).
    """
    txn_id = f"{episode.episode_id}/p{next(_txn_ids)}"
    bound = log.bind(episode_id=episode.episode_id, seq_id=episode.seq, txn_id=txn_id)
    parent_log, parent = episode.log, episode.state
    new_log = parent_log.append(*segments)
    plan = episode.policy.prefetch(new_log, episode.view(engine))
    if plan is None:
        successor = attrs.evolve(parent, generation=new_log.generation)
        episode.publish(parent_log, parent, new_log, successor, ledger, None)
        return PrefetchRecord(episode.episode_id, new_log.generation, 0, 0.0, False)
    reservation = ledger.reserve(txn_id, plan.forecast.extra_bytes)
    try:
        exe = execute(engine, plan, episode.seq, should_stop=should_stop)
        if fault is not None:
            fault("before_publish")
        successor = _successor(engine, episode, plan, exe, parent)
        episode.publish(parent_log, parent, new_log, successor, ledger, reservation)
    except BaseException as exc:
        bound.info("prefetch_discarded", error=type(exc).__name__, reason=str(exc))
        raise
    finally:
        ledger.release(reservation)
    bound.debug("prefetch_publish", generation=new_log.generation,
                prefill_tokens=exe.prefill_tokens)
    return PrefetchRecord(episode.episode_id, new_log.generation, exe.prefill_tokens,
                          exe.prefill_s, True)
