"""``kvagent bench peer --llama-server PATH`` (``kvagent bench-peer``): the same OSWorld-style
workload against ``kvagent serve`` and against a user-supplied llama.cpp ``llama-server`` — the
same GGUF files, the same screenshots, prompts byte for byte the same layout — side by side in
paired rounds (the order alternates every round, each arm on a freshly started server).

* **single agent** — one client, K screenshots per request, a VM pause between steps:
  llama-server with OSWorld's Qwen3-VL layout (``evict``: the window slides through the
  prompt) and with its best bounded layout (``bounded``: one user message per history line
  and one for the window, a checkpoint at every user message: ``--ctx-checkpoints 32 -cms
  0``), against kvagent serve in terminal mode with OSWorld's layout (terminal-slot, the
  next request prefetched during the VM pause);
* **N concurrent clients** — OSWorld's layout, llama-server ``-np N`` against ``kvagent
  serve --max-episodes N``.

kvagent serve runs its exact default policy unless ``--kvagent-policy NAME[@budget|@option]``
names another (``kvagent serve --policy``'s spelling, checked as it checks it; a policy the
model cannot run is refused before any server starts); an approximate policy's steps are
counted twice — from the answers' ``kvagent.approximate`` and from the server's
``/metrics`` — and its table rows say so.  Without ``--model`` the workload picks the forged
model: ``qwen35-m`` (the hybrid qwen35 M, ``qwen3vl_merger`` projector) or ``llama-m`` (the
attention-only llama M, LLaVA's ``mlp`` projector).

Per arm: steps/s, the request round trip (the critical path as the agent sees it) p50 and
p95, the server's peak RSS, and what it prefilled and reused per step (the servers' own
counts).  Not part of the test suite (it needs the binary): docs/benchmarks.md says how to
build llama-server from the llama.cpp that llama-cpp-python vendors, and has one run's tables.
Here: the options and their checks; the run and its report: ``runtime.bench.run_peer``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench

HELP = ("the same OSWorld-style workload against kvagent serve and a llama-server binary "
        "(same GGUF, same prompts): steps/s, latency p50/p95, peak RSS, prefill and reuse")

PARTS = ("single", "concurrent")
#: ``--workload``: the forged model run when no ``--model`` is given (``run_peer.WORKLOADS``
#: maps each to its model; the first is the default)
WORKLOADS = ("qwen35-m", "llama-m")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import add_model_arguments, policy_spelling
    from runtime.engine_setup import BENCH_MODEL

    p.add_argument("--llama-server", type=Path, required=True, dest="llama_server",
                   help="the llama-server binary to compare with (see docs/benchmarks.md)")
    add_model_arguments(p, BENCH_MODEL)
    p.add_argument("--workload", choices=WORKLOADS, default=None,
                   help="without --model, the forged model both servers run: qwen35-m (the "
                        "hybrid qwen35 M, the default) or llama-m (the attention-only llama "
                        "M with LLaVA's mlp projector: 576 tokens a screenshot)")
    p.add_argument("--kvagent-policy", default=None, dest="kvagent_policy",
                   metavar="NAME[@BUDGET|@OPTION]", type=policy_spelling,
                   help="the cache policy of the kvagent serve it starts (kvagent serve "
                        "--policy's spelling, e.g. relocate, tail-replay@10%%); default: "
                        "serve's own, exact. An approximate policy's steps are counted and "
                        "its rows marked")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated of {PARTS}")
    p.add_argument("--steps", type=int, default=8, help="steps per client")
    p.add_argument("--screenshots", type=int, default=3, help="K: screenshots per request")
    p.add_argument("--screen", default="1056x608",
                   help="screenshot size WxH (1056x608: 627 tokens on the forged projector)")
    p.add_argument("--vm-seconds", type=float, default=3.0,
                   help="pause after each answer, where the VM executes the action")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    p.add_argument("--clients", type=int, default=4, help="N: concurrent clients")
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (orders alternate)")
    p.add_argument("--threads", type=int, default=1, help="threads of either server")
    p.add_argument("--decode-rows", type=int, default=None, dest="decode_rows",
                   help="kvagent serve's decode lanes (default: its own default, or N when "
                        "N clients exceed it); 1: every generation decodes alone in one-row "
                        "calls, the setting docs/benchmarks.md §4 measures best for a lone "
                        "agent on a small f16 model")
    p.add_argument("--ctx", type=int, default=8192, help="context tokens per client")
    p.add_argument("--json", type=Path, dest="json_out", help="write the report here")


def check(args: argparse.Namespace) -> tuple[list[str], tuple[int, int]]:
    """The parts and screen size the arguments ask for; ValueError naming the option."""
    from runtime.arg_parsers import check_decode_rows, check_threads, parse_wxh
    from runtime.bench.llama_server import check_binary
    from runtime.engine_setup import check_model_choice

    if (problem := check_binary(args.llama_server)) is not None:
        raise ValueError(f"--llama-server {problem}")
    parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    if not parts or set(parts) - set(PARTS):
        raise ValueError(f"--parts: choose from {', '.join(PARTS)}")
    for name, lo, hi in (("steps", 2, 200), ("screenshots", 1, 16), ("max_tokens", 1, 1024),
                         ("clients", 1, 16), ("rounds", 1, 20), ("ctx", 1024, 1 << 20)):
        if not lo <= getattr(args, name) <= hi:
            raise ValueError(f"--{name.replace('_', '-')} must be {lo}..{hi}")
    if not 0 <= args.vm_seconds <= 600:
        raise ValueError("--vm-seconds must be 0..600")
    check_model_choice(args.model, args.mmproj)
    if args.model is not None and args.workload is not None:
        raise ValueError("--workload chooses the forged model: give it or --model, not both")
    check_threads(args.threads)
    check_decode_rows(args.decode_rows)
    return parts, parse_wxh(args.screen, option="--screen", low=(16, 16), high=(8192, 8192))


def run(args: argparse.Namespace) -> int:
    try:
        parts, size = check(args)
    except ValueError as exc:
        print(f"kvagent bench-peer: error: {exc}", file=sys.stderr)
        return 2
    from runtime.bench import run_peer
    return run_peer.run(args, parts, size)


BENCH = Bench("peer", HELP, add_arguments, run, alias="bench-peer")
