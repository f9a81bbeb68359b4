"""``kvagent bench decode`` (``kvagent bench-decode``): the row classes the engine measured on
this model and CPU, what a decode call costs per class, what a lone generation pays in each
decode shape (against its one-row decode), and what several generations decoding at once gain
over one at a time — with the tokens identical wherever they must be. All measured side by side
in one run, through the engine's decode calls and ``Engine.generate`` (the path agents use).
Here: the options and their checks; the run and its report: ``runtime.bench.run_decode``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cachepolicy.engine.records import default_threads
from runtime.bench.family import Bench

HELP = ("the decode row classes of a model on this CPU, the cost of a call per class, what a "
        "lone generation pays in each decode shape, and N generations together vs one at a "
        "time")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import BENCH_MODEL
    from runtime.profiles import names

    add_model_arguments(p, BENCH_MODEL, vision=False)
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--context", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--tokens", type=int, default=32, help="decode steps measured")
    p.add_argument("--rows", type=int, default=4,
                   help="decode lanes: generations decoding at once (the engine's decode_rows)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds of the side-by-side measurements (orders alternate)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="the lone generation's sampling (0: greedy, as agents decode)")
    p.add_argument("--grammar", choices=names(), default=None,
                   help="constrain the lone generation to a profile's output grammar")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--json", type=Path, dest="json_out")


def run(args: argparse.Namespace) -> int:
    from runtime.arg_parsers import check_decode_rows, check_threads

    if (min(args.sequences, args.context, args.tokens) < 2 or args.sequences > 16
            or not 1 <= args.rounds <= 50):
        print("kvagent bench-decode: error: --sequences (2..16), --context and --tokens "
              "must be >= 2, --rounds 1..50", file=sys.stderr)
        return 2
    try:
        check_threads(args.threads)
        check_decode_rows(args.rows, option="--rows")
    except ValueError as exc:
        print(f"kvagent bench-decode: error: {exc}", file=sys.stderr)
        return 2
    from runtime.bench import run_decode
    return run_decode.run(args)


BENCH = Bench("decode", HELP, add_arguments, run, alias="bench-decode")
