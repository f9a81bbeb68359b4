"""``kvagent run --env simdesk``: a fresh simulated desktop per episode."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

from runtime.run.agents import RunConfig, simdesk_env, simdesk_specs
from runtime.run.envs.base import RunSetup
from vmenv.simdesk.tasks import default_tasks


class SimDeskRunEnv:
    name: ClassVar[str] = "simdesk"
    options: ClassVar[dict[str, str]] = {"task": "--task"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--task", choices=tuple(default_tasks()), default=None,
                       help="simdesk task of every episode (default: episode i gets task i "
                            f"mod {len(default_tasks())})")

    def check(self, args: argparse.Namespace) -> str | None:
        return None

    def setup(self, args: argparse.Namespace, run: dict[str, Any]) -> RunSetup:
        config = RunConfig(**run, **({"tasks": (args.task,)} if args.task else {}))
        return RunSetup(config, simdesk_specs(config), simdesk_env(config), None, "simdesk")
