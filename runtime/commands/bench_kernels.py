"""``kvagent bench-kernels``: what the engine's exact kernels (the default) cost against
``fast_kernels`` — prefill and decode tokens/s of both engines side by side in one run,
through the shipping ``Engine`` (``runtime.bench.kernels``), per model."""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

HELP = ("prefill and decode tokens/s with the engine's exact kernels vs fast_kernels, side by "
        "side per model, the prefill call rows each used, and whether exact prefill is bitwise "
        "the same run to run")

#: (arch, size, quant) forged when no --model is given: a dense K-quant (repacked when
#: fast), a dense Q8_0 (never repacked), a K-quant mixture of experts (prefill rows capped)
DEFAULT_MODELS = (("qwen35", "M", "q4_k_m"), ("qwen35", "M", "q8_0"),
                  ("qwen35moe", "M", "q4_k_m"))


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


def _models(args: argparse.Namespace) -> list[tuple[str, Path]] | str:
    """(label, GGUF) per model to measure, or an error message."""
    if args.models:
        paths = [p for group in args.models for p in group]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            return f"model file not found: {', '.join(missing)}"
        # labelled by directory and name: forged models are all called model.gguf
        return [(f"{p.parent.name}/{p.name}" if p.parent.name else p.name, p) for p in paths]
    from runtime.engine_setup import DefaultModel, resolve_model

    out = []
    for arch, size, quant in DEFAULT_MODELS:
        print(f"forging (or reusing) {arch} {size} {quant}", file=sys.stderr, flush=True)
        default = DefaultModel(arch, size, vision=False, quant=quant)
        out.append((f"{arch} {size} {quant}",
                    resolve_model(None, None, default=default, vision=False).model))
    return out


def _configs(model: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The exact and fast engines' configs (every size checked before anything loads)."""
    import attrs

    from runtime.engine_setup import engine_config

    per_seq = max(args.n_batch, args.prompt_tokens + args.decode_tokens + 64)
    exact = engine_config(model, what="--prompt-tokens / --decode-tokens / --n-batch",
                          n_ctx_per_seq=per_seq, n_seq_max=1, n_batch=args.n_batch,
                          n_threads=args.threads, fast_kernels=False)
    return {"exact": exact, "fast": attrs.evolve(exact, fast_kernels=True)}


def run(args: argparse.Namespace) -> int:
    from cachepolicy.errors import ModelLoadError
    from runtime.bench.kernels import compare_kernels, prompt_for
    from runtime.engine_setup import ModelFiles, load_engine

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
        from vmenv.trajectory_writer import write_durably

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
    from runtime.bench.text_grid import grid

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
