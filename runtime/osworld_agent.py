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

from runtime.actions import MAX_ACTION_CHARS, WAIT, CoordConvention, format_action, to_pyautogui
from runtime.osworld_host import PORTAL_THREAD_PREFIX, AgentHost, KvAgentConfig
from runtime.portal_runtime import (
    AgentClosedError, AgentStepError, Decision, KvAgentError, RuntimeStatus,
)
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
        t0 = time.perf_counter()
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
        decision: Decision = host.call(host.runtime.decide, instruction, png, screen)
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
            self._log.info("agent_started", policy=self.config.policy,
                           overlap=self.config.overlap, window=self.config.window)
        return self._host

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
