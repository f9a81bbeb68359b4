"""The running parts of a ``KvAgent``: its configuration, the Engine, and the event-loop
thread (an anyio blocking portal) that hosts the ``AgentRuntime``.

``AgentHost`` holds no reference to the agent, so ``weakref.finalize`` can close it when the
agent is garbage-collected or at interpreter exit.  Close order (the invariant that makes it
safe): stop the runtime (prefetch cancelled, episode and scheduler closed, no engine call in
flight) → stop the loop and join its thread → free the engine.
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
from runtime.portal_runtime import AgentClosedError, AgentRuntime, KvAgentError
from scheduler.sizes import UNLIMITED_BYTES, parse_budget

log = structlog.get_logger("kvagent.osworld")

PORTAL_THREAD_PREFIX = "kvagent-portal"


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
    n_threads: int = attrs.field(factory=lambda: os.cpu_count() or 1,
                                 validator=[attrs.validators.ge(1),
                                            attrs.validators.le(MAX_THREADS)])
    n_ctx: int = attrs.field(default=16384, validator=[attrs.validators.ge(256),
                                                       attrs.validators.le(MAX_N_CTX_PER_SEQ)])
    n_batch: int = attrs.field(default=512, validator=[attrs.validators.ge(2),
                                                       attrs.validators.le(MAX_N_BATCH)])
    memory_budget: int | None = attrs.field(default=None, converter=_budget)
    screen_size: tuple[int, int] = (1920, 1080)
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


class AgentHost:
    """The running parts (engine, portal thread, runtime).  Holds no reference to the agent,
    so ``weakref.finalize`` can close it when the agent is collected or at exit."""

    def __init__(self, config: KvAgentConfig) -> None:
        model, mmproj = config.model_path, config.mmproj_path
        if model is None:
            from cachepolicy.forge import forge_cached
            forged = forge_cached("qwen35", "tiny", vision=True)
            model, mmproj = forged.model_path, forged.mmproj_path
            log.warning("forged_test_model", path=str(model.parent),
                        note="random weights: actions are valid but aimless")
        self.engine = Engine(model, mmproj, EngineConfig(
            n_ctx_per_seq=config.n_ctx, n_seq_max=1, n_batch=config.n_batch,
            n_threads=config.n_threads))  # one episode at a time: one sequence
        self._closed = False
        self._lock = threading.Lock()
        try:
            if not self.engine.has_vision:
                raise KvAgentError(f"{mmproj} gave no vision projector: KvAgent needs one")
            factory = SegmentFactory(self.engine)
            config.agent.make_policy(factory)  # refuse a policy the model cannot run, now
            self.runtime = AgentRuntime(factory, config.agent, name=config.name,
                                        budget_bytes=config.memory_budget or UNLIMITED_BYTES)
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
