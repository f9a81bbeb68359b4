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
from cachepolicy.sampling import SamplingParams
from cachepolicy.segments import SegmentFactory
from runtime.actions import MAX_ACTION_CHARS, CoordConvention, action_grammar
from runtime.portal_runtime import AgentClosedError, AgentRuntime, KvAgentError, RuntimeSpec
from runtime.sizes import parse_bytes
from scheduler.transaction import StepOptions

log = structlog.get_logger("kvagent.osworld")

#: The ledger budget when none is given: effectively unlimited.
UNLIMITED_BYTES = 1 << 50
PORTAL_THREAD_PREFIX = "kvagent-portal"


def _convention(value: CoordConvention | str) -> CoordConvention:
    return value if isinstance(value, CoordConvention) else CoordConvention(value)


def _budget(value: int | str | None) -> int | None:
    return parse_bytes(value) if isinstance(value, str) else value


@attrs.frozen
class KvAgentConfig:
    """Everything a KvAgent is built from (see ``KvAgent`` for the meaning of each)."""

    model_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    mmproj_path: Path | None = attrs.field(converter=attrs.converters.optional(Path))
    policy: str = "terminal-slot"
    window: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    overlap: bool = True
    convention: CoordConvention = attrs.field(default=CoordConvention.ABSOLUTE,
                                              converter=_convention)
    max_tokens: int = attrs.field(default=MAX_ACTION_CHARS + 1, validator=attrs.validators.ge(1))
    temperature: float = attrs.field(default=0.0, validator=attrs.validators.ge(0.0))
    seed: int = 0
    grammar: bool = True
    n_threads: int = attrs.field(factory=lambda: os.cpu_count() or 1,
                                 validator=attrs.validators.ge(1))
    n_ctx: int = attrs.field(default=16384, validator=attrs.validators.ge(256))
    n_batch: int = attrs.field(default=512, validator=attrs.validators.ge(2))
    memory_budget: int | None = attrs.field(default=None, converter=_budget)
    screen_size: tuple[int, int] = (1920, 1080)
    action_space: str = "pyautogui"
    observation_type: str = "screenshot"
    system_prompt: str | None = None
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
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError("memory_budget must be positive")


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
            sampling = SamplingParams(
                temperature=config.temperature, seed=config.seed,
                grammar=action_grammar(config.convention) if config.grammar else None)
            spec = RuntimeSpec(
                policy=config.policy, window=config.window, overlap=config.overlap,
                convention=config.convention, name=config.name,
                options=StepOptions(decode_tokens=config.max_tokens, stop_at_eog=True,
                                    sampling=sampling),
                budget_bytes=config.memory_budget or UNLIMITED_BYTES,
                system_prompt=config.system_prompt)
            self.runtime = AgentRuntime(SegmentFactory(self.engine), spec)
            self.runtime.make_policy()  # refuse a policy the model cannot run, now
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
