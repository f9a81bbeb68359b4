"""The running parts of a ``KvAgent``: its configuration, the Engine, and the event-loop
thread (an anyio blocking portal) that hosts the ``AgentRuntime``.

``AgentHost`` holds no reference to the agent, so ``weakref.finalize`` can close it when the
agent is garbage-collected or at interpreter exit.  Close order (the invariant that makes it
safe): stop the runtime (prefetch cancelled, episode and scheduler closed, no engine call in
flight) → stop the loop and join its thread → free the engine.

Nothing a KvAgent holds outlives its process: memory (the model, caches) and its one thread
go with it, it starts no child process and writes no file (the forged test model is made in
the model cache before anything runs, and kept).  So OSWorld's workers, which end with
``os._exit`` and never call ``close``, leak nothing.

Sizes: ``plan_context`` checks (or derives) the context before the model loads, from the
projector's metadata; ``AgentHost`` measures the real screenshot cost once loaded.  Threads:
``default_threads`` — an agent does not assume it owns the machine.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import anyio.from_thread
import attrs
import structlog

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.engine.records import MAX_N_BATCH, MAX_N_CTX_PER_SEQ, MAX_THREADS
from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from runtime.context_budget import (
    ContextNeed, blank_png, context_need, estimate_image_tokens, load_sized,
)
from runtime.osworld.local_runtime import AgentClosedError, AgentRuntime, KvAgentError
from scheduler.sizes import UNLIMITED_BYTES, parse_budget

log = structlog.get_logger("kvagent.osworld")

PORTAL_THREAD_PREFIX = "kvagent-portal"
#: Threads of each agent's engine, when ``n_threads`` is not given.
THREADS_ENV = "KVAGENT_THREADS"
#: Without ``n_threads`` or $KVAGENT_THREADS an agent takes at most this many cores.
DEFAULT_MAX_THREADS = 4


def default_threads() -> int:
    """$KVAGENT_THREADS if set, else min(4, the cores this process may run on).

    OSWorld's run_multienv.py starts one agent per worker process and tells none of them
    how many there are, so an agent must not take every core (N workers would each start
    that many threads); for N workers set KVAGENT_THREADS to cores // N, or pass
    ``n_threads``."""
    value = os.environ.get(THREADS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"${THREADS_ENV} must be a positive integer, got {value!r}")
        return int(value)
    cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
             else os.cpu_count() or 1)
    return max(1, min(DEFAULT_MAX_THREADS, cores))


def _budget(value: int | str | None) -> int | None:
    budget = parse_budget(value, relative=False)
    return None if budget.unlimited else budget.resolve()


@attrs.frozen
class KvAgentConfig:
    """Where and with what a KvAgent runs: the model files, the engine's sizes, the memory
    budget, what OSWorld hands it — and ``agent``, how it decides (the ``AgentConfig`` that
    ``kvagent run`` and the bench use too)."""

    model_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    mmproj_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    agent: AgentConfig = attrs.Factory(AgentConfig)
    # the engine's bounds (cachepolicy.engine.records), checked before anything loads
    n_threads: int = attrs.field(factory=default_threads, validator=[
        attrs.validators.ge(1), attrs.validators.le(MAX_THREADS)])
    #: positions of the episode's sequence; None: what ``max_steps`` steps need on
    #: ``screen_size`` screenshots (``plan_context``)
    n_ctx: int | None = attrs.field(default=None, validator=attrs.validators.optional([
        attrs.validators.ge(256), attrs.validators.le(MAX_N_CTX_PER_SEQ)]))
    #: the steps of one episode the context is sized for (OSWorld's run.py: --max_steps 15)
    max_steps: int = attrs.field(default=15, validator=[attrs.validators.ge(1),
                                                        attrs.validators.le(1000)])
    n_batch: int = attrs.field(default=512, validator=[attrs.validators.ge(2),
                                                       attrs.validators.le(MAX_N_BATCH)])
    memory_budget: int | None = attrs.field(default=None, converter=_budget)
    #: the VM's screen (pyautogui's pixels); screenshots of another size are scaled onto it
    screen_size: tuple[int, int] = attrs.field(default=(1920, 1080), converter=tuple)
    action_space: str = "pyautogui"
    observation_type: str = "screenshot"
    name: str = attrs.field(factory=lambda: f"kvagent-{os.getpid()}")

    def __attrs_post_init__(self) -> None:
        if self.action_space != "pyautogui":
            raise ValueError(f"KvAgent emits pyautogui code; action_space={self.action_space!r} "
                             "is not supported")
        if self.observation_type != "screenshot":
            raise ValueError("KvAgent reads screenshots only (observation_type='screenshot')")
        if (self.model_path is None) != (self.mmproj_path is None):
            raise ValueError("give both model_path and mmproj_path (a vision projector), or "
                             "neither (the forged tiny test model)")
        if len(self.screen_size) != 2 or min(self.screen_size) < 1:
            raise ValueError(f"screen_size must be (width, height), got {self.screen_size}")

    def need(self, image_tokens: int) -> ContextNeed:
        """What an episode needs with ``screen_size`` screenshots of ``image_tokens`` tokens."""
        return context_need(self.agent, self.screen_size, image_tokens, steps=self.max_steps)


@attrs.frozen
class ContextPlan:
    """The model files and the context size an agent loads with."""

    model_path: Path
    mmproj_path: Path
    n_ctx: int
    derived: bool  # n_ctx was estimated here (reload once if the projector costs more)


def plan_context(config: KvAgentConfig) -> ContextPlan:
    """Resolve the model (the forged tiny qwen35 when none is given) and size the context
    from the projector's metadata, before anything loads: derive ``n_ctx`` when it is None,
    else check it — ``ContextBudgetError`` (a ValueError) names the knobs to turn."""
    model, mmproj = config.model_path, config.mmproj_path
    if model is None or mmproj is None:
        from cachepolicy.forge import forge_cached
        forged = forge_cached("qwen35", "tiny", vision=True)
        model, mmproj = forged.model_path, forged.mmproj_path
        log.warning("forged_test_model", path=str(model.parent),
                    note="random weights: actions are valid but aimless")
    need = config.need(estimate_image_tokens(mmproj, config.screen_size))
    if config.n_ctx is None:
        return ContextPlan(model, mmproj, max(need.tokens, config.n_batch), derived=True)
    need.check(config.n_ctx)
    return ContextPlan(model, mmproj, config.n_ctx, derived=False)


class AgentHost:
    """The running parts (engine, portal thread, runtime).  Holds no reference to the agent,
    so ``weakref.finalize`` can close it when the agent is collected or at exit."""

    def __init__(self, config: KvAgentConfig, plan: ContextPlan) -> None:
        def make(n_ctx: int) -> Engine:  # one episode at a time: one sequence
            engine = Engine(plan.model_path, plan.mmproj_path, EngineConfig(
                n_ctx_per_seq=max(n_ctx, config.n_batch), n_seq_max=1,
                n_batch=config.n_batch, n_threads=config.n_threads))
            if not engine.has_vision:
                engine.close()
                raise KvAgentError(f"{plan.mmproj_path} gave no vision projector: KvAgent "
                                   "needs one")
            return engine

        probe = blank_png(config.screen_size)
        self.engine = load_sized(make, lambda e: config.need(e.image_tokens(probe)[0]),
                                 plan.n_ctx, derived=plan.derived)
        self._closed = False
        self._lock = threading.Lock()
        try:
            factory = SegmentFactory(self.engine)
            # refuse a policy the model cannot run, now
            config.agent.make_policy(factory, config.screen_size)
            self.runtime = AgentRuntime(factory, config.agent, name=config.name,
                                        budget_bytes=config.memory_budget or UNLIMITED_BYTES,
                                        screen=config.screen_size, max_steps=config.max_steps)
            self._portal_cm: AbstractContextManager[anyio.from_thread.BlockingPortal] = (
                anyio.from_thread.start_blocking_portal(
                    name=f"{PORTAL_THREAD_PREFIX}-{config.name}"))
            self.portal = self._portal_cm.__enter__()
        except BaseException:
            self.engine.close()
            raise
        try:
            self.thread: threading.Thread = self.portal.call(threading.current_thread)
            self._served: Future[None]
            self._served, _ = self.portal.start_task(self.runtime.serve, name="kvagent-runtime")
        except BaseException:
            self._portal_cm.__exit__(None, None, None)
            self.engine.close()
            raise

    def call(self, fn: Any, *args: Any) -> Any:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        return self.portal.call(fn, *args)

    def close(self) -> None:
        """Cancel the prefetch, close the episode and scheduler, stop the loop, free the
        engine.  Idempotent; from the portal thread itself (a finalizer run by a garbage
        collection there) it cannot wait for its own loop and leaves the daemon thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if threading.current_thread() is self.thread:
            log.warning("agent_close_skipped", reason="called from the portal thread")
            return
        try:
            try:
                self.portal.call(self.runtime.stop)
                self._served.result()  # serve returned: prefetch gone, episode closed
            finally:
                self._portal_cm.__exit__(None, None, None)  # stops the loop, joins the thread
        finally:
            self.engine.close()
        log.info("agent_closed")
