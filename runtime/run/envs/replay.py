"""``kvagent run --env replay --trajectory DIR``: every episode replays one recorded
trajectory, its recorded actions entering the history (teacher forcing)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, ClassVar

import attrs

from runtime.run.agents import RunConfig
from runtime.run.envs.base import RunSetup
from runtime.run.replay import replay_specs, replay_teacher
from vmenv.replay import ReplayEnv
from vmenv.trajectory import load_trajectory


class ReplayRunEnv:
    name: ClassVar[str] = "replay"
    options: ClassVar[dict[str, str]] = {"trajectory": "--trajectory"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--trajectory", type=Path, default=None,
                       help="trajectory directory for --env replay (its recorded actions "
                            "enter the history: teacher forcing)")

    def check(self, args: argparse.Namespace) -> str | None:
        if args.trajectory is None:
            return "--env replay needs --trajectory DIR"
        return None

    def setup(self, args: argparse.Namespace, run: dict[str, Any]) -> RunSetup:
        traj = load_trajectory(args.trajectory)
        if len(traj.frames) < 2:
            raise ValueError(f"{args.trajectory}: a replay needs at least two screenshots")
        first = traj.frames[0]
        config = RunConfig(**{**run, "screen": (first.width, first.height),
                              "tasks": ("replay",),
                              "max_steps": min(run["max_steps"], len(traj.frames) - 1)})
        name = args.trajectory.resolve().name
        specs = tuple(attrs.evolve(s, episode_id=f"ep{s.index}", task_id=f"{name}-ep{s.index}")
                      for s in replay_specs(traj, config.episodes, "ep"))
        return RunSetup(config, specs,
                        lambda spec: ReplayEnv(traj, vm_seconds=config.vm_seconds),
                        replay_teacher(traj), "replay")
