"""Where a ``KvAgent`` decides: in this process (``runtime.osworld.local``: its own engine,
scheduler and event-loop thread) or on a ``kvagent serve`` host (``runtime.osworld.remote``).

Both answer ``decide`` with a ``Decision``: the action as a parsed record in pixels of the
screenshot the model saw, and the step's measurements.  What ``KvAgent`` does with it — scale
the points onto the VM's screen, generate the pyautogui code — is the same for both, so a
remote agent acts exactly like an in-process one.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from vmenv.actions import Action


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
    """What ``KvAgent`` asks of where it decides — it never asks which backend it holds."""

    @property
    def server(self) -> str | None:
        """The ``kvagent serve`` URL steps are decided on (None: in this process)."""

    @property
    def n_ctx(self) -> int:
        """The context positions the model loads (or loaded) with; ``KvAgentError`` where
        they are the server's."""

    def start(self) -> None:
        """Called once, on the agent's first use: in-process, load the model and start the
        loop (a configuration the model cannot run fails here); remote, nothing (the
        server's episode opens with the first step)."""

    def ping(self) -> None:
        """``KvAgent.start()``'s check that steps can be decided now: remote, the server
        answers its health check; in-process, ``start`` already said so."""

    def new_episode(self) -> str | None:
        """End the current episode (its cache is freed); the next ``decide`` starts one."""

    def decide(self, instruction: str, png: bytes, size: tuple[int, int],
               screen: tuple[int, int], arrived_at: float) -> Decision:
        """Decide the next action of ``instruction``'s episode on ``png`` (``size`` pixels;
        the VM's screen is ``screen``)."""

    def status(self) -> Any:
        """Diagnostics of the current episode."""

    def close(self) -> None:
        """Free everything; idempotent.  Must not reference the agent (a finalizer)."""
