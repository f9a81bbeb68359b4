"""``kvagent run``'s env registry: every env's options on the command line, another env's
option refused, and an env added by one registration runs through the command."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar

import pytest

from runtime.cli import build_parser
from runtime.run import envs
from runtime.run.agents import RunConfig, simdesk_env, simdesk_specs
from runtime.run.envs.base import RunSetup


def _args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_each_env_brings_its_options_and_refuses_the_others() -> None:
    assert envs.names()[:2] == ("simdesk", "replay")
    assert envs.foreign_options(_args("--task", "click-ok")) is None
    assert envs.foreign_options(_args("--env", "replay", "--task", "click-ok")) == (
        "--task is only for --env simdesk")
    assert envs.foreign_options(_args("--trajectory", "x")) == (
        "--trajectory is only for --env replay")
    assert envs.get("replay").check(_args("--env", "replay")) == (
        "--env replay needs --trajectory DIR")
    with pytest.raises(envs.UnknownEnvError, match="known: simdesk, replay"):
        envs.get("nope")


class _OnlyClickOk:
    """A custom env: simdesk with every episode on click-ok and a run-wide label option."""

    name: ClassVar[str] = "test-click-ok"
    options: ClassVar[dict[str, str]] = {"label": "--label"}

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--label", default=None)

    def check(self, args: argparse.Namespace) -> str | None:
        return None if args.label != "bad" else "--label bad"

    def setup(self, args: argparse.Namespace, run: dict[str, Any]) -> RunSetup:
        config = RunConfig(**run, tasks=("click-ok",))
        return RunSetup(config, simdesk_specs(config), simdesk_env(config), None,
                        args.label or "custom")


def test_an_env_registered_once_runs_through_kvagent_run(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(envs, "ENVS", envs.ENVS.copy())  # registered for this test only
    envs.register(_OnlyClickOk())
    with pytest.raises(ValueError, match="registered already"):
        envs.register(_OnlyClickOk())
    out = tmp_path / "results"
    args = _args("--env", "test-click-ok", "--label", "mine", "--episodes", "1",
                 "--max-steps", "1", "--vm-seconds", "0", "--threads", "1",
                 "--result-dir", str(out))
    assert args.run(args) == 0
    (episode,) = [d for d in (out / "pyautogui" / "screenshot").glob("*/mine/*") if d.is_dir()]
    assert episode.name == "click-ok-ep0" and (episode / "result.txt").is_file()
    bad = _args("--env", "test-click-ok", "--label", "bad", "--result-dir", str(out))
    assert bad.run(bad) == 2
