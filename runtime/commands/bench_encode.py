"""``kvagent bench encode`` (``kvagent bench-encode``): the critical path's fixed costs side by
side in one run — the vision encoder with flash attention off vs on, the prefill a retained
screenshot costs a prefetch (so the VM time overlap needs), and encoding a screenshot ahead
while the prefetch finishes (``runtime.bench.encoder``). Here: the options and their checks; the
run and its report: ``runtime.bench.run_encode``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench

HELP = ("vision-encoder seconds per screenshot with flash attention off vs on, prefill "
        "seconds per retained screenshot, and the critical path with encode-ahead off vs on")


def _sizes(text: str) -> list[tuple[int, int]]:
    from runtime.arg_parsers import parse_wxh

    try:
        return [parse_wxh(x, option="--sizes", low=(16, 16), high=(8192, 8192))
                for x in text.split(",") if x]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from cachepolicy.engine.records import default_threads
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import BENCH_MODEL

    add_model_arguments(p, BENCH_MODEL)
    p.add_argument("--sizes", type=_sizes,
                   default=[(960, 544), (1280, 720), (1920, 1080)],
                   help="screenshot sizes, WxH,WxH (default: 960x544,1280x720,1920x1080)")
    p.add_argument("--repeats", type=int, default=4, help="encodes per size and variant")
    p.add_argument("--steps", type=int, default=8,
                   help="steps of each encode-ahead episode (0: skip that part)")
    p.add_argument("--vm-seconds", type=float, default=0.3,
                   help="VM time per action in the encode-ahead episodes (shorter than the "
                        "prefetch, so screenshots arrive while it runs)")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--json", type=Path, dest="json_out")


def _check(args: argparse.Namespace) -> str | None:
    from runtime.arg_parsers import check_threads
    from runtime.engine_setup import check_model_choice

    if not 1 <= args.repeats <= 100 or not 0 <= args.steps <= 200 or not args.sizes:
        return "--repeats must be 1..100, --steps 0..200, --sizes not empty"
    if not 0 <= args.vm_seconds <= 600:
        return "--vm-seconds must be 0..600"
    try:
        check_model_choice(args.model, args.mmproj)
        check_threads(args.threads)
    except ValueError as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"kvagent bench-encode: error: {problem}", file=sys.stderr)
        return 2
    from runtime.bench import run_encode
    return run_encode.run(args)


BENCH = Bench("encode", HELP, add_arguments, run, alias="bench-encode")
