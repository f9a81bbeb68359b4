"""What an environment of ``kvagent run`` provides (see ``runtime.run.envs``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Protocol

import attrs

from runtime.run.agents import EpisodeSpec, RunConfig
from runtime.session import Teacher
from vmenv.base import Env


@attrs.frozen
class RunSetup:
    """A run's episodes: the config (screen and steps may be the env's), one spec per
    episode, a fresh env per episode, teacher forcing per episode (None: none) and the
    result layout's domain directory."""

    config: RunConfig
    specs: tuple[EpisodeSpec, ...]
    make_env: Callable[[EpisodeSpec], Env]
    teacher: Callable[[EpisodeSpec], Teacher | None] | None
    domain: str


class RunEnv(Protocol):
    #: ``--env`` value
    name: ClassVar[str]
    #: this env's own options, ``dest`` → flag (each defaults to None)
    options: ClassVar[Mapping[str, str]]

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        """Add this env's options (every default None, so ``foreign_options`` can tell)."""

    def check(self, args: argparse.Namespace) -> str | None:
        """A message if this env's options are unusable (nothing loaded yet)."""

    def setup(self, args: argparse.Namespace, run: dict[str, Any]) -> RunSetup:
        """The run's episodes; ``run`` holds the ``RunConfig`` fields the command resolved
        (agent, episodes, max_steps, screen, vm_seconds, memory_budget, env_timeout_s,
        stop_on_success).
        Raises ValueError (or the env's own errors) for input it cannot run."""
