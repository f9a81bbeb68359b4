"""Replays as runs: N teacher-forced episodes of one recorded trajectory through the loop
that ships (``run_agents``) — what ``kvagent run --env replay``, every ``kvagent bench`` arm
and ``bench --episodes`` run.

Teacher forcing: step i's history text is the trajectory's recorded action, whatever the
model decoded, so every episode (and every bench arm) sees the same content and outputs
compare step by step.
"""

from __future__ import annotations

from collections.abc import Callable

from cachepolicy.engine import Engine
from runtime.config import AgentConfig
from runtime.run.agents import EpisodeEvent, EpisodeSpec, RunConfig, RunResult, run_agents
from scheduler.release import STALL_TIMEOUT_S
from scheduler.sizes import UNLIMITED_BYTES
from vmenv.replay import ReplayEnv
from vmenv.trajectory import Trajectory

#: The instruction of a recorded trajectory that has none.
DEFAULT_INSTRUCTION = "Complete the task on the screen."


def replay_specs(traj: Trajectory, n: int, prefix: str) -> tuple[EpisodeSpec, ...]:
    """``n`` episodes of the same recorded trajectory."""
    first = traj.frames[0]
    return tuple(EpisodeSpec(i, f"{prefix}{i}" if n > 1 else prefix, "replay",
                             f"{prefix}{i}", traj.instruction or DEFAULT_INSTRUCTION,
                             (first.width, first.height))
                 for i in range(n))


def replay_teacher(traj: Trajectory) -> Callable[[EpisodeSpec], Callable[[int], str | None]]:
    """Teacher forcing from the trajectory: step i's history text is its recorded action."""
    actions = traj.actions
    return lambda spec: (lambda i: actions[i] if i < len(actions) else None)


def replay_run_config(agent: AgentConfig, traj: Trajectory, *, episodes: int = 1,
                      vm_seconds: float = 0.0, memory_budget: int = UNLIMITED_BYTES,
                      wait_s: float = STALL_TIMEOUT_S) -> RunConfig:
    """A run over ``traj``: one step per recorded screen but the last (the last screen is
    what the last action led to)."""
    first = traj.frames[0]
    return RunConfig(agent=agent, episodes=episodes, tasks=("replay",),
                     max_steps=max(1, len(traj.frames) - 1), screen=(first.width, first.height),
                     vm_seconds=vm_seconds, memory_budget=memory_budget, wait_s=wait_s)


async def run_replay(engine: Engine, config: RunConfig, traj: Trajectory, *, prefix: str,
                     sequential: bool = False,
                     on_event: Callable[[EpisodeEvent], None] | None = None) -> RunResult:
    """``config.episodes`` teacher-forced episodes of ``traj``, concurrently or back to back."""
    return await run_agents(
        engine, config, None, specs=replay_specs(traj, config.episodes, prefix),
        make_env=lambda spec: ReplayEnv(traj, vm_seconds=config.vm_seconds),
        teacher=replay_teacher(traj), sequential=sequential, on_event=on_event)
