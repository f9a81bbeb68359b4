"""``kvagent check-exact``: the exactness oracle on any GGUF model (+ optional mmproj)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from cachepolicy.errors import KvagentCacheError

HELP = ("check that checkpoint / restore / truncate reproduce a from-scratch prefill bitwise "
        "on a model, and that unsafe edits are refused")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, type=Path, help="GGUF model file")
    p.add_argument("--mmproj", type=Path, help="vision projector GGUF (adds the image checks)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n-batch", type=int, default=512)


def run(args: argparse.Namespace) -> int:
    from cachepolicy.engine import Engine
    from cachepolicy.oracle import run_checks
    from runtime.commands.engine_sizing import engine_config

    try:
        config = engine_config(args.model, what="--n-batch / --threads", n_ctx_per_seq=4096,
                               n_seq_max=2, n_batch=args.n_batch, n_threads=args.threads)
    except ValueError as exc:
        print(f"kvagent check-exact: error: {exc}", file=sys.stderr)
        return 2
    try:
        with Engine(args.model, args.mmproj, config) as engine:
            if not args.json:
                print(f"model: {args.model} ({engine.kind.value}, {engine.n_params / 1e6:.2f}M "
                      f"params{', vision' if engine.has_vision else ''})")
            results = run_checks(engine)
    except KvagentCacheError as exc:
        print(f"kvagent check-exact: error: {exc}")
        return 2
    ok = all(r.bitwise for r in results)
    if args.json:
        print(json.dumps({"checks": [r.as_dict() for r in results], "bitwise": ok}))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"{r.name:<{width}}  max|diff| {r.max_abs_diff:.3g}  "
                  f"bitwise: {str(r.bitwise).lower()}")
        print(f"bitwise: {str(ok).lower()}")
    return 0 if ok else 1
