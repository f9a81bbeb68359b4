"""The ``kvagent`` command line: one sub-command per module in ``runtime/commands``, and the
benches as one family, ``kvagent bench [NAME]`` (``runtime/commands/bench.py``: ``FAMILY``;
each bench's older spelling, ``kvagent bench-peer``, still runs it)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runtime.bench.family import FamilyParser
from runtime.commands import check_exact, check_model, demo, forge, run, serve, train
from runtime.commands.bench import FAMILY
from runtime.logs import configure_logging

#: the commands other than the benches, in --help's order (the benches follow demo)
COMMANDS = {"forge": forge, "check-exact": check_exact, "check-model": check_model,
            "demo": demo, "run": run,
            "serve": serve, "train": train}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command`` (the sub-command ``main`` is about to run)
    only that command's flags are built, the other commands' left empty: ``kvagent
    train``'s import JAX (~150 MiB resident and ~1.7 s), which a ``kvagent serve`` then
    carried for its whole life."""
    parser = FamilyParser(
        prog="kvagent",
        description="Exact, bounded KV/recurrent caching for screenshot-driven GUI agents "
                    "on llama.cpp.")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        # argparse %-formats a sub-command's help ("95% CI" would break --help)
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"),
                           description=module.HELP)
        if command is None or command == name:
            module.add_arguments(p)
        p.set_defaults(run=module.run)
        if name == "demo":
            FAMILY.add_to(sub)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The sub-command ``argv`` names (its first word that is not an option or
    ``--log-level``'s value); None with none, or when help comes first."""
    words = iter(argv)
    for word in words:
        if word == "--log-level":
            next(words, None)
        elif word in ("-h", "--help"):
            return None
        elif not word.startswith("-"):
            return word
    return None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(command_of(argv)).parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
