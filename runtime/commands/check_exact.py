"""``kvagent check-exact``: the exactness oracle on any GGUF model (+ optional mmproj)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cachepolicy.engine.records import default_threads
from cachepolicy.errors import KvagentCacheError

HELP = ("check that checkpoint / restore / truncate reproduce a from-scratch prefill bitwise "
        "on a model, and that unsafe edits are refused")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import add_gpu_argument, add_model_arguments
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL, vision=False)
    p.add_argument("--mmproj", type=Path, help="vision projector GGUF (adds the image checks)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of lines")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--fast-kernels", action="store_true",
                   help="load the model as --fast-kernels engines do (repacked quantized weights: "
                        "faster, but their kernels depend on a batch's row count)")
    add_gpu_argument(p)  # the checks then run on the GPU's kernels: they report on those


def _rows(rows: list[int]) -> str:
    """[1, 2, 3, 5] -> '1-3, 5'."""
    spans: list[list[int]] = []
    for r in rows:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def run(args: argparse.Namespace) -> int:
    from cachepolicy.oracle.checks import run_checks, short_piece_rows
    from cachepolicy.oracle.sweeps import PROBE_ROWS, remainder_tokens
    from runtime.commands.options import gpu_layers
    from runtime.engine_setup import DEMO_MODEL, engine_config, load_engine, resolve_model

    try:  # the image checks run when there is a projector: the default's, or --mmproj
        files = resolve_model(args.model, args.mmproj, default=DEMO_MODEL,
                              vision=args.model is None or args.mmproj is not None)
        args.model = files.model
        # the chunk-remainder sweep prefills 16 pieces longer than n_batch into one sequence
        config = engine_config(
            args.model, what="--n-batch / --threads",
            n_ctx_per_seq=max(4096, remainder_tokens(args.n_batch) + 256), n_seq_max=2,
            n_batch=args.n_batch, n_threads=args.threads, fast_kernels=args.fast_kernels,
            n_gpu_layers=gpu_layers(args))
    except ValueError as exc:
        print(f"kvagent check-exact: error: {exc}", file=sys.stderr)
        return 2
    try:
        with load_engine(files, config, vision=False) as engine:
            if not args.json:
                print(f"model: {args.model} ({engine.kind.value}, {engine.n_params / 1e6:.2f}M "
                      f"params{', vision' if engine.has_vision else ''}, "
                      f"{'fast' if args.fast_kernels else 'exact'} kernels, prefill calls of "
                      f"up to {engine.config.n_batch} rows), backend "
                      f"{engine.offload.describe()}")
                if engine.offload.note:
                    print(f"note: {engine.offload.note}")
            results = run_checks(engine)
            short = short_piece_rows(engine)
    except KvagentCacheError as exc:
        print(f"kvagent check-exact: error: {exc}")
        return 2
    ok = all(r.bitwise for r in results)
    classes, shape = engine.row_classes, engine.decode_shape
    if args.json:
        print(json.dumps({"checks": [r.as_dict() for r in results], "bitwise": ok,
                          "backend": engine.offload.as_dict(),
                          "fast_kernels": args.fast_kernels,
                          "prefill_rows": engine.config.n_batch,
                          "short_pieces_not_one_call": short,
                          "row_classes": classes.as_dict(),
                          "decode_shape": {"mode": shape.mode.value, "lanes": shape.lanes,
                                           "lane_rows": list(shape.lane_rows),
                                           "min_run": shape.min_run,
                                           "max_run": shape.max_run}}))
    else:
        width = max(len(r.name) for r in results)
        for r in results:
            print(f"{r.name:<{width}}  max|diff| {r.max_abs_diff:.3g}  "
                  f"bitwise: {str(r.bitwise).lower()}")
        details = {r.name: r.detail for r in results}
        print(f"note: row classes on this model and {engine.offload.backend}: "
              f"{classes.describe()}; decoding in {shape.describe()}")
        for name in ("decode_runs", "speculative_generation"):
            if name in details:
                print(f"note: {name}: {details[name]}")
        if short:
            print(f"note: pieces of {_rows(short)} rows (of 1-{PROBE_ROWS} tried) differ from a "
                  f"one-call prefill on this model: they are exact only against the same "
                  f"piece boundaries")
        print(f"bitwise: {str(ok).lower()}")
    return 0 if ok else 1
