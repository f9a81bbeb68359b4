"""``kvagent bench replay-prefix`` (``kvagent bench-replay-prefix``): prefill tokens and seconds
to the first token at matched prefixes of growing length on a hybrid model — a full re-prefill,
an exact checkpoint at the prefix's end and tail replays at several budgets, side by side on one
engine, with each replay's next-token KL and top-1 against the exact first token
(``runtime.bench.replay_prefix``; the prompt: ``runtime.bench.agent_prefix``). Here: the options
and their checks; the run and its report: ``runtime.bench.run_replay_prefix``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench

HELP = ("prefill tokens and seconds to the first token at matched prefixes of growing length "
        "on a hybrid model: full re-prefill vs an exact checkpoint vs tail replay at each "
        "budget (from the zero recurrent state), with next-token KL and top-1 of each replay")

def add_arguments(p: argparse.ArgumentParser) -> None:
    from cachepolicy.engine.records import default_threads
    from runtime.bench.agent_prefix import SUFFIXES, TEXT_SUFFIX_ROWS
    from runtime.bench.replay_prefix import DEFAULT_BUDGETS
    from runtime.bench.run_replay_prefix import DEFAULT_MAX_CONTEXT, FIRST_LENGTH
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--lengths", default=None, metavar="L,L,…",
                   help=f"matched prefix lengths in rows (tokens and image rows): 256, 1K, "
                        f"and max (the longest the context holds with the suffix); default: "
                        f"{FIRST_LENGTH}, 512, 1K, … up to the model's training context "
                        f"(n_ctx_train, at most {DEFAULT_MAX_CONTEXT // 1024}K), and max")
    p.add_argument("--budgets", default=",".join(DEFAULT_BUDGETS), metavar="R,R,…",
                   help="tail-replay budgets, tokens (64) or shares of the prefix (10%%), "
                        "each an arm replaying from the zero recurrent state (default "
                        "%(default)s)")
    p.add_argument("--suffix", choices=SUFFIXES, default="screenshot",
                   help=f"what follows the prefix: the next screenshot's turn (the agent's "
                        f"next step) or {TEXT_SUFFIX_ROWS} rows of text; then the generation "
                        f"prompt")
    p.add_argument("--repeats", type=int, default=5,
                   help="measurements of every arm per length (orders alternate; medians)")
    p.add_argument("--screen", default="640x360",
                   help="simdesk screen WxH of the episode's screenshots (min 320x240)")
    p.add_argument("--threads", type=int, default=default_threads(),
                   help="engine threads (default: $KVAGENT_THREADS, else every core)")
    p.add_argument("--json", type=Path, dest="json_out", help="write the report here")


def parse_lengths(text: str) -> list[int | None]:
    """``256,1K,max`` → [256, 1024, None] (None: the longest the context holds)."""
    out: list[int | None] = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        if item.lower() == "max":
            out.append(None)
            continue
        scale = 1024 if item[-1] in "kK" else 1
        try:
            value = int(item[:-1] if scale > 1 else item) * scale
        except ValueError:
            raise ValueError(f"--lengths: {item!r} is not a length (256, 1K or max)") from None
        if value < 2:
            raise ValueError(f"--lengths: {item!r}: a prefix has at least 2 rows")
        out.append(value)
    if not out:
        raise ValueError("--lengths: no length given")
    return out


def _check(args: argparse.Namespace) -> str | None:
    """Everything that can be checked before loading; the problem, or None."""
    from cachepolicy.tail import ReplayBudget
    from runtime.arg_parsers import check_threads, parse_wxh
    from runtime.engine_setup import check_model_choice

    try:
        check_model_choice(args.model, args.mmproj)
        check_threads(args.threads)
        args.screen_wh = parse_wxh(args.screen, option="--screen", low=(320, 240),
                                   high=(4096, 4096))
        args.length_list = parse_lengths(args.lengths) if args.lengths is not None else None
        args.budget_list = [ReplayBudget.parse(b, "zero") for b in args.budgets.split(",")
                            if b.strip()]
    except ValueError as exc:
        return str(exc)
    if not args.budget_list:
        return "--budgets: no budget given"
    if len({str(b) for b in args.budget_list}) != len(args.budget_list):
        return "--budgets: a budget is given twice"
    if not 1 <= args.repeats <= 50:
        return "--repeats must be 1..50"
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"kvagent bench-replay-prefix: error: {problem}", file=sys.stderr)
        return 2
    from runtime.bench import run_replay_prefix
    return run_replay_prefix.run(args)


BENCH = Bench("replay-prefix", HELP, add_arguments, run, alias="bench-replay-prefix")
