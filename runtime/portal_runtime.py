"""The async half of ``KvAgent``: a Scheduler and the current episode's ``AgentSession``,
living in the event loop of a blocking portal (a background thread).  ``KvAgent`` drives it
from OSWorld's synchronous runner with ``portal.call``.

Ownership: ``serve`` owns the Scheduler (``async with``) and one task group.  The only task
ever started is the overlapped prefetch of the next step, a task of that group referenced
by ``_prefetch``: the next ``decide`` waits for it, ``new_episode`` / ``end_episode`` and
``stop`` cancel it (speculative work is dropped, never published half-way).  Invariant: at
most one episode is open and at most one prefetch runs, and it belongs to that episode.
"""

from __future__ import annotations

import time

import anyio
import anyio.abc
import anyio.to_thread
import attrs
import structlog

from cachepolicy.base import CachePolicy, make_policy
from cachepolicy.engine import Engine
from cachepolicy.errors import KvagentCacheError
from cachepolicy.segments import SegmentFactory, model_info
from runtime.actions import TERMINAL_ACTIONS, CoordConvention
from runtime.session import ActStep, AgentSession
from scheduler.errors import SchedulerError
from scheduler.ledger import LedgerSnapshot, MemoryLedger
from scheduler.scheduler import IMAGE_CACHE, Scheduler
from scheduler.transaction import EpisodeCache, PrefetchRecord, StepOptions

log = structlog.get_logger("kvagent.osworld")


class KvAgentError(Exception):
    """Base class of the OSWorld agent's errors."""


class AgentClosedError(KvAgentError):
    """The agent was closed; it takes no more calls."""


class AgentStepError(KvAgentError):
    """The engine or the scheduler could not decide this step (the episode's cache state is
    rolled back; the next ``predict`` may try again, ``reset`` starts over)."""


@attrs.frozen
class RuntimeSpec:
    """What the runtime needs to make policies and sessions."""

    policy: str
    window: int
    overlap: bool
    convention: CoordConvention
    options: StepOptions
    budget_bytes: int
    name: str  # episode ids are f"{name}/ep{n}"
    system_prompt: str | None = None


@attrs.frozen
class Decision:
    """One decided step, with how the overlapped prefetch before it went."""

    episode_id: str
    act: ActStep
    prefetch_wait_s: float  # the critical path waited this long for the previous prefetch
    prefetch_s: float  # the previous prefetch's own duration (0.0: none ran)
    prefetch_error: str  # why the previous prefetch failed ("" if it did not)
    prefetch_started: bool  # a prefetch for the next step is running now


@attrs.frozen
class RuntimeStatus:
    """A snapshot for logs and tests."""

    episode_id: str | None
    steps: int  # decided steps of the current episode
    prefetch_running: bool
    ledger: LedgerSnapshot
    held: dict[str, int]  # ledger holdings of the image cache and the open episode
    seqs_in_use: tuple[int, ...]  # engine sequences holding state
    summary: str


@attrs.define(eq=False)
class _PrefetchJob:
    episode_id: str
    scope: anyio.CancelScope
    done: anyio.Event
    record: PrefetchRecord | None = None
    error: str = ""
    seconds: float = 0.0


class AgentRuntime:
    """Lives in one event loop: start ``serve`` with ``portal.start_task``, call the other
    coroutines with ``portal.call``.  Not thread-safe (the loop serialises it)."""

    def __init__(self, factory: SegmentFactory, spec: RuntimeSpec) -> None:
        self.factory, self.spec = factory, spec
        self.engine: Engine = factory.engine
        self.ledger = MemoryLedger(spec.budget_bytes)
        self._scheduler: Scheduler | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping: anyio.Event | None = None
        self._episode: EpisodeCache | None = None
        self._session: AgentSession | None = None
        self._prefetch: _PrefetchJob | None = None
        self._n_episodes = 0

    def make_policy(self) -> CachePolicy:
        """The episode policy (raises PolicyRefusedError for e.g. relocate on a hybrid)."""
        return make_policy(self.spec.policy, model_info(self.engine), self.factory.kit,
                           window=self.spec.window, decode_tokens=self.spec.options.decode_tokens)

    # ------------------------------------------------------------------ lifecycle

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Own the scheduler and the task group until ``stop``; on the way out the prefetch
        is cancelled and the scheduler closes the open episode (the ledger returns to 0)."""
        self._stopping = anyio.Event()
        async with Scheduler(self.engine, self.ledger, self.factory,
                             options=self.spec.options) as scheduler:
            self._scheduler = scheduler
            try:
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    task_status.started()
                    await self._stopping.wait()
                    tg.cancel_scope.cancel()  # a running prefetch is speculative: drop it
            finally:
                self._tg, self._prefetch = None, None
                self._episode, self._session = None, None

    def stop(self) -> None:
        """Ask ``serve`` to wind down (call from the loop; returns at once)."""
        if self._stopping is not None:
            self._stopping.set()

    # ------------------------------------------------------------------ episodes

    async def new_episode(self) -> str:
        """Close the current episode's cache (if any) and open a fresh one."""
        await self.end_episode()
        scheduler = self._running()
        self._n_episodes += 1
        episode_id = f"{self.spec.name}/ep{self._n_episodes}"
        self._episode = scheduler.open_episode(episode_id, self.make_policy())
        return episode_id

    async def end_episode(self) -> None:
        """Cancel the prefetch and free the episode's sequence and ledger holdings."""
        await self._settle_prefetch(cancel=True)
        episode, self._episode, self._session = self._episode, None, None
        if episode is not None and self._scheduler is not None:
            await self._scheduler.close_episode(episode)

    # ------------------------------------------------------------------ steps

    async def decide(self, instruction: str, png: bytes, screen: tuple[int, int]) -> Decision:
        """The critical step: wait for the previous prefetch, then ``session.act``; with
        overlap, start prefetching the next step before returning the action."""
        t0 = time.perf_counter()
        job = await self._settle_prefetch(cancel=False)
        waited = time.perf_counter() - t0
        if self._session is not None and self._session.instruction != instruction:
            # A new task without reset(): its history must not leak into this one.
            log.warning("instruction_changed", episode_id=self._session.episode.episode_id)
            await self.end_episode()
        if self._episode is None:
            await self.new_episode()
        assert self._episode is not None
        session = self._session
        if session is None:
            session = self._session = AgentSession(
                self._running(), self.factory, self._episode, instruction, screen,
                convention=self.spec.convention, overlap=self.spec.overlap,
                system_prompt=self.spec.system_prompt)
        elif session.screen != screen:
            log.warning("screen_size_changed", episode_id=self._episode.episode_id,
                        old=session.screen, new=screen)
            session.screen = screen  # coordinates refer to the screenshot the model sees
        try:
            act = await session.act(png)
        except (SchedulerError, KvagentCacheError) as exc:
            raise AgentStepError(f"step {session._index} of {self._episode.episode_id} "
                                 f"failed: {exc}") from exc
        started = self.spec.overlap and not isinstance(act.action, TERMINAL_ACTIONS)
        if started:
            self._start_prefetch(session)
        return Decision(self._episode.episode_id, act, waited,
                        job.seconds if job is not None else 0.0,
                        job.error if job is not None else "", started)

    async def status(self) -> RuntimeStatus:
        mem = await anyio.to_thread.run_sync(self.engine.memory)
        scheduler = self._running()
        owners = [IMAGE_CACHE] + ([self._episode.episode_id] if self._episode else [])
        return RuntimeStatus(
            episode_id=self._episode.episode_id if self._episode else None,
            steps=self._session._index if self._session else 0,
            prefetch_running=self._prefetch is not None and not self._prefetch.done.is_set(),
            ledger=self.ledger.snapshot(), held={o: self.ledger.held_by(o) for o in owners},
            seqs_in_use=tuple(sorted(mem.seq_state_bytes)), summary=scheduler.summary())

    # ------------------------------------------------------------------ internals

    def _running(self) -> Scheduler:
        if self._scheduler is None or self._tg is None:
            raise AgentClosedError("the agent's runtime is not running")
        return self._scheduler

    def _start_prefetch(self, session: AgentSession) -> None:
        assert self._tg is not None and self._prefetch is None
        job = _PrefetchJob(session.episode.episode_id, anyio.CancelScope(), anyio.Event())
        self._prefetch = job
        self._tg.start_soon(self._run_prefetch, session, job,
                            name=f"prefetch {session.episode.episode_id}")

    async def _run_prefetch(self, session: AgentSession, job: _PrefetchJob) -> None:
        t0 = time.perf_counter()
        try:
            with job.scope:  # absorbs only its own cancellation (reset/close dropping it)
                job.record = await session.prefetch()
        except Exception as exc:  # noqa: BLE001  (reported by the next decide; cancellation
            # is a BaseException and passes through)
            job.error = f"{type(exc).__name__}: {exc}"
            log.warning("prefetch_failed", episode_id=job.episode_id, reason=job.error)
        finally:
            job.seconds = time.perf_counter() - t0
            job.done.set()

    async def _settle_prefetch(self, *, cancel: bool) -> _PrefetchJob | None:
        """Wait for (or cancel and wait for) the running prefetch."""
        job = self._prefetch
        if job is None:
            return None
        if cancel:
            job.scope.cancel()
        await job.done.wait()
        if self._prefetch is job:
            self._prefetch = None
        return job
