"""``kvagent bench kernels`` (``kvagent bench-kernels``): what the engine's exact kernels (the
default) cost against ``fast_kernels`` — prefill and decode tokens/s of both engines side by
side in one run, through the shipping ``Engine``, per model (the measurement:
``runtime.bench.kernels``; the arguments: ``runtime/commands/bench_kernels.py``).

Exit status 0 when exact prefill was bitwise the same run to run on every model, 1 when not,
2 for a model that is missing or does not load.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from cachepolicy.errors import ModelLoadError
from runtime.bench.kernels import compare_kernels, prompt_for
from runtime.bench.text_grid import grid
from runtime.engine_setup import DefaultModel, ModelFiles, engine_config, load_engine, resolve_model
from vmenv.trajectory_writer import write_durably

__all__ = ["DEFAULT_MODELS", "run"]


#: (arch, size, quant) forged when no --model is given: a dense K-quant (repacked when
#: fast), a dense Q8_0 (never repacked), a K-quant mixture of experts (prefill rows capped)
DEFAULT_MODELS = (("qwen35", "M", "q4_k_m"), ("qwen35", "M", "q8_0"),
                  ("qwen35moe", "M", "q4_k_m"))


def _models(args: argparse.Namespace) -> list[tuple[str, Path]] | str:
    """(label, GGUF) per model to measure, or an error message."""
    if args.models:
        paths = [p for group in args.models for p in group]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            return f"model file not found: {', '.join(missing)}"
        # labelled by directory and name: forged models are all called model.gguf
        return [(f"{p.parent.name}/{p.name}" if p.parent.name else p.name, p) for p in paths]

    out = []
    for arch, size, quant in DEFAULT_MODELS:
        print(f"forging (or reusing) {arch} {size} {quant}", file=sys.stderr, flush=True)
        default = DefaultModel(arch, size, vision=False, quant=quant)
        out.append((f"{arch} {size} {quant}",
                    resolve_model(None, None, default=default, vision=False).model))
    return out


def _configs(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The exact and fast engines' configs (every size checked before anything loads)."""
    per_seq = max(args.n_batch, args.prompt_tokens + args.decode_tokens + 64)
    exact = engine_config(model, what="--prompt-tokens / --decode-tokens / --n-batch",
                          n_ctx_per_seq=per_seq, n_seq_max=1, n_batch=args.n_batch,
                          n_threads=args.threads, fast_kernels=False)
    return {"exact": exact, "fast": attrs.evolve(exact, fast_kernels=True)}


def run(args: argparse.Namespace) -> int:
    models = _models(args)
    if isinstance(models, str):
        print(f"kvagent bench-kernels: error: {models}", file=sys.stderr)
        return 2
    try:
        configs = [_configs(path, args) for _, path in models]
    except ValueError as exc:
        print(f"kvagent bench-kernels: error: {exc}", file=sys.stderr)
        return 2
    results = []
    for (label, path), config in zip(models, configs, strict=True):
        def progress(line: str, label: str = label) -> None:
            print(f"[{label}] {line}", file=sys.stderr, flush=True)

        progress(f"loading the exact and fast engines ({args.threads} thread(s))")
        try:
            with ExitStack() as stack:
                engines = {v: stack.enter_context(load_engine(ModelFiles(path, None), c,
                                                              vision=False))
                           for v, c in config.items()}
                cmp = compare_kernels(engines, prompt_for(engines["exact"], args.prompt_tokens),
                                      args.decode_tokens, args.repeats, progress)
        except ModelLoadError as exc:
            print(f"kvagent bench-kernels: error: {exc}", file=sys.stderr)
            return 2
        results.append({"label": label, "model": str(path), **cmp.as_dict()})
    print(_table(results, args))
    ok = all(r["prefill_bitwise"]["exact"] for r in results)
    if args.json_out is not None:
        report = {"threads": args.threads, "prompt_tokens": args.prompt_tokens,
                  "decode_tokens": args.decode_tokens, "repeats": args.repeats,
                  "n_batch": args.n_batch, "order": "ABBA pairs after one untimed warm-up each",
                  "clocks": {"cpu": "time.process_time: CPU seconds of the process, all threads",
                             "wall": "time.perf_counter: wall seconds"},
                  "exact_prefill_bitwise": ok, "models": results}
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0 if ok else 1


def _table(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    head = ("model", "clock", "rows exact/fast", "prefill tok/s exact", "fast", "fast/exact",
            "decode tok/s exact", "fast", "fast/exact", "exact bitwise run to run")
    rows = [head]
    for r in results:
        for clock in ("cpu", "wall"):
            s = r[clock]
            rows.append((r["label"], clock, f"{r['rows']['exact']}/{r['rows']['fast']}",
                         f"{s['prefill_tok_s']['exact']:.1f}", f"{s['prefill_tok_s']['fast']:.1f}",
                         f"{s['prefill_fast_over_exact']:.2f}x",
                         f"{s['decode_tok_s']['exact']:.1f}", f"{s['decode_tok_s']['fast']:.1f}",
                         f"{s['decode_fast_over_exact']:.2f}x",
                         "yes" if r["prefill_bitwise"]["exact"] else "NO"))
    lines = grid(rows).split("\n")
    lines.append(
        f"({args.prompt_tokens}-token prefill, {args.decode_tokens} decode steps, n_batch "
        f"{args.n_batch}, {args.threads} thread(s); medians of {args.repeats} ABBA pair(s), "
        f"ratios = median of per-pair ratios. cpu = time.process_time, CPU seconds of the "
        f"whole process (all threads: less noisy on a shared machine, but with --threads > 1 "
        f"it counts OpenMP workers' spinning too); wall = time.perf_counter)")
    return "\n".join(lines)
