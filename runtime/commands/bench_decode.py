"""``kvagent bench-decode``: does batching several episodes' decode steps into one
llama_decode pay, and what does it cost in exactness?  Measured side by side in one run."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HELP = "measure decode throughput of N sequences: one call each vs one multi-row batch"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="GGUF model (default: forge the qwen35 M model)")
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--context", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--tokens", type=int, default=32, help="decode steps measured")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, dest="json_out")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from cachepolicy.engine import Engine
    from runtime.commands.engine_sizing import engine_config

    if min(args.sequences, args.context, args.tokens) < 2:
        print("kvagent bench-decode: error: --sequences, --context and --tokens must be >= 2",
              file=sys.stderr)
        return 2
    model = args.model
    if model is None:
        from cachepolicy.forge import forge_cached
        model = forge_cached("qwen35", "M").model_path
    n = args.sequences
    per_seq = args.context + args.tokens + 64
    try:
        config = engine_config(model, what="--sequences / --context / --tokens / --threads",
                               n_ctx_per_seq=per_seq, n_seq_max=n, n_batch=min(512, per_seq),
                               n_threads=args.threads)
    except ValueError as exc:
        print(f"kvagent bench-decode: error: {exc}", file=sys.stderr)
        return 2
    with Engine(model, None, config) as e:
        prompt = (list(e.tokenize("the agent looks at the screen and clicks ")) * 400)[: args.context]
        firsts = []
        for s in range(n):
            logits = e.prefill_tokens(s, prompt)
            firsts.append(int(np.argmax(logits)))
        base = [e.checkpoint(s) for s in range(n)]
        # one call per sequence (what kvagent does)
        t0 = time.perf_counter()
        single: list[list[np.ndarray]] = [[] for _ in range(n)]
        toks = list(firsts)
        for _ in range(args.tokens):
            for s in range(n):
                out = e.decode_token(s, toks[s])
                single[s].append(out)
                toks[s] = int(np.argmax(out))
        t_single = time.perf_counter() - t0
        for s in range(n):
            e.restore(s, base[s])
        # one multi-row batch per step
        t0 = time.perf_counter()
        batched: list[list[np.ndarray]] = [[] for _ in range(n)]
        toks = list(firsts)
        for _ in range(args.tokens):
            outs = e.decode_many(list(enumerate(toks)))
            for s, out in enumerate(outs):
                batched[s].append(out)
                toks[s] = int(np.argmax(out))
        t_batched = time.perf_counter() - t0
        diff = max(float(np.max(np.abs(a - b))) for s in range(n)
                   for a, b in zip(single[s], batched[s]))
        same_tokens = all(int(np.argmax(a)) == int(np.argmax(b)) for s in range(n)
                          for a, b in zip(single[s], batched[s]))
        report = {
            "model": str(model), "sequences": n, "context": args.context, "tokens": args.tokens,
            "threads": args.threads,
            "single_tokens_per_s": n * args.tokens / t_single,
            "batched_tokens_per_s": n * args.tokens / t_batched,
            "speedup": t_single / t_batched,
            "bitwise_equal": diff == 0.0, "max_abs_diff": diff,
            "greedy_tokens_equal": same_tokens,
        }
    print(f"{n} sequences x {args.tokens} decode steps at {args.context} context tokens")
    print(f"one llama_decode per sequence: {report['single_tokens_per_s']:.1f} tokens/s")
    print(f"one multi-row batch per step:  {report['batched_tokens_per_s']:.1f} tokens/s "
          f"(speedup {report['speedup']:.2f}x)")
    print(f"batched logits bitwise equal to single-row: {str(diff == 0.0).lower()} "
          f"(max |diff| {diff:.3g}); greedy tokens equal: {str(same_tokens).lower()}")
    if args.json_out is not None:
        from vmenv.trajectory_writer import write_durably

        write_durably(args.json_out, json.dumps(report, indent=1).encode())
    return 0
