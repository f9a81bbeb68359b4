"""``kvagent bench-decode``: what batching several generations' decode steps into shared,
fixed-shape llama_decode calls buys (throughput), and what it costs (padding for a lone
generation) — while the tokens stay identical to each generation run alone.  All measured
side by side in one run, through ``Engine.generate`` (the path agents use)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cachepolicy.engine.records import default_threads

HELP = ("decode throughput of N concurrent generations (sharing padded decode calls) vs one "
        "at a time, whether their tokens are identical, and what padding costs a lone one")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import add_model_arguments
    from runtime.engine_setup import BENCH_MODEL

    add_model_arguments(p, BENCH_MODEL, vision=False)
    p.add_argument("--sequences", type=int, default=4)
    p.add_argument("--context", type=int, default=2048, help="prompt tokens per sequence")
    p.add_argument("--tokens", type=int, default=32, help="decode steps measured")
    p.add_argument("--rows", type=int, default=4,
                   help="decode lanes: rows of every decode call (the engine's decode_rows)")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--json", type=Path, dest="json_out")


def _config(model: Path, args: argparse.Namespace, rows: int) -> object:
    from runtime.engine_setup import engine_config

    per_seq = args.context + args.tokens + 64
    return engine_config(model, what="--sequences / --context / --tokens / --threads / --rows",
                         n_ctx_per_seq=per_seq, n_seq_max=args.sequences,
                         n_batch=min(512, per_seq), n_threads=args.threads, decode_rows=rows)


def _generations(model: Path, args: argparse.Namespace, rows: int, *,
                 together: bool) -> tuple[dict[int, list[int]], float, dict]:
    """Every sequence generates ``args.tokens`` tokens through ``Engine.generate`` (the path
    agents use), all at once (``together``: concurrent generations share decode calls) or
    one after another.  Returns the tokens, the wall seconds and the batcher's counters."""
    import anyio
    import anyio.to_thread

    from cachepolicy.engine.sampling import SamplingParams
    from runtime.engine_setup import ModelFiles, load_engine

    n = args.sequences
    config = _config(model, args, rows)
    params = SamplingParams(temperature=1.0, seed=11)  # sampled: any logit change shows
    with load_engine(ModelFiles(model, None), config, vision=False) as e:
        base = list(e.tokenize("the agent looks at the screen and clicks "))
        logits = {}
        for s in range(n):  # a different prompt per sequence (other tokens and lengths)
            prompt = ([s + 3] + base * 400)[: args.context - 7 * s]
            logits[s] = e.prefill_tokens(s, prompt)
        out: dict[int, list[int]] = {}
        before = e.batcher.stats()

        def one(s: int) -> None:
            out[s] = e.generate(s, logits[s], args.tokens, params, stop_at_eog=False)

        async def main() -> float:
            t0 = time.perf_counter()
            if together:
                async with anyio.create_task_group() as tg:
                    for s in range(n):
                        tg.start_soon(anyio.to_thread.run_sync, one, s)
            else:
                for s in range(n):
                    await anyio.to_thread.run_sync(one, s)
            return time.perf_counter() - t0

        wall = anyio.run(main)
        stats = (e.batcher.stats() - before).as_dict()
    return out, wall, stats


def run(args: argparse.Namespace) -> int:
    from runtime.arg_parsers import check_decode_rows, check_threads
    from runtime.commands.options import model_files
    from runtime.engine_setup import BENCH_MODEL

    if min(args.sequences, args.context, args.tokens) < 2 or args.sequences > 16:
        print("kvagent bench-decode: error: --sequences (2..16), --context and --tokens "
              "must be >= 2", file=sys.stderr)
        return 2
    try:
        check_threads(args.threads)
        check_decode_rows(args.rows, option="--rows")
    except ValueError as exc:
        print(f"kvagent bench-decode: error: {exc}", file=sys.stderr)
        return 2
    model = model_files(args, BENCH_MODEL, vision=False).model
    n, d = args.sequences, args.rows
    try:
        _config(model, args, d)  # every size checked before anything loads
    except ValueError as exc:
        print(f"kvagent bench-decode: error: {exc}", file=sys.stderr)
        return 2
    runs = {}
    for name, rows, together in (("batched", d, True), ("one_at_a_time", d, False),
                                 ("unpadded_one_at_a_time", 1, False)):
        print(f"[{name}] {n} generations x {args.tokens} tokens, {rows} decode lane(s)",
              file=sys.stderr, flush=True)
        runs[name] = _generations(model, args, rows, together=together)
    tokens = n * (args.tokens - 1)  # the first token comes from the prompt's logits
    b, o, u = (runs[k] for k in ("batched", "one_at_a_time", "unpadded_one_at_a_time"))
    report = {
        "model": str(model), "sequences": n, "context": args.context, "tokens": args.tokens,
        "threads": args.threads, "decode_rows": d,
        "batched_tokens_per_s": tokens / b[1], "one_at_a_time_tokens_per_s": tokens / o[1],
        "unpadded_tokens_per_s": tokens / u[1],
        "speedup": o[1] / b[1], "padding_cost": o[1] / u[1],
        "identical_to_one_at_a_time": b[0] == o[0],
        "decode_calls": {k: v[2] for k, v in runs.items()},
    }
    print(f"{n} generations x {args.tokens} tokens at ~{args.context} context tokens, "
          f"{d} decode lanes")
    print(f"together (batched):  {report['batched_tokens_per_s']:.1f} tokens/s "
          f"({b[2]['rows_per_call']:.2f} rows per call)")
    print(f"one at a time:       {report['one_at_a_time_tokens_per_s']:.1f} tokens/s "
          f"(speedup of batching {report['speedup']:.2f}x)")
    print(f"unpadded (1 lane):   {report['unpadded_tokens_per_s']:.1f} tokens/s "
          f"(padding costs a lone generation {report['padding_cost']:.2f}x)")
    print(f"batched tokens identical to one at a time: "
          f"{str(report['identical_to_one_at_a_time']).lower()}")
    if args.json_out is not None:
        from vmenv.trajectory_writer import write_durably
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
    return 0 if report["identical_to_one_at_a_time"] else 1
