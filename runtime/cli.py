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


def build_parser() -> argparse.ArgumentParser:
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
        module.add_arguments(p)
        p.set_defaults(run=module.run)
        if name == "demo":
            FAMILY.add_to(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
