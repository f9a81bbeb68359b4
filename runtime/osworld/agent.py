"""``KvAgent``: kvagent as an OSWorld agent, for OSWorld's own synchronous runners.

Drop-in for ``lib_run_single.run_single_example`` / ``run.py`` / ``run_multienv.py`` (one
agent per worker process, one DesktopEnv each), without changes to OSWorld::

    agent = KvAgent(model_path, mmproj_path, profile="qwen3vl", screen_size=(1920, 1080))
    env = DesktopEnv(action_space=agent.action_space, ...)  # run.py reads it
    agent.reset(runtime_logger, vm_ip=env.vm_ip)         # per task
    response, actions = agent.predict(instruction, obs)  # actions: ['pyautogui.click(...)']
    agent.close()                                        # optional (see below)

Inside, an event loop runs in a background thread (an anyio blocking portal) holding the
Engine's Scheduler and the episode's ``AgentSession``.  ``predict`` hands the screenshot over
and blocks until the action is decided; with ``overlap`` it returns while the next step's
prefetch (the action text and the screenshots the next window keeps) runs in that loop — that
is, while OSWorld executes the action and sleeps ``sleep_after_execution``.  The next
``predict`` waits for it, ``reset`` and ``close`` cancel it.

Actions are generated from parsed records (``to_pyautogui``), never copied from model text:
one pyautogui code string per step, or 'DONE' / 'FAIL' / 'WAIT' (an unparsable output and a
missing screenshot both give 'WAIT').  The model points at pixels of the screenshot it saw.
OSWorld's screenshots are taken at the VM's resolution, so a screenshot of another size than
``screen_size`` means a wrong ``screen_size`` — a ``ScreenSizeError`` on that first
screenshot, in either direction — unless the runner says the screen per observation
(``obs["screen_size"]``) or the agent was told the screenshots are scaled
(``scale_to_screen=True``: a HiDPI VM); then the points are scaled onto the screen
(``vmenv.actions.rescale``).  Every adjustment kvagent makes to a step — a point clamped or
refused by the parser, points scaled, a WAIT for a missing or unreadable screenshot — is in
``last_info["notes"]``, appended to the response OSWorld writes to traj.jsonl, and logged to
the runner's logs (the example's ``runtime.log`` given to ``reset``, and the ``desktopenv``
loggers).

Construction checks that the context holds the window's screenshots, the history of
``max_steps`` steps and a response (``ContextBudgetError`` names the knob to turn), or
derives ``n_ctx`` from them.  ``close`` frees everything early; OSWorld's runners never call
it and end workers with ``os._exit``, which is fine: nothing an agent holds outlives its
process (see ``runtime.osworld.local_host``).

``KvAgent(server="http://host:8000")`` is the same agent as a thin client of ``kvagent
serve``: no model in this process (nor libllama), the episode (cache, overlapped prefetch,
memory budget) lives on the server, shared with every other worker's agent.  It decides like
the in-process agent with the same options — the server sends the action as data, this side
parses it and generates the code (``runtime.osworld.remote``).  The model's sizes
(``model_path``, ``n_ctx``, ``n_threads``, ``memory_budget``) are then the server's flags;
``api_key`` (or ``$KVAGENT_API_KEY``) is the server's key.  While an episode is open the
agent holds its lease on a thread of its own (``runtime.osworld.lease``), so a worker ended
with ``os._exit`` gives its episode's slot back within seconds.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import structlog

from runtime.config import AgentConfig
from runtime.context_budget import ContextBudgetError
from runtime.osworld.backend import AgentBackend, Decision
from runtime.osworld.config import KvAgentConfig, agent_engine, plan_context
from runtime.osworld.episode_client import EpisodeClient
from runtime.osworld.errors import AgentClosedError, AgentStepError, KvAgentError
from runtime.osworld.remote import RemoteBackend, remote_options
from runtime.osworld.runner_log import log_once
from vmenv.actions import WAIT, CoordConvention, rescale, to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.png import screenshot_png

if TYPE_CHECKING:
    from runtime.osworld.local import RuntimeStatus

__all__ = ["AgentClosedError", "AgentStepError", "ContextBudgetError", "KvAgent",
           "KvAgentConfig", "KvAgentError", "ScreenSizeError"]

log = structlog.get_logger("kvagent.osworld")
#: OSWorld's runners attach their log files to the "desktopenv" loggers and the root logger.
OSWORLD_LOG = logging.getLogger("desktopenv.agent.kvagent")


class ScreenSizeError(KvAgentError, ValueError):
    """A screenshot's size is not ``screen_size`` (and nothing said it may be scaled)."""


def _annotated(response: str, notes: list[str]) -> str:
    """The response OSWorld writes to traj.jsonl, with what kvagent changed appended (the
    model's text itself is unchanged; actions are generated from the parsed record)."""
    return response if not notes else f"{response}\n[kvagent: {'; '.join(notes)}]"


class KvAgent:
    """An OSWorld agent (``reset`` / ``predict`` / ``close``) served by kvagent.  Called from
    one thread (OSWorld's worker); the work happens in the agent's own event-loop thread.

    ``model_path`` / ``mmproj_path``: a GGUF vision model and its projector (None for both:
    kvagent's trained demo agent, ``kvagent-agent-qwen35``: it solves simdesk's tasks and
    knows nothing else).  ``profile``: the
    model family's prompt, output format and history layout — ``kvagent`` (kvagent's own
    action language, for any instruction model), ``qwen3vl`` (Qwen3-VL computer_use tool
    calls), ``uitars`` / ``uitars-v1`` (UI-TARS 1.5 / 1.0 Thought/Action); see
    ``runtime.profiles``.  ``policy``: the cache policy (terminal-slot: exact and bounded);
    ``window``: screenshots kept (default: the profile's); ``pinned``: of those, the episode's
    first ones kept to its end (``--pin-first``); ``overlap``: prefetch the next step
    while OSWorld executes the action; ``coord_convention``: how the kvagent profile's model
    writes coordinates; ``max_tokens`` per action (None: what the grammar needs);
    ``temperature`` / ``seed`` (0.0: greedy); ``grammar``: constrain outputs to the profile's
    format; ``system_prompt``: replace the profile's prompt (the ``AgentConfig`` fields,
    shared with ``kvagent run`` and the bench, with the same defaults).

    ``screen_size``: the VM's screen, i.e. DesktopEnv's ``screen_size`` (OSWorld does not
    pass it to ``predict``); ``scale_to_screen``: screenshots of another size are scaled
    onto it rather than refused (module docstring); ``n_ctx``: context positions (None: derived from the window,
    ``max_steps`` and ``screen_size``); ``max_steps``: steps per episode the context is sized
    for (default 15, run.py's); ``n_threads``: default ``$KVAGENT_THREADS`` or min(4, cores);
    ``memory_budget``: bytes or "8GiB" for the ledger (host memory); ``n_gpu_layers``
    (keyword): layers on the GPU as ``--gpu-layers`` (-1 all; default 0; docs/gpu.md).
    Other keyword arguments: see
    ``KvAgentConfig``.  Raises ``ContextBudgetError`` (a ValueError) when the context
    cannot hold the configuration.

    ``server``: the URL of a ``kvagent serve`` host to decide on instead of loading a model
    here (then ``model_path``, ``mmproj_path``, ``n_ctx``, ``n_threads``, ``memory_budget``
    and the engine options belong to the server and are refused here); ``api_key``: the
    server's API key (default: ``$KVAGENT_API_KEY``, its first key when it lists several);
    ``server_timeout``: seconds a step may take there; ``server_retry_s``: how long to keep
    retrying while the server is full (429/503) or not reachable yet.
    """

    def __init__(self, model_path: str | Path | None = None,
                 mmproj_path: str | Path | None = None, *, profile: str = "kvagent",
                 policy: str = "terminal-slot", window: int | None = None,
                 pinned: int = 0, overlap: bool = True,
                 coord_convention: CoordConvention | str = CoordConvention.ABSOLUTE,
                 max_tokens: int | None = None, temperature: float = 0.0, seed: int = 0,
                 grammar: bool = True, system_prompt: str | None = None,
                 n_threads: int | None = None, n_ctx: int | None = None, max_steps: int = 15,
                 memory_budget: int | str | None = None,
                 screen_size: tuple[int, int] = (1920, 1080), scale_to_screen: bool = False,
                 action_space: str = "pyautogui",
                 server: str | None = None, api_key: str | None = None,
                 server_timeout: float = 600.0, server_retry_s: float = 600.0,
                 **options: Any) -> None:
        if server is None and api_key is not None:
            raise ValueError("api_key is for a server (server=URL)")
        if server is not None:
            servers = {k for k, v in (("model_path", model_path), ("mmproj_path", mmproj_path),
                                      ("n_ctx", n_ctx), ("n_threads", n_threads),
                                      ("memory_budget", memory_budget)) if v is not None}
            if servers | set(options):
                raise ValueError(f"{', '.join(sorted(servers | set(options)))}: with server= "
                                 "the model and its sizes are the server's (kvagent serve "
                                 "flags)")
        engine = agent_engine(n_threads=n_threads, n_batch=options.pop("n_batch", 512),
                              n_gpu_layers=options.pop("n_gpu_layers", 0))
        chosen = {"window": window} if window is not None else {}  # else the profile's
        agent = AgentConfig(profile=profile, policy=policy, pinned=pinned, overlap=overlap,
                            convention=coord_convention, decode_tokens=max_tokens,
                            temperature=temperature, seed=seed, grammar=grammar,
                            system_prompt=system_prompt, **chosen)
        self.config = KvAgentConfig(
            model_path, mmproj_path, agent=agent, engine=engine, memory_budget=memory_budget,
            n_ctx=n_ctx,
            max_steps=max_steps, screen_size=tuple(screen_size), action_space=action_space,
            **options)
        self._backend: AgentBackend
        if server is None:
            # Imported here, not at the top: a thin client (server=URL) must not load
            # libllama, which the local backend's engine does.
            from runtime.osworld.local import LocalBackend

            # the model files resolved and the context checked (or sized) before anything
            # loads (which happens on first use)
            self._backend = LocalBackend(self.config, plan_context(self.config))
        else:
            self._backend = RemoteBackend(
                EpisodeClient(server, timeout=server_timeout, retry_s=server_retry_s,
                              api_key=api_key if api_key is not None else env_api_key()),
                remote_options(agent), name=self.config.name)
        # closes the backend (engine and loop thread, or the server's episode) when the
        # agent is collected or at interpreter exit; holds no reference to the agent
        self._finalizer = weakref.finalize(self, self._backend.close)
        self._closed = False
        self._started = False
        self._runtime_logger: logging.Logger | logging.LoggerAdapter[Any] | None = None
        self._episode_id: str | None = None
        self._instruction: str | None = None  # the current episode's task
        #: screenshots of another size than ``screen_size`` are scaled onto it (HiDPI VMs,
        #: runners that resize screenshots); without it such a screenshot is an error
        self.scale_to_screen = scale_to_screen
        self._log = log.bind(agent=self.config.name)
        self.last_info: dict[str, Any] = {}

    @property
    def n_ctx(self) -> int:
        """The context positions the agent loads (or loaded) with (in-process agents; with
        ``server=`` a ``KvAgentError``: they are the server's)."""
        return self._backend.n_ctx

    @property
    def server(self) -> str | None:
        """The ``kvagent serve`` URL this agent decides on (None: in-process)."""
        return self._backend.server

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Load the model and start the background loop now (else on first use); a remote
        agent checks that its server answers."""
        self._ensure_started().ping()
        return self

    def close(self) -> None:
        """Cancel a running prefetch, free the episode, engine and loop thread (remote: end
        the server's episode).  Idempotent."""
        self._closed = True
        self._finalizer()  # runs the backend's close at most once, then detaches

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
        # must not keep logging into the previous example's file.  (Some runners pass it as
        # the keyword runtime_logger=.)
        if _logger is None:
            _logger = kwargs.pop("runtime_logger", None)
        self._runtime_logger = _logger if hasattr(_logger, "info") else None
        self._instruction = None
        self._episode_id = self._ensure_started().new_episode()
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
        expect): prefill / reused / decode tokens, ``encode_s`` (vision encoder) beside
        ``prefill_s`` (LLM), critical_path_s, prefetch timings, the parser's ``notes``
        (clamped or rejected points, ignored calls), ``action`` in the screenshot's pixels and
        ``code`` in the screen's (``screenshot_size`` / ``screen_size``)."""
        backend = self._ensure_started()
        arrived = time.perf_counter()  # the screenshot's bytes are in hand
        shot = obs.get("screenshot") if isinstance(obs, Mapping) else None
        if shot is None:
            return self._wait("the observation has no screenshot (the VM did not answer)")
        try:  # PNG as is; JPEG (which OSWorld's controller accepts) & co. converted to PNG
            png, size = screenshot_png(bytes(shot))
        except (ScreenshotError, TypeError) as exc:
            return self._wait(f"the screenshot is not a valid image ({exc})")
        told = _screen_of(obs)  # a runner that says the screen per observation is explicit
        screen = told or self.config.screen_size
        if size != screen and told is None and not self.scale_to_screen:
            raise self._screen_mismatch(size)
        if self._instruction is not None and instruction != self._instruction:
            # a new task without reset(): the history of the last one must not leak into it
            self._log.warning("instruction_changed", episode_id=self._episode_id)
            self._episode_id = backend.new_episode()
        self._instruction = instruction
        step: Decision = backend.decide(instruction, png, size, screen, arrived)
        scaled = rescale(step.action, size, screen)
        code = to_pyautogui(scaled)
        notes = [str(n) for n in step.info.get("notes") or ()]
        if scaled != step.action:
            notes.append(f"points scaled from the {size[0]}x{size[1]} screenshot to the "
                         f"{screen[0]}x{screen[1]} screen")
        info = {**step.info, "code": code, "screenshot_size": list(size),
                "screen_size": list(screen), "notes": notes,
                "model_response": step.response}  # the response is this plus the notes
        self._episode_id, self.last_info = step.episode_id, info
        for note in notes:  # every adjustment reaches OSWorld's logs (runtime.log too)
            self._note(logging.WARNING, f"kvagent step {step.index}: {note}")
        self._log.info("osworld_step", episode_id=self._episode_id, step=step.index,
                       action=info["action"], parsed=info["parsed"],
                       prefill_tokens=info["prefill_tokens"],
                       critical_path_s=round(step.critical_path_s, 4))
        if self._runtime_logger is not None:
            self._runtime_logger.info("kvagent step %d: %s (critical path %.3f s)",
                                      step.index, info["action"], step.critical_path_s)
        return _annotated(step.response, notes), [code], info

    def status(self) -> RuntimeStatus | dict[str, Any]:
        """Diagnostics: in-process, the runtime's episode, ledger and engine sequences; with
        ``server=``, the server's description of the episode (``GET /v1/episodes/{id}``)."""
        return self._ensure_started().status()

    @property
    def episode_id(self) -> str | None:
        return self._episode_id

    @property
    def action_space(self) -> str:
        """What OSWorld's ``run.py`` passes to ``DesktopEnv(action_space=...)``."""
        return self.config.action_space

    # ------------------------------------------------------------------ internals

    def _ensure_started(self) -> AgentBackend:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        backend = self._backend
        if not self._started:
            self._started = True
            a = self.config.agent
            backend.start()  # in-process: loads the model
            for differs in a.make_profile().layout.unhonoured:  # once per agent
                self._log.info("profile_layout_differs", profile=a.profile, differs=differs)
        return backend

    def _wait(self, why: str) -> tuple[str, list[str], dict[str, Any]]:
        self._log.warning("osworld_no_screenshot", episode_id=self._episode_id, reason=why)
        note = f"answered WAIT without asking the model: {why}"
        info = {"episode_id": self._episode_id, "status": "no_screenshot", "reason": why,
                "action": WAIT, "notes": [note]}
        self.last_info = info
        self._note(logging.WARNING, f"kvagent: {note}")
        return _annotated(f"No usable screenshot: {why}. Waiting for the next one.", [note]), \
            [WAIT], info

    def _note(self, level: int, message: str) -> None:
        """An adjustment kvagent made, where OSWorld's runners keep logs: the example's
        ``runtime.log`` (the logger ``reset`` received) and the ``desktopenv`` loggers —
        once in each (the example's logger propagates to the root's files as well)."""
        log_once(level, message, (self._runtime_logger, OSWORLD_LOG))

    def _screen_mismatch(self, size: tuple[int, int]) -> ScreenSizeError:
        w, h = self.config.screen_size
        message = (f"the screenshot is {size[0]}x{size[1]} but screen_size is {w}x{h}: "
                   f"pass KvAgent(screen_size=...) the VM's screen (DesktopEnv's "
                   f"screen_size); if the screenshots really are another size than the "
                   f"screen (a HiDPI VM, a runner that resizes them), pass "
                   f"scale_to_screen=True to scale the model's points onto the screen")
        self._note(logging.ERROR, f"kvagent: {message}")
        self._log.error("screen_size_mismatch", screen=(w, h), screenshot=size)
        return ScreenSizeError(message)


#: The environment variable a server's API keys are read from (comma-separated).
API_KEY_ENV = "KVAGENT_API_KEY"


def env_api_key() -> str | None:
    """The API key a remote agent sends when given none: ``$KVAGENT_API_KEY``'s (first)."""
    value = os.environ.get(API_KEY_ENV, "")
    keys = [k.strip() for k in value.split(",") if k.strip()]
    return keys[0] if keys else None


def _screen_of(obs: Mapping[str, Any]) -> tuple[int, int] | None:
    """The screen size a runner put in the observation, if any: ``obs["screen_size"]`` as
    (width, height) or as ``DesktopEnv.vm_screen_size``'s {"width": .., "height": ..}.
    OSWorld's own observations carry none (``screen_size=`` is then what counts)."""
    value = obs.get("screen_size")
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = (value.get("width"), value.get("height"))
    try:
        w, h = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"obs['screen_size'] must be (width, height), got {value!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"obs['screen_size'] must be positive, got {value!r}")
    return w, h
