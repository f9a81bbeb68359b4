"""``kvagent bench encode`` (``kvagent bench-encode``): the critical path's fixed costs side by
side in one run — the vision encoder with flash attention off vs on, the prefill a retained
screenshot costs a prefetch (so the VM time overlap needs), and encoding a screenshot ahead
while the prefetch finishes (the measurements: ``runtime.bench.encoder``; the arguments:
``runtime/commands/bench_encode.py``).

Exit status 0 when every encode was bitwise the same run to run and encode-ahead changed no
output, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cachepolicy.engine import EngineConfig
from runtime.bench.agent_defaults import bench_agent_defaults
from runtime.bench.encoder import ahead_summary, encode_ahead_runs, time_encoders
from runtime.bench.text_grid import grid
from runtime.engine_setup import BENCH_MODEL, load_engine, resolve_model
from vmenv.trajectory_writer import write_durably

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``args``: the checked options of ``kvagent bench encode``."""
    files = resolve_model(args.model, args.mmproj, default=BENCH_MODEL)
    agent = bench_agent_defaults()  # the bench's agent: its window sizes the episodes
    # about (W/32)(H/32) tokens a screenshot on a Qwen-VL projector: two of the largest
    # (prefill_seconds), or a window of the first plus the new one (the episodes)
    tokens = [w * h // 1024 + 64 for w, h in args.sizes]
    per_seq = max(4096, 2 * max(tokens) + 256, (agent.window + 1) * tokens[0] + 2048)
    # the encoder beside the llama context whatever the cores: encode-ahead is measured as
    # such (on fewer cores than both teams need, what it costs)
    configs = [EngineConfig(n_ctx_per_seq=per_seq, n_seq_max=2, n_threads=args.threads,
                            encoder_flash_attn=fa, encoder_beside=True) for fa in (False, True)]
    engines = [load_engine(files, c) for c in configs]
    try:
        timings = []
        for size in args.sizes:
            t = time_encoders(engines, size, args.repeats)
            print(f"[{t.width}x{t.height}] {t.tokens} tokens: encoder {t.median('flash_off'):.3f}"
                  f" s (flash off) / {t.median('flash_on'):.3f} s (on)", file=sys.stderr)
            timings.append(t)
        engines[0].close()  # the flash-off engine is done: free its memory (close is idempotent)
        runs = (encode_ahead_runs(engines[1], agent, args.sizes[0], steps=args.steps,
                                  vm_seconds=args.vm_seconds, repeats=2,
                                  progress=lambda s: print(s, file=sys.stderr, flush=True))
                if args.steps else [])
    finally:
        for e in engines:
            e.close()
    ahead = ahead_summary(runs, agent.window) if runs else None
    print(_table(timings, args.threads))
    if ahead is not None:
        print(_ahead_lines(ahead, args))
    ok = all(all(t.deterministic.values()) for t in timings) and (
        ahead is None or ahead["outputs_identical"])
    if args.json_out is not None:
        report = {"model": str(files.model), "mmproj": str(files.mmproj), "threads": args.threads,
                  "repeats": args.repeats, "sizes": [t.as_dict() for t in timings],
                  "encode_ahead": ahead, "vm_seconds": args.vm_seconds, "steps": args.steps,
                  "window": agent.window, "deterministic": ok}
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0 if ok else 1


def _table(timings: list, threads: int) -> str:
    head = ("screenshot", "tokens", "encode s flash off", "encode s flash on", "off/on",
            "bitwise run to run", "max|diff| off vs on", "prefill s / screenshot")
    rows = [head]
    for t in timings:
        d = t.as_dict()
        rows.append((f"{t.width}x{t.height}", str(t.tokens),
                     f"{d['encode_s_median_flash_off']:.3f}",
                     f"{d['encode_s_median_flash_on']:.3f}", f"{d['speedup']:.2f}x",
                     "yes" if all(t.deterministic.values()) else "NO",
                     f"{t.max_abs_diff_off_on:.2g}", f"{d['prefill_s_median']:.3f}"))
    lines = grid(rows).split("\n")
    lines.append(f"(medians, {threads} thread(s); overlap hides a retained screenshot's prefill "
                 f"only if the VM takes at least that long per retained screenshot)")
    return "\n".join(lines)


def _ahead_lines(a: dict, args: argparse.Namespace) -> str:
    off, on = a["off"], a["on"]
    return "\n".join([
        f"encode ahead ({args.steps} steps, VM {args.vm_seconds} s, terminal-slot+overlap, "
        f"steps after the window filled, 2 runs each; the encoder beside the llama context, "
        f"{args.threads} thread(s) each, {os.cpu_count()} cores):",
        f"  off: critical path {off['critical_path_s']:.3f} s, waited "
        f"{off['prefetch_wait_s']:.3f} s for the prefetch, encode {off['encode_s']:.3f} s",
        f"  on:  critical path {on['critical_path_s']:.3f} s, waited "
        f"{on['prefetch_wait_s']:.3f} s, encode {on['encode_s']:.3f} s of which "
        f"{on['encode_ahead_s']:.3f} s beside the prefetch",
        f"  critical path on/off: {a['critical_path_ratio_on_off']:.2f}; outputs identical: "
        f"{'yes' if a['outputs_identical'] else 'NO'}"])
