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
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

import structlog

from runtime.config import AgentConfig
from runtime.driver import DriverStep
from runtime.osworld_host import PORTAL_THREAD_PREFIX, AgentHost, KvAgentConfig
from runtime.portal_runtime import (
    AgentClosedError, AgentStepError, KvAgentError, RuntimeStatus,
)
from vmenv.actions import WAIT, CoordConvention, to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.png import screenshot_png

__all__ = ["PORTAL_THREAD_PREFIX", "AgentClosedError", "AgentStepError", "KvAgent",
           "KvAgentConfig", "KvAgentError"]

log = structlog.get_logger("kvagent.osworld")


class KvAgent:
    """An OSWorld agent (``reset`` / ``predict`` / ``close``) served by kvagent.  Called from
    one thread (OSWorld's worker); the work happens in the agent's own event-loop thread.

    ``model_path`` / ``mmproj_path``: a GGUF vision model and its projector (None for both:
    the forged tiny qwen35, random weights — valid but aimless actions).  ``policy``: the cache
    policy (terminal-slot: exact and bounded); ``window``: screenshots kept; ``overlap``:
    prefetch the next step while OSWorld executes the action; ``coord_convention``: how the
    model writes coordinates (actions always come out in absolute screenshot pixels);
    ``max_tokens`` per action (None: what the grammar needs); ``temperature`` / ``seed`` (0.0:
    greedy); ``grammar``: constrain outputs to the action language; ``system_prompt``: replace
    the runtime's prompt (the ``AgentConfig`` fields, shared with ``kvagent run`` and the
    bench, with the same defaults); ``memory_budget``: bytes or "8GiB" for the ledger;
    ``screen_size``: the VM screen expected (the screenshot's own size is what coordinates
    refer to; a mismatch is logged).  Other keyword arguments: see ``KvAgentConfig``.
    """

    def __init__(self, model_path: str | Path | None = None,
                 mmproj_path: str | Path | None = None, *, policy: str = "terminal-slot",
                 window: int = 3, overlap: bool = True,
                 coord_convention: CoordConvention | str = CoordConvention.ABSOLUTE,
                 max_tokens: int | None = None, temperature: float = 0.0, seed: int = 0,
                 grammar: bool = True, system_prompt: str | None = None,
                 n_threads: int | None = None, memory_budget: int | str | None = None,
                 screen_size: tuple[int, int] = (1920, 1080), action_space: str = "pyautogui",
                 **options: Any) -> None:
        if n_threads is not None:
            options["n_threads"] = n_threads
        agent = AgentConfig(policy=policy, window=window, overlap=overlap,
                            convention=coord_convention, decode_tokens=max_tokens,
                            temperature=temperature, seed=seed, grammar=grammar,
                            system_prompt=system_prompt)
        self.config = KvAgentConfig(
            model_path, mmproj_path, agent=agent, memory_budget=memory_budget,
            screen_size=tuple(screen_size), action_space=action_space, **options)
        self._host: AgentHost | None = None
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
        self._ensure_host()
        return self

    def close(self) -> None:
        """Cancel a running prefetch, free the episode, engine and loop thread.  Idempotent."""
        self._closed = True
        if self._finalizer is not None:
            self._finalizer()  # runs AgentHost.close at most once, then detaches
        self._host = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ OSWorld contract

    def reset(self, _logger: Any = None, vm_ip: str | None = None, **kwargs: Any) -> None:
        """Start a new task: close the previous episode's cache, open a fresh one.  Accepts
        every form runners use — ``reset()``, ``reset(logger)``, ``reset(logger, vm_ip=...)``,
        ``reset(vm_ip=...)`` — and ignores keywords it does not know."""
        # OSWorld's runtime_logger writes this example's runtime.log; a reset without one
        # must not keep logging into the previous example's file.
        self._runtime_logger = _logger if hasattr(_logger, "info") else None
        host = self._ensure_host()
        self._episode_id = host.call(host.runtime.new_episode)
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
        host = self._ensure_host()
        arrived = time.perf_counter()  # the screenshot's bytes are in hand
        shot = obs.get("screenshot") if isinstance(obs, Mapping) else None
        if shot is None:
            return self._wait("the observation has no screenshot (the VM did not answer)")
        try:  # PNG as is; JPEG (which OSWorld's controller accepts) & co. converted to PNG
            png, screen = screenshot_png(bytes(shot))
        except (ScreenshotError, TypeError) as exc:
            return self._wait(f"the screenshot is not a valid image ({exc})")
        if screen != self.config.screen_size and not self._warned_screen:
            self._warned_screen = True  # once: OSWorld's screen does not change mid-run
            self._log.warning("screen_size_mismatch", expected=self.config.screen_size,
                              screenshot=screen, note="coordinates follow the screenshot")
        step: DriverStep = host.call(host.runtime.decide, instruction, png, screen, arrived)
        code = to_pyautogui(step.act.action)
        info = {**step.metrics.as_dict(), "code": code}
        info.pop("output_tokens")
        self._episode_id, self.last_info = step.metrics.episode_id, info
        self._log.info("osworld_step", episode_id=self._episode_id, step=step.act.index,
                       action=info["action"], parsed=info["parsed"],
                       prefill_tokens=info["prefill_tokens"],
                       critical_path_s=round(step.metrics.critical_path_s, 4))
        if self._runtime_logger is not None:
            self._runtime_logger.info("kvagent step %d: %s (critical path %.3f s)",
                                      step.act.index, info["action"],
                                      step.metrics.critical_path_s)
        return step.act.response, [code], info

    def status(self) -> RuntimeStatus:
        """The runtime's current episode, ledger and engine sequences (diagnostics)."""
        host = self._ensure_host()
        status: RuntimeStatus = host.call(host.runtime.status)
        return status

    @property
    def episode_id(self) -> str | None:
        return self._episode_id

    @property
    def action_space(self) -> str:
        """What OSWorld's ``run.py`` passes to ``DesktopEnv(action_space=...)``."""
        return self.config.action_space

    # ------------------------------------------------------------------ internals

    def _ensure_host(self) -> AgentHost:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if self._host is None:
            self._host = AgentHost(self.config)
            self._finalizer = weakref.finalize(self, self._host.close)
            a = self.config.agent
            self._log.info("agent_started", policy=a.policy, overlap=a.overlap,
                           window=a.window)
        return self._host

    def _wait(self, why: str) -> tuple[str, list[str], dict[str, Any]]:
        self._log.warning("osworld_no_screenshot", episode_id=self._episode_id, reason=why)
        info = {"episode_id": self._episode_id, "status": "no_screenshot", "reason": why,
                "action": WAIT}
        self.last_info = info
        return f"No usable screenshot: {why}. Waiting for the next one.", [WAIT], info
