"""The ``kvagent`` command line: one sub-command per module in ``runtime/commands``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from runtime.commands import (
    bench, bench_decode, bench_encode, bench_eval, bench_kernels, bench_peer,
    bench_replay_prefix, bench_serve, check_exact, demo, forge, run, serve, train,
)
from runtime.logs import configure_logging

COMMANDS = {"forge": forge, "check-exact": check_exact, "demo": demo, "bench": bench,
            "bench-decode": bench_decode, "bench-encode": bench_encode,
            "bench-eval": bench_eval,
            "bench-kernels": bench_kernels, "bench-peer": bench_peer,
            "bench-replay-prefix": bench_replay_prefix,
            "bench-serve": bench_serve, "run": run,
            "serve": serve, "train": train}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
