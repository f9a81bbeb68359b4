"""The episode driver: the ONE implementation of "decide on a screenshot, then prefetch the
next step while the environment acts".  ``run_episode`` (the env loop behind ``kvagent run``
and every bench arm) and ``KvAgent`` (OSWorld's runners, through its portal runtime) both
drive their episodes with it.

Ownership: the driver owns its ``AgentSession``, the episode's cache (opened in
``EpisodeDriver.open``, closed in ``aclose``) and at most one prefetch task.  The caller owns
the task group the prefetch runs in (``start_prefetch(tg)``): ``act`` settles a running
prefetch first (waits for it: its work is this step's), ``aclose`` cancels it (speculative
work of an ended episode is dropped, never published half-way).

Timing: ``act`` is the critical path, from the moment the screenshot's bytes are in hand
(``arrived_at``) to the action being ready — waiting for the prefetch, decoding and encoding
the image, prefill, decode and parsing are all inside it.

Encoding ahead (``AgentConfig.encode_ahead``): when the screenshot arrives while the prefetch
is still running (the VM was quicker than the prefetch), ``act`` encodes it at once, in a
task beside the wait, instead of after the prefetch — when the engine's vision encoder runs
beside the llama context (``Engine.encoder_runs_beside``: its own lock, cores to spare); it
puts the embedding in the engine's cache, where the step's build finds it.  Outputs cannot change: an embedding is a pure function of the pixels
(``check-exact``'s encoder checks), and the step's segments and pieces are the same.  A
failure there is only logged: the step's own build encodes again and reports it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import anyio
import anyio.abc
import attrs
import structlog

from cachepolicy.context_log import Segment
from cachepolicy.engine.errors import ImageError
from cachepolicy.engine.images import decode_png
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.errors import describe_error
from runtime.metrics import StepMetrics
from runtime.session import ActStep, AgentSession, Teacher
from scheduler.scheduler import Scheduler
from scheduler.transaction import PrefetchRecord, StepOptions
from vmenv.actions import TERMINAL_ACTIONS, format_action

log = structlog.get_logger("kvagent.driver")


@attrs.frozen
class DriverStep:
    """A decided step and its measurements (``metrics.vm_s`` is filled in after the env)."""

    act: ActStep
    metrics: StepMetrics


@attrs.define(eq=False)
class _Prefetch:
    scope: anyio.CancelScope = attrs.Factory(anyio.CancelScope)
    done: anyio.Event = attrs.Factory(anyio.Event)
    record: PrefetchRecord | None = None
    error: str = ""
    seconds: float = 0.0
    # the guess after it (AgentConfig.guess): started once the prefetch was published and
    # no screenshot had arrived; ``guess_stop`` stops it at a piece boundary (a wrong guess)
    guessed_id: str | None = None  # pixel identity of the guessed screenshot (None: no guess)
    guess_record: PrefetchRecord | None = None
    guess_stop: threading.Event = attrs.Factory(threading.Event)


#: the VM times the guess's "auto" mode looks back on (the shortest is its estimate)
VM_HISTORY = 3


@attrs.define(eq=False)
class _Ahead:
    seconds: float = 0.0  # the screenshot's encode beside the prefetch (0: not encoded ahead)


class EpisodeDriver:
    """Drives one episode's session; see the module docstring for the ownership rules."""

    def __init__(self, scheduler: Scheduler, session: AgentSession) -> None:
        self.scheduler, self.session = scheduler, session
        self._prefetch: _Prefetch | None = None
        self._closed = False
        self._acted_at: float | None = None  # the action went to the env (start_prefetch)
        self._arrived = False  # the next screenshot is in hand: no guess starts any more
        self._vm_s: list[float] = []  # how long the env's past actions took
        self._log = log.bind(episode_id=session.episode.episode_id, seq_id=session.episode.seq)

    @classmethod
    def open(cls, scheduler: Scheduler, factory: SegmentFactory, config: AgentConfig,
             episode_id: str, instruction: str, screen: tuple[int, int], *, seed: int = 0,
             teacher: Teacher | None = None) -> EpisodeDriver:
        """Open the episode's cache in ``scheduler`` (a sequence of its own) and a session on
        it.  Raises PolicyRefusedError / NoFreeSequenceError before anything is held."""
        policy = config.make_policy(factory, screen)
        episode = scheduler.open_episode(episode_id, policy, seed=seed,
                                         replay_twin=config.replay_twin(policy))
        return cls(scheduler, AgentSession(scheduler, factory, episode, config, instruction,
                                           screen, teacher=teacher))

    @property
    def episode_id(self) -> str:
        return self.session.episode.episode_id

    @property
    def prefetch_running(self) -> bool:
        return self._prefetch is not None and not self._prefetch.done.is_set()

    async def act(self, png: bytes, *, arrived_at: float | None = None,
                  options: StepOptions | None = None,
                  screen: tuple[int, int] | None = None) -> DriverStep:
        """Decide the action for ``png`` (critical path); ``options`` override the
        episode's step options for this step.  Raises the scheduler's typed errors (e.g.
        ``AdmissionError``) when the step cannot run; the episode's published cache state is
        then untouched.  ``screen`` is the screenshot's size: when it changed mid-episode,
        actions follow it (coordinates refer to the screenshot the model sees), and the
        change is logged."""
        t0 = time.perf_counter() if arrived_at is None else arrived_at
        self._arrived = True
        if self._acted_at is not None:
            self._vm_s = (self._vm_s + [max(0.0, t0 - self._acted_at)])[-VM_HISTORY:]
            self._acted_at = None
        if screen is not None and screen != self.session.screen:
            self._log.warning("screen_size_changed", old=self.session.screen, new=screen)
            self.session.resize(screen)
        guess = await self._check_guess(png)
        ahead = _Ahead()
        if self.prefetch_running and self.session.can_encode_ahead:
            async with anyio.create_task_group() as tg:  # both finish before the step
                tg.start_soon(self._encode_ahead, png, ahead)
                job = await self._settle(cancel=False)
                waited = time.perf_counter() - t0
        else:
            job = await self._settle(cancel=False)
            waited = time.perf_counter() - t0
        act = await self.session.act(png, options=options)
        return self._measured(act, t0, waited, job, ahead.seconds, guess)

    async def _check_guess(self, png: bytes) -> str:
        """When a guess was made for this screenshot: hit (same pixels: its work is the
        step's, let it finish) or miss (stop it at its next piece boundary: the step cuts
        back to before the guessed image).  '' without a guess."""
        job = self._prefetch
        if job is None or job.guessed_id is None:
            return ""
        try:
            pixels = await anyio.to_thread.run_sync(decode_png, png)
        except ImageError:
            job.guess_stop.set()  # the step's own build reports the bad screenshot
            return "miss"
        if pixels.image_id == job.guessed_id:
            return "hit"
        job.guess_stop.set()
        return "miss"

    async def _encode_ahead(self, png: bytes, ahead: _Ahead) -> None:
        t = time.perf_counter()
        try:
            await anyio.to_thread.run_sync(self.session.encode_ahead, png)
        except Exception as exc:  # noqa: BLE001  the step's build encodes again and fails
            self._log.warning("encode_ahead_failed", reason=f"{type(exc).__name__}: {exc}")
        finally:
            ahead.seconds = time.perf_counter() - t

    def _measured(self, act: ActStep, t0: float, waited: float,
                  job: _Prefetch | None, ahead_s: float = 0.0, guess: str = "") -> DriverStep:
        critical = time.perf_counter() - t0
        metrics = StepMetrics.decided(
            act.record, act.prefetch, action=format_action(act.action) if act.parsed else None,
            parsed=act.parsed, build_encode_s=act.encode_s, encode_ahead_s=ahead_s,
            critical_path_s=critical,
            prefetch_s=job.seconds if job is not None else 0.0, prefetch_wait_s=waited,
            prefetch_error=job.error if job is not None else "", notes=act.notes,
            guess=guess if job is not None and job.guess_record is not None else "",
            guess_record=job.guess_record if job is not None else None)
        self._log.info("step_decided", step=act.index, action=metrics.action,
                       parsed=act.parsed, prefill_tokens=metrics.critical_path_prefill_tokens,
                       critical_path_s=round(critical, 4), guess=metrics.guess or None)
        return DriverStep(act, metrics)

    async def respond(self, build: Callable[[], tuple[Segment, ...]], *, options: StepOptions,
                      continuation: Callable[[str], tuple[Segment, ...]],
                      arrived_at: float | None = None) -> DriverStep:
        """``act`` for a caller that renders the whole prompt (``AgentSession.respond``):
        the same settling, timing and measurements."""
        t0 = time.perf_counter() if arrived_at is None else arrived_at
        job = await self._settle(cancel=False)
        waited = time.perf_counter() - t0
        act = await self.session.respond(build, options=options, continuation=continuation)
        return self._measured(act, t0, waited, job)

    async def observe(self, png: bytes, history_text: str) -> None:
        """A past step told, not decided (its screenshot and its history line): see
        ``AgentSession.observe``.  Settles a running prefetch first."""
        await self._settle(cancel=False)
        await self.session.observe(png, history_text)

    def start_prefetch(self, tg: anyio.abc.TaskGroup, step: DriverStep) -> bool:
        """With overlap, start prefetching the step after ``step`` in ``tg`` (returns at
        once).  Nothing to do after a terminal action or without overlap."""
        if (self._closed or not self.session.config.overlap
                or isinstance(step.act.action, TERMINAL_ACTIONS)):
            return False
        assert self._prefetch is None, "a prefetch is already running"
        job = self._prefetch = _Prefetch()
        self._acted_at, self._arrived = time.perf_counter(), False
        tg.start_soon(self._run_prefetch, job, name=f"prefetch {self.episode_id}")
        return True

    async def cancel_prefetch(self) -> None:
        """Drop a running prefetch (its segments join the next step, if any)."""
        await self._settle(cancel=True)

    async def aclose(self) -> None:
        """Cancel the prefetch and free the episode's sequence and ledger holdings.
        Idempotent and shielded: safe in a ``finally``."""
        with anyio.CancelScope(shield=True):
            self._closed = True
            await self._settle(cancel=True)
            await self.scheduler.close_episode(self.session.episode)

    async def _run_prefetch(self, job: _Prefetch) -> None:
        t0 = time.perf_counter()
        try:
            with job.scope:  # absorbs only its own cancellation (the driver dropping it)
                job.record = await self.session.prefetch()
                if self._guess_allowed(job, time.perf_counter() - t0):
                    job.guessed_id = self.session.last_image_id
                    job.guess_record = await self.session.guess(job.guess_stop)
                    if job.guess_record is None:  # discarded (no memory, nothing to guess)
                        job.guessed_id = None
        except Exception as exc:  # noqa: BLE001  speculative work: reported with the next
            # step (its segments stay pending for that step); cancellation passes through
            job.error = describe_error(exc)
            self._log.warning("prefetch_failed", reason=job.error)
        finally:
            job.seconds = time.perf_counter() - t0
            job.done.set()

    def _guess_allowed(self, job: _Prefetch, prefetch_s: float) -> bool:
        """Guess when asked to and the screenshot is not here yet; in auto mode only when
        the shortest of the VM's recent actions leaves time for a guess as long as this
        prefetch was — so a wrong guess rarely delays the step (it can only stop between
        pieces)."""
        mode = self.session.config.guess
        if (mode == "off" or self._arrived or job.record is None or self._acted_at is None
                or self.session.last_image_id is None):
            return False
        if mode == "always":
            return True
        if not self._vm_s:
            return False
        elapsed = time.perf_counter() - self._acted_at
        return elapsed + prefetch_s <= min(self._vm_s)

    async def _settle(self, *, cancel: bool) -> _Prefetch | None:
        job = self._prefetch
        if job is None:
            return None
        if cancel:
            job.scope.cancel()
        await job.done.wait()
        if self._prefetch is job:
            self._prefetch = None
        return job
