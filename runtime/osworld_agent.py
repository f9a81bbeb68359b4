"""``KvAgent``: kvagent as an OSWorld agent, for OSWorld's own synchronous runners.

Drop-in for ``lib_run_single.run_single_example`` / ``run_multienv`` (one agent per worker
process, one DesktopEnv each), without changes to OSWorld::

    agent = KvAgent(model_path, mmproj_path, policy="terminal-slot", overlap=True)
    agent.reset(runtime_logger, vm_ip=env.vm_ip)      # per task
    response, actions = agent.predict(instruction, obs)  # actions: ['pyautogui.click(...)']
    agent.close()                                        # or at interpreter exit

Inside, an event loop runs in a background thread (an anyio blocking portal) holding the
Engine's Scheduler and the episode's ``AgentSession``.  ``predict`` hands the screenshot over
and blocks until the action is decided; with ``overlap`` it returns while the next step's
prefetch (the action text and the screenshots the next window keeps) runs in that loop — that
is, while OSWorld executes the action and sleeps ``sleep_after_execution``.  The next
``predict`` waits for it, ``reset`` and ``close`` cancel it.

Actions are generated from parsed records (``to_pyautogui``), never copied from model text:
one pyautogui code string per step, or 'DONE' / 'FAIL' / 'WAIT' (an unparsable output and a
missing screenshot both give 'WAIT').
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Self

import anyio.from_thread
import attrs
import structlog

from cachepolicy.engine import Engine, EngineConfig
from cachepolicy.sampling import SamplingParams
from cachepolicy.segments import SegmentFactory
from runtime.actions import (
    MAX_ACTION_CHARS, WAIT, CoordConvention, action_grammar, format_action, to_pyautogui,
)
from runtime.portal_runtime import (
    AgentClosedError, AgentRuntime, AgentStepError, Decision, KvAgentError, RuntimeSpec,
    RuntimeStatus,
)
from runtime.sizes import parse_bytes
from scheduler.transaction import StepOptions
from vmenv.errors import ScreenshotError
from vmenv.png import png_size

__all__ = ["AgentClosedError", "AgentStepError", "KvAgent", "KvAgentConfig", "KvAgentError"]

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
        if self.memory_budget is not None and self.memory_budget <= 0:
            raise ValueError("memory_budget must be positive")


class _Core:
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


class KvAgent:
    """An OSWorld agent (``reset`` / ``predict`` / ``close``) served by kvagent.

    ``model_path`` / ``mmproj_path``: a GGUF vision model and its projector (None for both:
    the forged tiny qwen35, random weights — valid but aimless actions).  ``policy``: the cache
    policy (terminal-slot: exact and bounded); ``window``: screenshots kept; ``overlap``:
    prefetch the next step while OSWorld executes the action; ``coord_convention``: how the
    model writes coordinates (actions always come out in absolute screenshot pixels);
    ``max_tokens`` per action; ``temperature`` / ``seed`` (0.0: greedy); ``grammar``: constrain
    outputs to the action language; ``memory_budget``: bytes or "8GiB" for the ledger;
    ``screen_size``: the VM screen expected (the screenshot's own size is what coordinates
    refer to; a mismatch is logged).  Other keyword arguments: see ``KvAgentConfig``.
    """

    def __init__(self, model_path: str | Path | None = None,
                 mmproj_path: str | Path | None = None, *, policy: str = "terminal-slot",
                 window: int = 3, overlap: bool = True,
                 coord_convention: CoordConvention | str = CoordConvention.ABSOLUTE,
                 max_tokens: int = MAX_ACTION_CHARS + 1, temperature: float = 0.0,
                 seed: int = 0, n_threads: int | None = None,
                 memory_budget: int | str | None = None,
                 screen_size: tuple[int, int] = (1920, 1080), action_space: str = "pyautogui",
                 **options: Any) -> None:
        if n_threads is not None:
            options["n_threads"] = n_threads
        self.config = KvAgentConfig(
            model_path, mmproj_path, policy=policy, window=window, overlap=overlap,
            convention=coord_convention, max_tokens=max_tokens, temperature=temperature,
            seed=seed, memory_budget=memory_budget, screen_size=tuple(screen_size),
            action_space=action_space, **options)
        self._core: _Core | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False
        self._runtime_logger: logging.Logger | logging.LoggerAdapter[Any] | None = None
        self._episode_id: str | None = None
        self._warned_screen = False
        self._log = log.bind(agent=self.config.name)
        self.last_info: dict[str, Any] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Load the model and start the background loop now (else on first use)."""
        self._ensure_core()
        return self

    def close(self) -> None:
        """Cancel a running prefetch, free the episode, engine and loop thread.  Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()  # runs _Core.close at most once, then detaches
        self._core = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ OSWorld contract

    def reset(self, _logger: Any = None, vm_ip: str | None = None, **kwargs: Any) -> None:
        """Start a new task: close the previous episode's cache, open a fresh one.  Accepts
        every form runners use — ``reset()``, ``reset(logger)``, ``reset(logger, vm_ip=...)``,
        ``reset(vm_ip=...)`` — and ignores keywords it does not know."""
        if _logger is not None and hasattr(_logger, "info"):
            self._runtime_logger = _logger
        core = self._ensure_core()
        self._episode_id = core.call(core.runtime.new_episode)
        self._log.info("osworld_reset", episode_id=self._episode_id, vm_ip=vm_ip,
                       ignored=sorted(kwargs) or None)

    def predict(self, instruction: str, obs: Mapping[str, Any],
                **kwargs: Any) -> tuple[str, list[str]]:
        """``(response, [action])``: the model's text and one pyautogui code string or
        'DONE' / 'FAIL' / 'WAIT'.  Raises ``AgentStepError`` if the step could not run."""
        response, actions, _ = self.predict_with_info(instruction, obs, **kwargs)
        return response, actions

    def predict_with_info(self, instruction: str, obs: Mapping[str, Any],
                          **kwargs: Any) -> tuple[str, list[str], dict[str, Any]]:
        """``predict`` plus a per-step metrics dict (the 3-tuple runners such as OpenCUA's
        expect): prefill / reused / decode tokens, critical_path_s, prefetch timings."""
        core = self._ensure_core()
        t0 = time.perf_counter()
        png = obs.get("screenshot") if isinstance(obs, Mapping) else None
        if png is None:
            return self._wait("the observation has no screenshot (the VM did not answer)")
        try:
            png = bytes(png)
            screen = png_size(png)
        except (ScreenshotError, TypeError) as exc:
            return self._wait(f"the screenshot is not a valid PNG ({exc})")
        if screen != self.config.screen_size and not self._warned_screen:
            self._warned_screen = True  # once: OSWorld's screen does not change mid-run
            self._log.warning("screen_size_mismatch", expected=self.config.screen_size,
                              screenshot=screen, note="coordinates follow the screenshot")
        decision: Decision = core.call(core.runtime.decide, instruction, png, screen)
        critical = time.perf_counter() - t0
        code = to_pyautogui(decision.act.action)
        info = self._info(decision, critical, code)
        self._episode_id, self.last_info = decision.episode_id, info
        self._log.info("osworld_step", episode_id=decision.episode_id, step=info["step"],
                       action=info["action"], parsed=info["parsed"],
                       prefill_tokens=info["prefill_tokens"],
                       critical_path_s=round(critical, 4))
        if self._runtime_logger is not None:
            self._runtime_logger.info("kvagent step %d: %s (critical path %.3f s)",
                                      info["step"], info["action"], critical)
        return decision.act.response, [code], info

    def status(self) -> RuntimeStatus:
        """The runtime's current episode, ledger and engine sequences (diagnostics)."""
        core = self._ensure_core()
        status: RuntimeStatus = core.call(core.runtime.status)
        return status

    @property
    def episode_id(self) -> str | None:
        return self._episode_id

    # ------------------------------------------------------------------ internals

    def _ensure_core(self) -> _Core:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if self._core is None:
            self._core = _Core(self.config)
            self._finalizer = weakref.finalize(self, self._core.close)
            self._log.info("agent_started", policy=self.config.policy,
                           overlap=self.config.overlap, window=self.config.window)
        return self._core

    def _wait(self, why: str) -> tuple[str, list[str], dict[str, Any]]:
        self._log.warning("osworld_no_screenshot", episode_id=self._episode_id, reason=why)
        info = {"episode_id": self._episode_id, "status": "no_screenshot", "reason": why,
                "action": WAIT}
        self.last_info = info
        return f"No usable screenshot: {why}. Waiting for the next one.", [WAIT], info

    @staticmethod
    def _info(d: Decision, critical_s: float, code: str) -> dict[str, Any]:
        r, act = d.act.record, d.act
        pre = act.prefetch
        return {
            "episode_id": d.episode_id, "step": act.index, "status": r.status,
            "action": format_action(act.action), "code": code, "parsed": act.parsed,
            "prefill_tokens": r.prefill_tokens, "reused_tokens": r.reused_tokens,
            "critical_path_prefill_tokens": r.critical_path_prefill_tokens,
            "context_tokens": r.context_tokens, "decode_tokens": r.decode_tokens,
            "prefill_s": r.prefill_s, "decode_s": r.decode_s, "critical_path_s": critical_s,
            "prefetch_prefill_tokens": pre.prefill_tokens if pre is not None else 0,
            "prefetch_s": d.prefetch_s, "prefetch_wait_s": d.prefetch_wait_s,
            "prefetch_error": d.prefetch_error or None,
            "kv_bytes": r.kv_bytes, "checkpoint_bytes": r.checkpoint_bytes,
        }
