"""``kvagent bench serve`` (``kvagent bench-serve``): what an OSWorld-style agent pays per step
through ``kvagent serve`` (the real server process, over real HTTP) against the same agent
in-process — measured side by side in one run, on one model.

Arms (all greedy, the same screenshots, a pause of ``--vm-seconds`` after each answer where
the VM would act):

* ``chat-terminal`` / ``chat-faithful`` — chat completions in the layout OSWorld's Qwen3-VL
  agent sends (``runtime.bench.chat_layout``: K screenshots, the oldest dropped as the window
  slides), against a server in that mode;
* ``chat-no-reuse`` — the same requests, each as a new conversation (a fresh
  ``X-Kvagent-Conversation``) on the faithful server: every step prefills its whole prompt,
  which is what a server without kvagent's reuse (llama-server on a hybrid model once the
  window slides) does;
* ``episode-remote`` / ``in-process`` — ``KvAgent(server=URL)`` on the terminal server and
  ``KvAgent`` in this process, both with the qwen3vl profile and K screenshots: the HTTP
  API's cost over the same agent with no network.

Per step: prefill / reused / critical-path prefill tokens (the server's counts), the server's
critical path and the client's round trip.  The summary leaves out step 1 (a cold start for
every arm) and prints ratios between arms.  Here: the options and their checks; the run and
its report: ``runtime.bench.run_serve``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench

HELP = ("per-step prefill, reuse and latency of an OSWorld-style agent through kvagent serve "
        "(terminal, faithful, no reuse, episode API) vs in-process, side by side")

ARMS = ("chat-terminal", "chat-faithful", "chat-no-reuse", "episode-remote", "in-process")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from cachepolicy.engine.records import default_threads
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated of {ARMS}")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--screenshots", type=int, default=3, help="K: screenshots per request")
    p.add_argument("--screen", default="640x480", help="screenshot size WxH")
    p.add_argument("--vm-seconds", type=float, default=0.5,
                   help="pause after each answer, where the VM executes the action")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens per answer")
    p.add_argument("--ctx", type=int, default=16384, help="context tokens per episode")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--json", type=Path, dest="json_out", help="write the report here")


def _check(args: argparse.Namespace) -> tuple[list[str], tuple[int, int]]:
    from runtime.arg_parsers import check_threads, parse_names, parse_wxh
    from runtime.engine_setup import check_model_choice

    arms = list(parse_names(args.arms, ARMS, option="--arms", what="arm(s)"))
    if not 2 <= args.steps <= 200:
        raise ValueError("--steps must be 2..200")
    if not 1 <= args.screenshots <= 16:
        raise ValueError("--screenshots must be 1..16")
    if not 0 <= args.vm_seconds <= 60:
        raise ValueError("--vm-seconds must be 0..60")
    if not 1 <= args.max_tokens <= 1024:
        raise ValueError("--max-tokens must be 1..1024")
    check_model_choice(args.model, args.mmproj)
    check_threads(args.threads)
    return arms, parse_wxh(args.screen, option="--screen", low=(16, 16), high=(8192, 8192))


def run(args: argparse.Namespace) -> int:
    try:
        arms, size = _check(args)
    except ValueError as exc:
        print(f"kvagent bench-serve: error: {exc}", file=sys.stderr)
        return 2
    from runtime.bench import run_serve
    return run_serve.run(args, arms, size)


BENCH = Bench("serve", HELP, add_arguments, run, alias="bench-serve")
