"""Where a ``KvAgent`` decides: in this process (``LocalBackend``: its own engine, scheduler
and event-loop thread) or on a ``kvagent serve`` host (``runtime.osworld.remote``).

Both answer ``decide`` with a ``Decision``: the action as a parsed record in pixels of the
screenshot the model saw, and the step's measurements.  What ``KvAgent`` does with it — scale
the points onto the VM's screen, generate the pyautogui code — is the same for both, so a
remote agent acts exactly like an in-process one.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs
import structlog

from runtime.osworld.local_host import AgentHost, ContextPlan, KvAgentConfig
from runtime.osworld.local_runtime import AgentClosedError, RuntimeStatus
from vmenv.actions import Action

log = structlog.get_logger("kvagent.osworld")


@attrs.frozen
class Decision:
    """One decided step."""

    episode_id: str
    index: int  # the step's number in its episode (0-based)
    response: str  # the model's text
    action: Action  # a record, points in pixels of the screenshot the model saw
    #: the step's measurements (``StepMetrics.as_dict`` without the output tokens)
    info: dict[str, Any]
    critical_path_s: float  # screenshot in hand -> action decided, as the decider measured it


class AgentBackend(Protocol):
    def new_episode(self) -> str | None:
        """End the current episode (its cache is freed); the next ``decide`` starts one."""

    def decide(self, instruction: str, png: bytes, size: tuple[int, int],
               screen: tuple[int, int], arrived_at: float) -> Decision:
        """Decide the next action of ``instruction``'s episode on ``png`` (``size`` pixels;
        the VM's screen is ``screen``)."""

    def close(self) -> None:
        """Free everything; idempotent.  Must not reference the agent (a finalizer)."""


class LocalBackend:
    """The agent's own engine and scheduler in a background event loop, started on first use."""

    def __init__(self, config: KvAgentConfig, plan: ContextPlan) -> None:
        self.config, self.plan = config, plan
        self._host: AgentHost | None = None
        self._closed = False

    @property
    def host(self) -> AgentHost:
        if self._closed:
            raise AgentClosedError("the agent is closed")
        if self._host is None:
            self._host = AgentHost(self.config, self.plan)
            a = self.config.agent
            log.info("agent_started", agent=self.config.name, profile=a.profile,
                     policy=a.policy, overlap=a.overlap, window=a.window,
                     n_ctx=self._host.engine.config.n_ctx_per_seq,
                     n_threads=self.config.n_threads)
        return self._host

    @property
    def started(self) -> bool:
        return self._host is not None

    def new_episode(self) -> str | None:
        host = self.host
        episode_id: str = host.call(host.runtime.new_episode)
        return episode_id

    def decide(self, instruction: str, png: bytes, size: tuple[int, int],
               screen: tuple[int, int], arrived_at: float) -> Decision:
        host = self.host
        step = host.call(host.runtime.decide, instruction, png, size, arrived_at)
        info = step.metrics.as_dict()
        info.pop("output_tokens")
        return Decision(step.metrics.episode_id, step.act.index, step.act.response,
                        step.act.action, info, step.metrics.critical_path_s)

    def status(self) -> RuntimeStatus:
        host = self.host
        status: RuntimeStatus = host.call(host.runtime.status)
        return status

    def close(self) -> None:
        self._closed = True
        host, self._host = self._host, None
        if host is not None:
            host.close()
