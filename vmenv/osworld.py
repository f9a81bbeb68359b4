"""``OSWorldEnv``: OSWorld's ``DesktopEnv`` behind kvagent's async ``Env`` interface.

DesktopEnv is synchronous and slow (it boots VMs, runs setup scripts, sleeps after actions),
so every call into it — construction, ``reset``, ``step``, ``_get_obs``, ``evaluate``,
``close`` — runs in a worker thread (``anyio.to_thread.run_sync``, one at a time through a
CapacityLimiter of 1: one DesktopEnv is one VM and is not thread-safe).

A VM that hangs blocks its worker thread in an HTTP call that Python cannot interrupt.  So
the calls are made with ``abandon_on_cancel=True``: when the caller's timeout (or any
cancellation) fires, the await returns at once and the thread is *abandoned* — it runs on
until DesktopEnv's own HTTP timeouts end it, and whatever it returns or raises is discarded.
The env is then ``broken`` (the VM's state is unknown): every later call but ``close``
raises ``EnvTimeoutError``, and ``close`` itself waits at most ``close_timeout_s``.

Actions cross the boundary as data: ``step`` takes a structured ``Action`` and sends the code
``to_pyautogui`` generates for it (or OSWorld's 'DONE' / 'FAIL' / 'WAIT'); model text never
reaches the VM.  ``desktop_env`` is imported only when this adapter has to build a DesktopEnv
itself; kvagent does not depend on it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread
import structlog

from vmenv.actions import TERMINAL_ACTIONS, Action, to_pyautogui
from vmenv.base import Observation, StepOutcome
from vmenv.errors import (
    EnvBusyError, EnvClosedError, EnvTimeoutError, EpisodeOverError, MissingScreenshotError,
    NotResetError, UnknownTaskError, VmEnvError,
)
from vmenv.png import screenshot_png

log = structlog.get_logger("kvagent.osworld_env")

#: lib_run_single waits this long after ``reset`` before the first observation.
OSWORLD_SETTLE_S = 60.0
#: DesktopEnv.step's default pause after an action.
OSWORLD_PAUSE_S = 2.0
#: How long ``close`` waits for DesktopEnv.close (stopping a VM) before abandoning it.
CLOSE_TIMEOUT_S = 120.0


class OSWorldUnavailableError(VmEnvError):
    """OSWorld's ``desktop_env`` package is not importable here."""


class DesktopEnvLike(Protocol):
    """The part of OSWorld's DesktopEnv this adapter uses."""

    vm_ip: Any

    def reset(self, task_config: dict[str, Any] | None = None, seed: Any = None,
              options: Any = None) -> dict[str, Any]: ...

    def _get_obs(self) -> dict[str, Any]: ...

    def step(self, action: Any, pause: float = 2) -> tuple[dict[str, Any], float, bool,
                                                            dict[str, Any]]: ...

    def evaluate(self) -> float: ...

    def close(self) -> None: ...


def _build_desktop_env(kwargs: Mapping[str, Any]) -> DesktopEnvLike:
    # OSWorld's package is optional: imported only when a real DesktopEnv is built
    from vmenv.osworld_vm.desktop_env_import import DESKTOP_ENV_INSTALL, load_desktop_env
    try:  # light dependencies suffice; the loopback provider is registered
        desktop_env = load_desktop_env()
    except ImportError as exc:
        raise OSWorldUnavailableError(
            f"OSWorld's desktop_env is not installed: `{DESKTOP_ENV_INSTALL}` (or put an "
            "OSWorld checkout on PYTHONPATH), or pass a DesktopEnv you built yourself") from exc
    env: DesktopEnvLike = desktop_env.DesktopEnv(**kwargs)  # boots the VM: in a worker thread
    return env


def _observation(raw: Any, step: int, instruction: str) -> Observation:
    """DesktopEnv's obs dict → Observation (runs in the worker thread: the screenshot is
    verified, and converted to PNG if the VM sent JPEG or another format)."""
    shot = raw.get("screenshot") if isinstance(raw, Mapping) else None
    if shot is None:
        raise MissingScreenshotError("the VM returned no screenshot")
    png, (width, height) = screenshot_png(bytes(shot))
    text = raw.get("instruction") or instruction
    return Observation(screenshot=png, width=width, height=height, instruction=text, step=step)


class OSWorldEnv:
    """An OSWorld VM as an ``Env`` (implements ``vmenv.base.Env``).  One call at a time.

    ``desktop`` is a DesktopEnv (or anything shaped like one); without it one is built on
    first use as ``DesktopEnv(**desktop_kwargs)`` (pass ``require_a11y_tree=False`` for a
    screenshot-only agent).  ``reset(task)`` takes an OSWorld example dict, the id of one in
    ``tasks``, or the path of an example JSON file.  ``pause`` is DesktopEnv.step's sleep after
    an action; ``settle_s`` the wait between reset and the first observation.
    """

    def __init__(self, desktop: DesktopEnvLike | None = None, *,
                 desktop_kwargs: Mapping[str, Any] | None = None,
                 tasks: Mapping[str, Mapping[str, Any]] | None = None,
                 pause: float = OSWORLD_PAUSE_S, settle_s: float = OSWORLD_SETTLE_S,
                 close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        if pause < 0 or settle_s < 0 or close_timeout_s <= 0:
            raise ValueError("pause and settle_s must be >= 0, close_timeout_s > 0")
        self._desktop = desktop
        self._desktop_kwargs = dict(desktop_kwargs or {})
        self.tasks = dict(tasks or {})
        self.pause, self.settle_s, self.close_timeout_s = pause, settle_s, close_timeout_s
        self.broken = ""  # why the env is unusable (a call was abandoned); "" while usable
        self.last_raw: dict[str, Any] | None = None  # the last obs dict (a11y tree, terminal)
        self._instruction = ""
        self._step = 0
        self._reset_done = False
        self._done = False
        self._busy = False
        self._closed = False
        self._limiter: anyio.CapacityLimiter | None = None  # made in the event loop

    @property
    def desktop(self) -> DesktopEnvLike | None:
        """The wrapped DesktopEnv (None until built)."""
        return self._desktop

    @property
    def vm_ip(self) -> Any:
        return getattr(self._desktop, "vm_ip", None)

    # ------------------------------------------------------------------ Env

    async def reset(self, task: str | Mapping[str, Any] | None = None) -> Observation:
        """Revert the VM and set ``task`` up; wait ``settle_s``; observe."""
        config = self._task_config(task)
        self._enter()
        try:
            raw = await self._call(self._reset_sync, config)
            if self.settle_s:
                await anyio.sleep(self.settle_s)
                raw = await self._call(lambda d: d._get_obs())
            instruction = str((config or {}).get("instruction") or "")
            obs = await self._call(lambda _d: _observation(raw, 0, instruction))
        finally:
            self._busy = False
        self.last_raw, self._instruction = raw, obs.instruction
        self._step, self._reset_done, self._done = 0, True, False
        log.info("osworld_reset", task=(config or {}).get("id"), width=obs.width,
                 height=obs.height, vm_ip=self.vm_ip)
        return obs

    async def step(self, action: Action) -> StepOutcome:
        """Execute ``action`` as generated pyautogui code (or a special string)."""
        code = to_pyautogui(action)  # typed data in, generated code out: never model text
        self._enter()
        try:
            if not self._reset_done:
                raise NotResetError("call reset() before step()")
            if self._done:
                raise EpisodeOverError("the episode is over; call reset()")
            raw, reward, done, info = await self._call(lambda d: d.step(code, self.pause))
            # The VM executed the action: record that before reading the screenshot, so a
            # MissingScreenshotError leaves the env consistent (``observe`` can retry).
            done = bool(done) or isinstance(action, TERMINAL_ACTIONS)
            self.last_raw, self._step, self._done = raw, self._step + 1, done
            step, instruction = self._step, self._instruction
            obs = await self._call(lambda _d: _observation(raw, step, instruction))
        finally:
            self._busy = False
        log.debug("osworld_step", step=step, action=action.kind, reward=reward, done=done)
        return StepOutcome(obs, float(reward), done, dict(info or {}))

    async def observe(self) -> Observation:
        """A fresh observation of the current screen (e.g. after a MissingScreenshotError)."""
        self._enter()
        try:
            if not self._reset_done:
                raise NotResetError("call reset() before observe()")
            raw = await self._call(lambda d: d._get_obs())
            step, instruction = self._step, self._instruction
            obs = await self._call(lambda _d: _observation(raw, step, instruction))
        finally:
            self._busy = False
        self.last_raw = raw
        return obs

    async def evaluate(self) -> float:
        """OSWorld's evaluator score of the current episode."""
        self._enter()
        try:
            if not self._reset_done:
                raise NotResetError("call reset() before evaluate()")
            score = await self._call(lambda d: d.evaluate())
        finally:
            self._busy = False
        log.info("osworld_evaluate", score=score)
        return float(score)

    async def close(self) -> None:
        """Close the DesktopEnv (stops the VM).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        desktop, self._desktop = self._desktop, None
        if desktop is not None:
            # A VM must not be left running: shielded from the caller's cancellation, but
            # bounded.  After an abandoned call no limiter: that thread may still be busy
            # with the VM, and closing it is what ends the hang.
            limiter = None if self.broken else self._get_limiter()
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.close_timeout_s):
                await anyio.to_thread.run_sync(desktop.close, limiter=limiter,
                                               abandon_on_cancel=True)
                log.info("osworld_close")
                return
            log.error("osworld_close_timeout", seconds=self.close_timeout_s)

    # ------------------------------------------------------------------ internals

    def _task_config(self, task: str | Mapping[str, Any] | None) -> dict[str, Any] | None:
        if task is None or isinstance(task, Mapping):
            return dict(task) if task is not None else None
        if task in self.tasks:
            return dict(self.tasks[task])
        path = Path(task)
        if path.suffix == ".json" and path.is_file():
            config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return config
        raise UnknownTaskError(f"unknown task {task!r}: not in tasks and not an example file")

    def _reset_sync(self, desktop: DesktopEnvLike, config: dict[str, Any] | None) -> Any:
        return desktop.reset(task_config=config)

    def _get_limiter(self) -> anyio.CapacityLimiter:
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(1)
        return self._limiter

    async def _call(self, fn: Any, *args: Any) -> Any:
        """``fn(desktop, *args)`` in a worker thread (the DesktopEnv is built there first).

        Cancellation abandons the thread (see the module docstring): its result is
        discarded and the env is marked broken."""
        def run() -> Any:
            if self._desktop is None:
                desktop = _build_desktop_env(self._desktop_kwargs)
                if self._closed:  # closed while the VM booted: do not leave it running
                    desktop.close()
                    raise EnvClosedError("the OSWorld env was closed")
                self._desktop = desktop
            return fn(self._desktop, *args)
        try:
            return await anyio.to_thread.run_sync(run, limiter=self._get_limiter(),
                                                  abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            # The thread may still be talking to the VM: abandoned, its result discarded.
            # (An exception raised by ``run`` itself leaves the env usable.)
            self.broken = "a call was abandoned (timed out or cancelled) while the VM was busy"
            log.warning("osworld_call_abandoned")
            raise

    def _enter(self) -> None:
        if self._closed:
            raise EnvClosedError("the OSWorld env is closed")
        if self.broken:
            raise EnvTimeoutError(f"the OSWorld env is unusable: {self.broken}")
        if self._busy:
            raise EnvBusyError("another call of this env is running")
        self._busy = True
