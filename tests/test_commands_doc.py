"""docs/commands.md is written from the command line's parsers (``runtime.cli_reference``):
it names every command and flag ``--help`` does, and is not stale."""

from __future__ import annotations

import argparse

from runtime.cli import build_parser
from runtime.cli_reference import DOC, render


def test_the_commands_page_is_not_stale() -> None:
    assert DOC.read_text() == render(), (
        "docs/commands.md is stale: run `python -m runtime.cli_reference`")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {name: sub for a in parser._actions  # noqa: SLF001
            if isinstance(a, argparse._SubParsersAction)  # noqa: SLF001
            for name, sub in a.choices.items()}


def test_every_command_and_flag_is_on_the_page() -> None:
    """An independent walk of the parsers: each command's heading and each of its flags
    appear on the page (the renderer could drop one; this count would not)."""
    text = DOC.read_text()
    commands = _subparsers(build_parser())
    assert len(commands) >= 14
    for name, sub in commands.items():
        assert f"`kvagent {name}`" in text, name
        for action in sub._actions:  # noqa: SLF001
            for flag in action.option_strings:
                if flag not in ("-h", "--help") and action.help != argparse.SUPPRESS:
                    assert f"`{flag}`" in text, f"kvagent {name} {flag}"


def test_a_machine_dependent_default_is_named_not_printed() -> None:
    """The page is the same on every machine: --threads' default is the machine's cores —
    and a fixed default that happens to equal this machine's cores prints as itself."""
    text = DOC.read_text()
    assert "every core (`$KVAGENT_THREADS`)" in text
    train = text[text.index("### `kvagent train`"):]
    assert "| `--threads` THREADS | `2` |" in train
