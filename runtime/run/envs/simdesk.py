"""``kvagent run --env simdesk``: a fresh simulated desktop per episode, on sampled task
instances (``--task KIND``, ``--seeds eval|train|A-B``; default: every kind on the held-out
evaluation seeds) or the classic fixed tasks (``--seeds classic``); see
``runtime.run.instances``."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

from runtime.run.agents import RunConfig, simdesk_env, simdesk_specs
from runtime.run.envs.base import RunSetup
from runtime.run.instances import check_task, episode_tasks, parse_seeds
from vmenv.simdesk import all_kinds, default_tasks, task_kinds
from vmenv.simdesk.kinds import SELECTORS


def _task(text: str) -> str:
    try:
        return check_task(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class SimDeskRunEnv:
    name: ClassVar[str] = "simdesk"
    options: ClassVar[dict[str, str]] = {"task": "--task", "seeds": "--seeds"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--task", type=_task, default=None, metavar="KIND[,KIND]|KIND@SEED",
                       help=f"the kind of every episode ({', '.join(task_kinds())}; opt-in: "
                            f"{', '.join(k for k in all_kinds() if k not in task_kinds())}), "
                            f"kinds separated by commas (taken in turn; look-back names "
                            f"{', '.join(SELECTORS['look-back'])}; dense names every dense-*), "
                            f"or one instance KIND@SEED "
                            f"(default: episode i gets kind i mod {len(task_kinds())} of "
                            f"{', '.join(task_kinds())})")
        p.add_argument("--seeds", default=None, metavar="eval|train|A-B|classic",
                       help="episode i runs the i-th seed: eval (default: held-out seeds no "
                            "training set uses), train, a range A-B (cycled), or classic: the "
                            f"fixed tasks ({', '.join(default_tasks())}) instead of sampled "
                            "instances")

    def check(self, args: argparse.Namespace) -> str | None:
        try:
            _tasks(args, args.episodes)
        except ValueError as exc:
            return str(exc)
        return None

    def setup(self, args: argparse.Namespace, run: dict[str, Any]) -> RunSetup:
        config = RunConfig(**run, tasks=_tasks(args, run["episodes"]))
        return RunSetup(config, simdesk_specs(config), simdesk_env(config), None, "simdesk")


def _tasks(args: argparse.Namespace, episodes: int) -> tuple[str, ...]:
    """Each episode's task name from ``--task`` / ``--seeds`` (ValueError naming them)."""
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    return episode_tasks(episodes, seeds, args.task)
