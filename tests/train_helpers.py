"""Shared by the training-data tests: an env whose hand is the expert's, and a runtime run
that records what its sequence holds at every step."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs

from cachepolicy.engine import Engine
from cachepolicy.engine.checkpoint import Run
from runtime.config import AgentConfig
from runtime.run.agents import EpisodeEvent, RunConfig, run_agents, simdesk_specs
from runtime.train.prompts import history_text
from vmenv.actions import Action
from vmenv.base import Observation, StepOutcome
from vmenv.simdesk import DemoStep, SimDesk, SimDeskConfig, Task

SCREEN = (640, 360)


class ExpertHand:
    """A real simulated desktop on which every step executes the expert's action, whatever
    the agent decided: the episode follows ``demo`` (checked state by state), so its
    screenshots are the demonstration's and the checker passes at the end."""

    def __init__(self, task: Task, demo: Sequence[DemoStep]) -> None:
        self.desk = SimDesk(SimDeskConfig(width=SCREEN[0], height=SCREEN[1],
                                          action_latency_s=0.0), tasks={task.name: task})
        self.demo = demo

    async def reset(self, task: str | None = None) -> Observation:
        obs = await self.desk.reset(task)
        assert self.desk.state == self.demo[0].state
        return obs

    async def step(self, action: Action) -> StepOutcome:
        i = self.desk.state.step
        out = await self.desk.step(self.demo[i].action)
        if i + 1 < len(self.demo):
            assert self.desk.state == self.demo[i + 1].state
        return out

    async def close(self) -> None:
        await self.desk.close()


@attrs.frozen
class RecordedRun:
    """What the runtime's sequence held at each step (its history after the step's prefill,
    which decoding leaves alone: generation runs in a decode lane) and how the run ended."""

    histories: tuple[tuple[Run, ...], ...]
    status: str
    reward: float


def run_with_expert(engine: Engine, agent: AgentConfig, task: Task,
                    demo: Sequence[DemoStep]) -> RecordedRun:
    """One episode of ``task`` through ``run_agents`` (the loop ``kvagent run`` ships), the
    expert's actions forced into the history and executed by the env."""
    histories: list[tuple[Run, ...]] = []

    def on_event(e: EpisodeEvent) -> None:
        if e.kind != "step":
            return
        held = [s for s in engine.memory().seq_state_bytes]
        assert len(held) == 1, f"one episode, one sequence: {held}"
        histories.append(engine.seq_info(held[0]).history)

    def teacher(i: int) -> str | None:
        return history_text(agent, demo[i].action, SCREEN) if i < len(demo) else None

    config = RunConfig(agent=agent, episodes=1, tasks=(task.name,), max_steps=len(demo),
                       screen=SCREEN, vm_seconds=0.0)
    specs = simdesk_specs(config)
    result = anyio.run(lambda: run_agents(
        engine, config, None, specs=specs, make_env=lambda spec: ExpertHand(task, demo),
        teacher=lambda spec: teacher, on_event=on_event))
    (episode,) = result.episodes
    return RecordedRun(tuple(histories), episode.status, episode.reward)
