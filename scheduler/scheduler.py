"""The scheduler: every step of every episode is a transaction admitted against one memory
budget; engine work runs one job at a time, critical path before prefetch; memory pressure
goes down a fallback ladder instead of crashing the process.

Collaborators, each with explicit dependencies: the ``EngineGate`` (who runs engine work
next), ``Admission`` (plan and reserve, or walk the fallback ladder), ``MemoryPressure``
(rungs 1 and 2: decide what frees memory, then do it) and the ``MemoryLedger``.  Admission
is decided synchronously and acted on outside the decision.

Ownership: the scheduler owns the engine's sequences (one per live episode), the ledger's
holdings (published states and the image cache) and the order of engine work.  It starts no
background task of its own: each caller's coroutine drives its own job, and every wait is
bounded or cancellable.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from typing import TypeVar

import anyio
import anyio.lowlevel
import structlog

from cachepolicy.base import CachePolicy
from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import ContextFullError, DecodeError, Preempted, RestoreError
from cachepolicy.segments import SegmentFactory
from scheduler.admission import Admission
from scheduler.errors import (
    AdmissionError, EpisodeClosedError, NoFreeSequenceError, NoSpareSequenceError,
)
from scheduler.gate import EngineGate
from scheduler.integrity import check_integrity
from scheduler.ledger import MemoryLedger
from scheduler.pressure import MemoryPressure
from scheduler.records import StepRecord
from scheduler.release import STALL_TIMEOUT_S, ReleaseSignal
from scheduler.shutdown import Shutdown
from scheduler.sizes import format_bytes
from scheduler.slots import IMAGE_CACHE, Phase, Priority, Slot, set_on_cancel
from scheduler.transaction import (
    EpisodeCache, PrefetchRecord, StepOptions, Transaction, commit_finish,
    commit_prefill, rollback,
)

T = TypeVar("T")

__all__ = ["IMAGE_CACHE", "Priority", "STALL_TIMEOUT_S", "Scheduler"]


class Scheduler:
    def __init__(self, engine: Engine, ledger: MemoryLedger, factory: SegmentFactory, *,
                 options: StepOptions = StepOptions(), wait_s: float = STALL_TIMEOUT_S,
                 image_cache_floor: int = 0,
                 spare_sequence: bool = False,
                 fault: Callable[[str], None] | None = None,
                 debug: bool | None = None) -> None:
        """``spare_sequence``: hold the engine's last sequence aside for the episodes whose
        policy asks for one (``PolicyManifest.needs_scratch_sequence``); an owner that runs
        such policies sets it.  ``wait_s``: the stall timeout of a wait for memory (see
        ``STALL_TIMEOUT_S``)."""
        self.engine, self.ledger, self.factory, self.options = engine, ledger, factory, options
        self.wait_s = wait_s
        self.fault = fault  # test hook, called in the worker thread before publication
        # debug: check integrity (ledger vs engine) whenever the scheduler goes idle
        self.debug = os.environ.get("KVAGENT_DEBUG") == "1" if debug is None else debug
        self.counters: Counter[str] = Counter()
        self.gate = EngineGate()
        # the spare sequence is the scheduler's for its whole life: never an episode's own
        self._spare_seq = engine.config.n_seq_max - 1 if spare_sequence else None
        self._free_seqs = [s for s in range(engine.config.n_seq_max) if s != self._spare_seq]
        self._slots: dict[str, Slot] = {}
        self._released = ReleaseSignal()
        self.shutdown = Shutdown()
        self._clock = itertools.count(1)
        self._log = structlog.get_logger("kvagent.scheduler")
        # The engine's embedding cache is a ledger owner, held at its capacity, so encoding
        # never takes the ledger past its budget: at most a quarter of the budget (its
        # target), which rung 1 may shrink and releases give back
        # (``MemoryPressure.regrow_image_cache``); the cache's own capacity is restored on
        # close.
        self._cache_capacity = engine.image_cache_stats().max_bytes
        target = min(self._cache_capacity, ledger.budget // 4)
        engine.set_image_cache_bytes(target)
        ledger.publish(IMAGE_CACHE, target, None)
        self.pressure = MemoryPressure(
            engine, ledger, self._slots, counters=self.counters,
            engine_call=functools.partial(self._engine_call, priority=Priority.CRITICAL),
            notify_release=self._notify_release, wake_waiters=self._released.notify,
            image_cache_floor=image_cache_floor, image_cache_target=target)
        self.admission = Admission(engine, ledger, factory.kit, self.pressure, self._slots,
                                   self._released, self.counters, wait_s=wait_s,
                                   shutdown=self.shutdown)

    async def __aenter__(self) -> Scheduler:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every episode and give the image cache's holding back: the ledger returns
        to zero."""
        with anyio.CancelScope(shield=True):
            for slot in list(self._slots.values()):
                await self.close_episode(slot.cache)
            if self.debug:
                self.check_integrity()
            self.ledger.drop(IMAGE_CACHE)
            self.engine.set_image_cache_bytes(self._cache_capacity)

    def shut_down(self, reason: str) -> int:
        """Stop all work (``scheduler.shutdown``): from now on a critical job raises
        ``ShuttingDownError`` — at once if it has not started, at its next piece or token
        boundary if it runs (rolled back), when it wakes if it waits for memory; a prefetch
        is discarded.  Closing episodes still works.  Returns the jobs that were running."""
        running = self.shutdown.begin(reason)
        self._released.notify()  # the jobs waiting for memory wake and give up
        self._log.warning("scheduler_shutdown", reason=reason, stopped=running,
                          summary=self.summary())
        return running

    # ------------------------------------------------------------------ episodes

    def open_episode(self, episode_id: str, policy: CachePolicy, *, seed: int = 0,
                     options: StepOptions | None = None,
                     replay_twin: CachePolicy | None = None) -> EpisodeCache:
        """A new episode on a free sequence; ``options`` are its step options (decode
        budget, sampling, grammar) when they differ from the scheduler's; ``replay_twin``:
        the episode allows the fallback ladder's replay rung, and this (its policy's
        tail-replay variant) plans its steps once the rung struck it."""
        if episode_id in self._slots:
            raise ValueError(f"episode {episode_id} is already open")
        if policy.requires_spare_sequence() and self._spare_seq is None:
            raise NoSpareSequenceError(policy.name)
        if not self._free_seqs:
            raise NoFreeSequenceError(
                f"all {self.engine.config.n_seq_max} sequences are in use; raise n_seq_max")
        seq = self._free_seqs.pop(0)
        spare = self._spare_seq if policy.manifest.needs_scratch_sequence else None
        episode = EpisodeCache(episode_id, seq, policy, seed=seed, options=options,
                               scratch_seq=spare, replay_twin=replay_twin)
        self._slots[episode_id] = Slot(episode, last_used=next(self._clock))
        self._log.info("episode_open", episode_id=episode_id, seq_id=seq, policy=policy.name)
        return episode

    async def close_episode(self, episode: EpisodeCache) -> None:
        """Free the episode's sequence and holdings.  Shielded: safe in a ``finally``.
        Idempotent, also under concurrency: the first call closes; a call while that close
        is under way (a request's own close and the pool's at shutdown) waits for it to end
        and returns — the episode is closed exactly once."""
        slot = self._slots.get(episode.episode_id)
        if slot is None:
            return
        if slot.close_done is not None:  # another close is under way: it frees the slot
            with anyio.CancelScope(shield=True):
                await slot.close_done.wait()
            return
        # (no await between the check above and this mark: one closer wins)
        slot.close_done = anyio.Event()
        try:
            await self._close(episode, slot)
        finally:
            slot.close_done.set()
        self._log.info("episode_close", episode_id=episode.episode_id, seq_id=episode.seq)

    async def _close(self, episode: EpisodeCache, slot: Slot) -> None:
        with anyio.CancelScope(shield=True):
            slot.closed = True
            # closing is a job of the slot: between the engine's clear and the ledger's drop
            # the two counts differ, and another job's idle integrity check must not run then
            slot.jobs += 1
            try:
                async with slot.job_lock:
                    await self._engine_call(functools.partial(self.engine.clear, episode.seq),
                                            Priority.CRITICAL)
                    with episode.publish_lock:  # its checkpoints and screenshot store die
                        # with it, whoever holds it
                        episode.state = episode.state.emptied()
                        self.ledger.drop(episode.episode_id)
                    del self._slots[episode.episode_id]
                    self._free_seqs.append(episode.seq)
            finally:
                slot.jobs -= 1
            self._notify_release()
            self._check_if_idle()

    # ------------------------------------------------------------------ work

    async def step(self, episode: EpisodeCache, build: Callable[[], tuple[Segment, ...]], *,
                   options: StepOptions | None = None, replace: bool = False) -> StepRecord:
        """Run one critical step: ``build`` (run in a worker thread; it may encode images)
        returns the new segments; ``options`` override the episode's for this step (e.g. a
        request's sampling); ``replace``: the segments are the whole new log (a client that
        sends its whole prompt).  Raises ``AdmissionError`` if even the ladder fails;
        cancellation propagates as cancellation (the step rolled back)."""
        result = await self._transact(episode, build, Priority.CRITICAL, options, replace)
        if not isinstance(result, StepRecord):  # a critical job is never discarded
            raise AssertionError(f"critical step of {episode.episode_id} returned {result!r}")
        return result

    async def prefetch(self, episode: EpisodeCache,
                       build: Callable[[], tuple[Segment, ...]]) -> PrefetchRecord | None:
        """Speculative prefill of what the next step already knows (it appends ``build``'s
        segments to the log).  Critical work of any episode preempts it at the next piece
        boundary; what it did by then is published (``record.preempted``).  Returns None when
        it was discarded (no memory, cancelled, episode closed); its segments then join the
        episode's next step — also when it fails with an error, which it re-raises."""
        result = await self._transact(episode, build, Priority.PREFETCH)
        assert result is None or isinstance(result, PrefetchRecord)
        return result

    async def guess(self, episode: EpisodeCache, build: Callable[[], tuple[Segment, ...]], *,
                    stop: threading.Event | None = None) -> PrefetchRecord | None:
        """Speculative prefill of the next step's prompt with a guessed screenshot
        (``CachePolicy.guess``): ``build``'s segments are planned on, never appended to the
        log.  A prefetch in every other respect — it yields to critical work at piece
        boundaries, takes only free memory and publishes what it did; ``stop`` (set by
        whoever learns the guess is wrong) stops it at the next piece boundary too.  Not
        when segments of a discarded prefetch wait for the next step (the guess would
        stand on a history the log does not have yet): None then, as when discarded."""
        slot = self._slots.get(episode.episode_id)
        if slot is None or slot.pending:
            return None
        result = await self._transact(episode, build, Priority.PREFETCH, guess=True, stop=stop)
        assert result is None or isinstance(result, PrefetchRecord)
        return result

    def summary(self) -> str:
        """The state in one line, for progress output, logs and tests: ``episodes: 3
        running, 1 waiting | budget: 1.2 GiB of 2.0 GiB, peak 1.9 GiB | checkpoints: 7``"""
        slots = list(self._slots.values())
        running = sum(s.phase is Phase.RUNNING for s in slots)
        waiting = sum(s.phase is Phase.WAITING for s in slots)
        checkpoints = sum(len(s.cache.state.checkpoints) for s in slots)
        snap = self.ledger.snapshot()
        return (f"episodes: {running} running, {waiting} waiting | budget: "
                f"{format_bytes(snap.held + snap.reserved)} of {format_bytes(snap.budget)}, "
                f"peak {format_bytes(snap.peak)} | checkpoints: {checkpoints}")

    def check_integrity(self) -> None:
        """Compare the ledger's holdings with the engine's own report (see
        ``scheduler.integrity``); raises ``IntegrityError``.  Call it when idle; it blocks on
        the engine briefly."""
        check_integrity(self.engine, self.ledger, self._slots,
                        self._free_seqs, self._spare_seq)
        self.counters["integrity_checks"] += 1

    # ------------------------------------------------------------------ internals

    async def _engine_call(self, fn: Callable[[], T], priority: Priority) -> T:
        async with self.gate.hold(priority):
            return await anyio.to_thread.run_sync(fn)

    async def _transact(self, episode: EpisodeCache, build: Callable[[], tuple[Segment, ...]],
                        priority: Priority, options: StepOptions | None = None,
                        replace: bool = False, *, guess: bool = False,
                        stop: threading.Event | None = None,
                        ) -> StepRecord | PrefetchRecord | None:
        slot = self._slots.get(episode.episode_id)
        if slot is None or slot.closed:
            if priority is Priority.PREFETCH:
                return None  # its episode ended: the prefetch is simply discarded
            raise EpisodeClosedError(f"episode {episode.episode_id} is closed")
        if self.shutdown.begun:
            if priority is Priority.PREFETCH:
                return None
            self.shutdown.check(episode.episode_id)
        slot.jobs += 1
        slot.phase = Phase.WAITING
        try:
            async with slot.job_lock:
                if slot.closed:
                    if priority is Priority.PREFETCH:
                        return None
                    raise EpisodeClosedError(f"episode {episode.episode_id} is closed")
                if self.shutdown.begun:  # (it began while this job waited for its turn)
                    if priority is Priority.PREFETCH:
                        return None
                    self.shutdown.check(episode.episode_id)
                # Building (tokenizing, encoding the screenshot) takes the engine's own lock
                # call by call, not the gate: it may interleave with another job's prefill,
                # and lets this job reach admission meanwhile.
                built = await anyio.to_thread.run_sync(build)
                if guess:  # planned on, never appended: whatever happens, nothing pends
                    if slot.pending:
                        return None
                    slot.guessing = True
                    try:
                        return await self._admit_and_run(slot, built, priority, self.options,
                                                         stop=stop)
                    finally:
                        slot.pending = ()
                # a replacing request supersedes what a discarded prefetch left pending
                segments = built if replace else slot.pending + built
                slot.pending, slot.replacing = (), replace
                opts = options or episode.options or self.options
                try:
                    return await self._admit_and_run(slot, segments, priority, opts)
                except Exception:
                    if priority is Priority.PREFETCH:
                        slot.pending = segments  # the next step delivers them
                    raise
        except BaseException as exc:
            # The failed job's frames (its unpublished checkpoints, an error it caught) must
            # not outlive it: the idle integrity check below counts live checkpoints, and a
            # false alarm there would replace this exception — even a cancellation.
            traceback.clear_frames(exc.__traceback__)
            raise
        finally:
            slot.jobs -= 1
            slot.phase, slot.replacing, slot.guessing = Phase.IDLE, False, False
            slot.last_used = next(self._clock)
            # a job that ends — even one that never reserved (it failed before admission)
            # — may have been what a job waiting for memory waited on: it re-checks
            self._released.notify()
            self._check_if_idle()

    def _check_if_idle(self) -> None:
        """In debug mode, check integrity whenever the last job ends (a step, a prefetch or
        a close: episodes that end together may leave no other moment of idleness)."""
        if self.debug and not any(s.jobs for s in self._slots.values()):
            self.check_integrity()
            self.counters["idle_checks"] += 1

    async def _admit_and_run(self, slot: Slot, segments: tuple[Segment, ...],
                             priority: Priority, options: StepOptions, *,
                             stop: threading.Event | None = None,
                             ) -> StepRecord | PrefetchRecord | None:
        cause = ""  # why the previous attempt failed: the degraded step's reason says it
        for attempt in range(3):
            try:
                admitted = await self.admission.admit(slot, segments, priority,
                                                      degrade=attempt > 0, cause=cause)
            except AdmissionError:
                if priority is Priority.PREFETCH:
                    slot.pending = segments
                    return None
                raise
            try:
                # the handle gives the reservation and the pin back however the run ends
                with admitted as txn:
                    result = await self._run(slot, txn, priority, options, stop=stop)
                if isinstance(result, PrefetchRecord) and result.preempted:
                    self.counters["prefetch_preempted"] += 1
                return result
            except Preempted as exc:  # stopped before publication: nothing published
                slot.pending = segments if priority is Priority.PREFETCH else ()
                if priority is Priority.CRITICAL:
                    # only cancellation or the shutdown stops a critical step: deliver it
                    # as cancellation, or as ``ShuttingDownError``
                    await anyio.lowlevel.checkpoint()
                    if self.shutdown.begun:
                        # (the new error's context is this one: its frames hold the stopped
                        # job's unpublished checkpoints, which must die with the job)
                        traceback.clear_frames(exc.__traceback__)
                        self.shutdown.check(slot.cache.episode_id)
                    raise
                self.counters["prefetch_discarded"] += 1
                return None
            except (DecodeError, ContextFullError, RestoreError) as exc:
                # The engine failed the plan (llama_decode, a context the plan did not
                # foresee, a checkpoint it cannot restore), already rolled back: go down the
                # ladder again, straight to a smaller plan that starts from scratch.
                rung = ("context_full" if isinstance(exc, ContextFullError) else
                        "restore_failure" if isinstance(exc, RestoreError) else "decode_failure")
                self._log.warning("fallback", episode_id=slot.cache.episode_id,
                                  rung=rung, reason=str(exc))
                self.counters[rung] += 1
                cause = f"{rung.replace('_', ' ')} ({exc})"
                if priority is Priority.PREFETCH:
                    slot.pending = segments
                    return None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _run(self, slot: Slot, txn: Transaction, priority: Priority,
                   options: StepOptions, *,
                   stop: threading.Event | None = None) -> StepRecord | PrefetchRecord:
        """execute + publish in worker threads, in two phases: the prefill holds the engine
        gate; the decode does not (its rows join the engine's fixed-size decode calls with
        other episodes' rows — continuous batching).  Cancellation and preemption are polled
        between pieces, between tokens and before publication, so a cancelled step rolls
        back."""
        asked = stop  # the caller's own stop (a guess found wrong): at a piece boundary
        stop = threading.Event()
        gate = self.gate

        progressed = self._released.mark_progress  # (a job waiting for memory sees it)

        def should_stop() -> bool:  # between pieces
            progressed()
            if self.fault is not None:
                self.fault("between_pieces")
            return stop.is_set() or (priority is Priority.PREFETCH
                                     and (gate.critical_waiting > 0
                                          or (asked is not None and asked.is_set())))

        def decoding() -> bool:  # between tokens
            progressed()
            return stop.is_set()

        def fault(point: str) -> None:
            if stop.is_set():
                raise Preempted("cancelled before publication")
            if self.fault is not None:
                self.fault(point)

        finished = False
        try:
            error: Exception | None = None
            # the shutdown sets ``stop`` too: the job stops at its next boundary
            with self.shutdown.watching(stop):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(set_on_cancel, stop)
                    try:
                        async with gate.hold(priority):
                            slot.phase = Phase.RUNNING
                            prefilled = await anyio.to_thread.run_sync(functools.partial(
                                commit_prefill, self.engine, txn, self.ledger,
                                should_stop=should_stop))
                        record = await anyio.to_thread.run_sync(functools.partial(
                            commit_finish, self.engine, txn, self.ledger, options, prefilled,
                            fault=fault, should_stop=decoding))
                        finished = True
                    except Exception as exc:  # re-raised below, outside the task group, so
                        error = exc           # callers see the error itself, not a group;
                        # the worker's frames are done: drop what they held (the failed
                        # execution's unpublished checkpoints), so nothing outlives the job
                        traceback.clear_frames(exc.__traceback__)
                    finally:                  # cancellation (BaseException) passes through
                        tg.cancel_scope.cancel()
            if error is not None:
                raise error
        finally:
            if not finished:  # cancelled between the phases: nothing was published
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(functools.partial(
                        rollback, self.engine, txn, self.ledger))
            # (the caller's Admitted handle then returns the reservation and the pin)
        self._log.info("publish", episode_id=txn.episode.episode_id, seq_id=txn.episode.seq,
                       txn_id=txn.txn_id, generation=txn.new_log.generation,
                       degraded=txn.degraded or None)
        return record

    def _notify_release(self) -> None:
        """Memory came back: wake the waiters — and, with no job on the fallback ladder, let
        the embedding cache take back capacity rung 1 took from it."""
        if self.admission.settled:
            self.pressure.regrow_image_cache()
        self._released.notify()
