"""``docs/commands.md``: every command's flags, written from the argparse parsers themselves,
so the reference cannot drift from ``--help`` (``tests/test_commands_doc.py`` fails when the
file is stale).  ``python -m runtime.cli_reference`` rewrites it; ``--check`` only compares.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from unittest import mock

from cachepolicy.engine.records import THREADS_ENV
from runtime.cli import build_parser

DOC = Path(__file__).resolve().parent.parent / "docs" / "commands.md"

HEADER = """# Commands

Every `kvagent` command and its flags, written from the command line's own parsers by
`python -m runtime.cli_reference` (a test fails when this file is stale). What each command
is for is in the [README](../README.md#commands); `kvagent COMMAND --help` says the same as
this page.
"""


#: ``$KVAGENT_THREADS`` while the page's parsers are built: a default equal to it came from
#: ``default_threads()`` (the machine's cores) and is named, not printed; a fixed default
#: (``kvagent train --threads 2``) prints as itself on a machine with 2 cores too
_MACHINE_THREADS = 251


def _cell(text: str) -> str:
    """Markdown-table-safe text: one line, pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _flag(action: argparse.Action) -> str:
    names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
    if action.nargs == 0:
        return names
    metavar = action.metavar or (action.dest.upper() if action.option_strings else "")
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    if action.choices is not None and action.metavar is None:
        metavar = "{" + ",".join(str(c) for c in action.choices) + "}"
    suffix = {"?": f" [{metavar}]", "*": f" [{metavar} ...]", "+": f" {metavar} [...]"}
    return names + suffix.get(action.nargs, f" {metavar}" if metavar else "")  # type: ignore[arg-type]


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS, False, [], ()):
        return ""
    if action.dest == "threads" and action.default == _MACHINE_THREADS:
        return "every core (`$KVAGENT_THREADS`)"  # the machine's, not the page's
    return f"`{action.default}`"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, list[str], argparse.ArgumentParser]]:
    """(name, aliases, parser) of each sub-command, in the order they were added."""
    out: list[tuple[str, list[str], argparse.ArgumentParser]] = []
    for action in parser._actions:  # noqa: SLF001  argparse keeps its sub-parsers here
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001
            seen: dict[int, tuple[str, list[str], argparse.ArgumentParser]] = {}
            for name, sub in action.choices.items():
                if id(sub) in seen:
                    seen[id(sub)][1].append(name)
                else:
                    seen[id(sub)] = (name, [], sub)
                    out.append(seen[id(sub)])
    return out


def _section(prog: str, aliases: list[str], parser: argparse.ArgumentParser,
             level: int) -> list[str]:
    lines = [f"{'#' * level} `{prog}`", ""]
    if aliases:
        lines += ["Also spelled " + ", ".join(f"`{a}`" for a in aliases) + ".", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    options = [a for a in parser._actions  # noqa: SLF001
               if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))  # noqa: SLF001
               and a.help != argparse.SUPPRESS]
    if options:
        lines += ["| flag | default | what it does |", "|---|---|---|"]
        formatter = parser._get_formatter()  # noqa: SLF001  expands %(default)s as --help does
        lines += [f"| {_cell(_flag(a))} | {_cell(_default(a))} | "
                  f"{_cell(formatter._expand_help(a) if a.help else '')} |"  # noqa: SLF001
                  for a in options]
        lines.append("")
    for name, sub_aliases, sub in _subcommands(parser):
        lines += _section(f"{prog} {name}", sub_aliases, sub, level + 1)
    return lines


def render(parser: argparse.ArgumentParser | None = None) -> str:
    """The whole page for ``parser`` (default: kvagent's, built with ``_MACHINE_THREADS``)."""
    if parser is None:
        with mock.patch.dict(os.environ, {THREADS_ENV: str(_MACHINE_THREADS)}):
            parser = build_parser()
    lines = [HEADER]
    lines += _section("kvagent", [], parser, 2)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true",
                      help="exit 1 if docs/commands.md is stale; write nothing")
    opts = args.parse_args(argv)
    text = render()
    if opts.check:
        stale = not DOC.is_file() or DOC.read_text() != text
        if stale:
            print(f"{DOC} is stale: run python -m runtime.cli_reference", file=sys.stderr)
        return int(stale)
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
