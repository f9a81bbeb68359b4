"""``kvagent bench decode`` (``kvagent bench-decode``): the row classes the engine measured on
this model and CPU, what a decode call costs per class, what a lone generation pays in each
decode shape (against its one-row decode), and what several generations decoding at once gain
over one at a time — with the tokens identical wherever they must be.  All measured side by
side in one run, through the engine's decode calls and ``Engine.generate`` (the path agents
use; the measurements: ``runtime.bench.decode``; the arguments:
``runtime/commands/bench_decode.py``).

Exit status 0 when the tokens are identical wherever they must be, 1 when not, 2 when the
sizes do not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import anyio
import anyio.to_thread

from cachepolicy.engine.sampling import SamplingParams
from runtime.bench.decode import (
    call_costs, lone_generation, lone_summary, prompt_tokens, same_tokens,
)
from runtime.engine_setup import BENCH_MODEL, ModelFiles, engine_config, load_engine, resolve_model
from runtime.profiles import get
from vmenv.trajectory_writer import write_durably

__all__ = ["measure", "print_report", "run"]


def run(args: argparse.Namespace) -> int:
    """``args``: the checked options of ``kvagent bench decode``."""
    try:
        model = resolve_model(args.model, None, default=BENCH_MODEL, vision=False).model
        config = _config(model, args, args.rows)  # every size checked before anything loads
    except ValueError as exc:
        print(f"kvagent bench-decode: error: {exc}", file=sys.stderr)
        return 2
    report = measure(model, args, config)
    print_report(report)
    if args.json_out is not None:
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
    ok = report["identical_to_one_at_a_time"] and report["runs_drafts_identical_to_plain"]
    return 0 if ok else 1


def _config(model: Path, args: argparse.Namespace, rows: int) -> object:
    per_seq = args.context + max(args.tokens, 64) + 64
    return engine_config(model, what="--sequences / --context / --tokens / --threads / --rows",
                         n_ctx_per_seq=per_seq, n_seq_max=args.sequences,
                         n_batch=min(512, per_seq), n_threads=args.threads, decode_rows=rows)


def _together(e: object, args: argparse.Namespace, *,
              together: bool) -> tuple[dict[int, list[int]], float, dict]:
    """Every sequence generates ``args.tokens`` tokens through ``Engine.generate``, all at
    once (``together``) or one after another; sampled, so any logit change shows.  Returns
    the tokens, the wall seconds and the decode counters."""
    n = args.sequences
    params = SamplingParams(temperature=1.0, seed=11)
    logits = {}
    for s in range(n):  # a different prompt per sequence (other tokens and lengths)
        e.clear(s)  # type: ignore[attr-defined]
        logits[s] = e.prefill_tokens(s, prompt_tokens(e, args.context, s))  # type: ignore
    out: dict[int, list[int]] = {}
    before = e.decode_stats()  # type: ignore[attr-defined]

    def one(s: int) -> None:
        out[s] = e.generate(s, logits[s], args.tokens, params,  # type: ignore[attr-defined]
                            stop_at_eog=False)

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
    stats = (e.decode_stats() - before).as_dict()  # type: ignore[attr-defined]
    for s in range(n):
        e.clear(s)  # type: ignore[attr-defined]
    return out, wall, stats


def measure(model: Path, args: argparse.Namespace, config: object) -> dict:
    n = args.sequences
    grammar = get(args.grammar).grammar((1280, 720)) if args.grammar else None
    params = SamplingParams(temperature=args.temperature, seed=11, grammar=grammar)
    with load_engine(ModelFiles(model, None), config, vision=False) as e:  # type: ignore
        prompt = prompt_tokens(e, args.context)
        print(f"[classes] {e.row_classes.describe()}", file=sys.stderr, flush=True)
        costs = call_costs(e, prompt, args.rounds)
        print("[lone] one generation per decode shape", file=sys.stderr, flush=True)
        lone = lone_generation(e, prompt, args.tokens, params, args.rounds)
        phases = {}
        # the default shape with every generation in it: where the default is runs (f16),
        # asked for explicitly — by default these ungrammared generations would decode alone
        default = True if e.decode_shape.free_text_alone else None
        for name, shape, together in (("batched", default, True),
                                      ("one_at_a_time", default, False),
                                      ("lanes_batched", False, True),
                                      ("lanes_one_at_a_time", False, False)):
            print(f"[{name}] {n} generations x {args.tokens} tokens", file=sys.stderr,
                  flush=True)
            own = e.decode_shape
            if shape is not None:
                e.set_decode_shape(e.shape_for(shape))
            try:
                phases[name] = _together(e, args, together=together)
            finally:
                e.set_decode_shape(own)
        classes, shape = e.row_classes, e.decode_shape
    summary = lone_summary(lone)
    tokens = n * (args.tokens - 1)  # the first token comes from the prompt's logits
    b, o = phases["batched"], phases["one_at_a_time"]
    lb, lo = phases["lanes_batched"], phases["lanes_one_at_a_time"]
    return {
        "model": str(model), "sequences": n, "context": args.context, "tokens": args.tokens,
        "threads": args.threads, "decode_rows": args.rows, "rounds": args.rounds,
        "temperature": args.temperature, "grammar": args.grammar,
        "row_classes": classes.as_dict(), "row_classes_text": classes.describe(),
        "decode_shape": shape.describe(),
        "call_costs": {"one_row_s": costs.one_row_s,
                       "lanes": {str(k): v for k, v in costs.lanes.items()},
                       "runs": {str(k): v for k, v in costs.runs.items()}},
        "lone_generation": summary,
        "runs_drafts_identical_to_plain": same_tokens(lone, "runs_plain", "runs_drafts"),
        "lanes_identical_to_runs": same_tokens(lone, "lanes", "runs_plain"),
        "batched_tokens_per_s": tokens / b[1], "one_at_a_time_tokens_per_s": tokens / o[1],
        "speedup": o[1] / b[1], "identical_to_one_at_a_time": b[0] == o[0] and lb[0] == lo[0],
        "lanes_batched_tokens_per_s": tokens / lb[1],
        "lanes_one_at_a_time_tokens_per_s": tokens / lo[1], "lanes_speedup": lo[1] / lb[1],
        "padding_cost": summary["lanes"]["vs_one_row"],
        "decode_calls": {k: v[2] for k, v in phases.items()},
    }


def print_report(r: dict) -> None:
    lone = r["lone_generation"]
    costs = r["call_costs"]
    print(f"row classes on this CPU: {r['row_classes_text']}")
    print(f"decode shape: {r['decode_shape']}")
    print(f"cost of one call, relative to a one-row call ({costs['one_row_s'] * 1e3:.2f} ms; "
          f"medians of {r['rounds']} rounds):")
    print("  lane calls: " + "  ".join(f"{k} rows {v:.2f}x" for k, v in costs["lanes"].items()))
    print("  runs:       " + "  ".join(f"{k} {v:.2f}x" for k, v in costs["runs"].items()))
    print(f"a lone generation of {r['tokens']} tokens "
          f"({'greedy' if r['temperature'] == 0 else 'sampled'}"
          f"{', grammar ' + r['grammar'] if r['grammar'] else ''}), per token vs one-row "
          f"calls:")
    names = {"one_row": "one-row calls (no padding)", "lanes": "lanes shape",
             "runs_plain": "runs, no drafts", "runs_drafts": "runs, jump-forward + drafts"}
    for variant, label in names.items():
        s = lone[variant]
        extra = (f", {s['accepted']}/{s['drafted']} drafts confirmed" if s["drafted"] else "")
        print(f"  {label:<28} {s['vs_one_row']:.2f}x  ({s['calls']} calls, {s['rows']} rows"
              f" + {s['pad_rows']} pad{extra})")
    print(f"  drafts change no token: {str(r['runs_drafts_identical_to_plain']).lower()}")
    print(f"padding costs a lone generation {r['padding_cost']:.2f}x in the lanes shape")
    print(f"{r['sequences']} generations x {r['tokens']} tokens at ~{r['context']} context "
          f"tokens, sampled:")
    print(f"  {r['decode_shape'].split(':')[0]} (default): together "
          f"{r['batched_tokens_per_s']:.1f} tokens/s, one at a time "
          f"{r['one_at_a_time_tokens_per_s']:.1f} tokens/s ({r['speedup']:.2f}x)")
    print(f"  lanes: together {r['lanes_batched_tokens_per_s']:.1f} tokens/s "
          f"({r['decode_calls']['lanes_batched']['rows_per_call']:.2f} rows per call), one at "
          f"a time {r['lanes_one_at_a_time_tokens_per_s']:.1f} tokens/s "
          f"({r['lanes_speedup']:.2f}x)")
    print(f"together identical to one at a time: "
          f"{str(r['identical_to_one_at_a_time']).lower()}")
