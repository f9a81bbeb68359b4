"""``kvagent bench kernels`` (``kvagent bench-kernels``): what the engine's exact kernels (the
default) cost against ``fast_kernels`` — prefill and decode tokens/s of both engines side by
side in one run, through the shipping ``Engine`` (``runtime.bench.kernels``), per model.
Here: the options, bounded as they are parsed; the run and its report:
``runtime.bench.run_kernels``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from runtime.bench.family import Bench

HELP = ("prefill and decode tokens/s with the engine's exact kernels vs fast_kernels, side by "
        "side per model, the prefill call rows each used, and whether exact prefill is bitwise "
        "the same run to run")

def _bounded(low: int, high: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value
    return parse


def _paths(text: str) -> list[Path]:
    paths = [Path(p) for p in text.split(",") if p.strip()]
    if not paths:
        raise argparse.ArgumentTypeError("expected GGUF file(s), comma separated")
    return paths


def add_arguments(p: argparse.ArgumentParser) -> None:
    from cachepolicy.engine.records import MAX_N_BATCH, MAX_THREADS
    from cachepolicy.engine.records import default_threads

    p.add_argument("--model", type=_paths, action="append", dest="models",
                   help="GGUF model(s), repeatable or comma separated (default: forge qwen35 M "
                        "q4_k_m, qwen35 M q8_0 and qwen35moe M q4_k_m)")
    p.add_argument("--prompt-tokens", type=_bounded(8, 65536), default=1024,
                   help="tokens prefilled per measurement (one Engine.prefill_tokens call)")
    p.add_argument("--decode-tokens", type=_bounded(1, 4096), default=32,
                   help="decode steps per measurement (Engine.generate)")
    p.add_argument("--repeats", type=_bounded(1, 100), default=3,
                   help="exact/fast pairs per model, alternated ABBA")
    p.add_argument("--n-batch", type=_bounded(2, MAX_N_BATCH), default=512,
                   help="the engines' configured n_batch (the exact engine may resolve fewer "
                        "rows per prefill call: K-quant mixture-of-experts models)")
    p.add_argument("--threads", type=_bounded(1, MAX_THREADS), default=default_threads())
    p.add_argument("--json", type=Path, dest="json_out")


def run(args: argparse.Namespace) -> int:
    from runtime.bench import run_kernels
    return run_kernels.run(args)  # every value was bounded as it was parsed


BENCH = Bench("kernels", HELP, add_arguments, run, alias="bench-kernels")
