"""``kvagent bench replay-prefix`` (``kvagent bench-replay-prefix``): prefill tokens and seconds
to the first token at matched prefixes of growing length on a hybrid model — a full
re-prefill, an exact checkpoint at the prefix's end and tail replays at several budgets, side
by side on one engine, with each replay's next-token KL and top-1 against the exact first
token (the measurement: ``runtime.bench.replay_prefix``; the prompt:
``runtime.bench.agent_prefix``; the arguments: ``runtime/commands/bench_replay_prefix.py``).

Exit status 0 when the exact arm was bitwise the full prefill and every arm deterministic, 1
when not, 2 for a model or lengths that cannot run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.engine.sizing import train_context
from cachepolicy.segments import SegmentFactory
from runtime.bench import replay_prefix
from runtime.bench.agent_prefix import TEXT_SUFFIX_ROWS, agent_prompt, case
from runtime.bench.replay_prefix import EXACT, FULL, PrefixReport, tokens_add_up
from runtime.bench.text_grid import grid
from runtime.config import AgentConfig
from runtime.engine_setup import DEMO_MODEL, engine_config, load_engine, resolve_model
from vmenv.trajectory_writer import write_durably

__all__ = ["DEFAULT_MAX_CONTEXT", "FIRST_LENGTH", "default_lengths", "format_report", "run"]


#: lengths are powers of two from here up to what the context holds
FIRST_LENGTH = 256


#: the default context when the model's is longer (each length's full prefill is measured
#: several times: a 256K-token context would take hours); --lengths may go up to the model's
DEFAULT_MAX_CONTEXT = 32768


def _fail(problem: str) -> int:
    print(f"kvagent bench-replay-prefix: error: {problem}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """``args``: the checked options of ``kvagent bench replay-prefix`` (``args.screen_wh``,
    ``args.length_list``, ``args.budget_list``)."""
    try:
        files = resolve_model(args.model, args.mmproj, default=DEMO_MODEL)
    except ValueError as exc:
        return _fail(str(exc))
    if files.note():
        print(files.note(), file=sys.stderr)
    try:
        n_ctx_train = train_context(files.model)
    except ValueError as exc:
        return _fail(str(exc))
    if n_ctx_train is None:
        return _fail(f"{files.model}: its GGUF metadata does not say the context it was "
                     "trained for (<arch>.context_length)")
    asked = [n for n in args.length_list or [] if n is not None]
    context = (n_ctx_train if any(n > DEFAULT_MAX_CONTEXT for n in asked)
               else min(n_ctx_train, DEFAULT_MAX_CONTEXT))
    if asked and max(asked) >= context:
        return _fail(f"--lengths {max(asked)}: the model was trained for {n_ctx_train} "
                     f"positions; the prefix and its suffix must fit in them")
    try:
        config = engine_config(files.model, what="the model's training context",
                               n_ctx_per_seq=context, n_seq_max=1, n_threads=args.threads,
                               n_batch=min(512, context), decode_rows=1)
    except ValueError as exc:
        return _fail(str(exc))
    load = [os.getloadavg()[0]]
    with load_engine(files, config) as engine:
        problem = _not_hybrid(engine)
        if problem:
            return _fail(problem)
        try:
            report = _measure(engine, args, context)
        except ValueError as exc:
            return _fail(str(exc))
    load.append(os.getloadavg()[0])
    print(format_report(report, load))
    if args.json_out is not None:
        out = report.as_dict() | {"model": str(files.model), "mmproj": str(files.mmproj),
                                  "n_ctx_train": n_ctx_train, "threads": args.threads,
                                  "screen": list(args.screen_wh), "load_1min": load,
                                  "cpu_count": os.cpu_count()}
        write_durably(args.json_out, json.dumps(out, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0 if report.ok else 1


def _not_hybrid(engine: object) -> str | None:
    kind = engine.kind  # type: ignore[attr-defined]
    if kind is ModelKind.HYBRID:
        return None
    what = ("attention-only: no recurrent state to replay" if kind is ModelKind.ATTENTION
            else "recurrent only: no attention KV to keep")
    return (f"tail replay keeps a hybrid model's attention KV and rebuilds its recurrent "
            f"state; {engine.model_path.name} is {what}")  # type: ignore[attr-defined]


def _measure(engine: object, args: argparse.Namespace, context: int) -> object:
    factory = SegmentFactory(engine)  # type: ignore[arg-type]
    config = AgentConfig(policy="noevict")
    screen = args.screen_wh
    print(f"[episode] chaining simdesk demonstrations at {screen[0]}x{screen[1]}",
          file=sys.stderr, flush=True)
    # long enough for the longest prefix asked (for max or the default lengths: the context)
    asked = args.length_list or [None]
    prompt = agent_prompt(factory, config, screen,
                          context if None in asked else max(n for n in asked if n))
    gen = len(factory.kit.generation_prompt)
    suffix_max = (max(s.n_tokens for s in prompt.log.screenshots) + gen
                  if args.suffix == "screenshot" else TEXT_SUFFIX_ROWS)
    limit = context - max(suffix_max, gen) - 1
    lengths = args.length_list or default_lengths(limit)
    lengths = sorted({limit if n is None else n for n in lengths})
    if lengths[-1] > limit:
        raise ValueError(f"--lengths {lengths[-1]}: with a {args.suffix} suffix of up to "
                         f"{suffix_max} rows the context ({context}) holds prefixes of at "
                         f"most {limit} rows (--lengths max)")
    cases = [case(prompt, n, args.suffix, limit=limit) for n in lengths]
    print(f"[episode] {prompt.steps} steps, {prompt.rows} rows; prefixes "
          f"{', '.join(str(c.prefix_rows) for c in cases)} rows; {args.repeats} repeats",
          file=sys.stderr, flush=True)

    def progress(res: replay_prefix.CaseResult, arms: replay_prefix.PrefixArms) -> None:
        cells = "  ".join(f"{a} {res.median_s(a):.3f} s" + (
            "" if a == replay_prefix.FULL else f" ({res.speedup(a):.1f}x)") for a in arms.names)
        print(f"[L={res.length}] {res.prefix_rows} rows + {res.suffix_rows}: {cells}",
              file=sys.stderr, flush=True)

    report = replay_prefix.run(engine, factory, prompt, cases,  # type: ignore[arg-type]
                               args.budget_list, config=config, screen=screen,
                               suffix=args.suffix, repeats=args.repeats, progress=progress)
    return report


def default_lengths(limit: int) -> list[int | None]:
    """256, 512, … while they fit, then the longest that fits."""
    out: list[int | None] = []
    n = FIRST_LENGTH
    while n <= limit:
        out.append(n)
        n *= 2
    return [*out, None]


def format_report(report: object, load: list[float]) -> str:
    assert isinstance(report, PrefixReport)
    head = ("prefix rows", "arm", "start", "prefill tok", "replayed", "TTFT s (median)",
            "full / arm", "next-token KL", "top-1", "ckpt KiB")
    rows = [head]
    for c in report.cases:
        for a in report.arms:
            s = c.summary(a)
            kl = "ref" if a == FULL else "0 (bitwise)" if s["bitwise"] else f"{s['kl']:.2e}"
            rows.append((f"{c.prefix_rows} ({c.screenshots} shots)" if a == FULL else "",
                         a, s["start"], str(s["prefill_tokens"]) + (
                             "" if tokens_add_up(c, a) else " (!)"),
                         str(s["replay_tokens"]) if s["start"] == "replay" else "",
                         f"{s['seconds_median']:.4f}",
                         "1" if a == FULL else f"{s['speedup_vs_full']:.2f}x",
                         kl, f"p={c.top1_p:.3f}" if a == FULL
                         else "yes" if s["top1_agree"] else "NO",
                         f"{s['checkpoint_bytes'] / 1024:.1f}"))
    lines = grid(rows).split("\n")
    lines.append("")
    lines.append("speedup = full TTFT / arm TTFT (median of the per-repeat ratios):")
    speedups = [("prefix rows", *[a for a in report.arms if a != FULL])]
    for c in report.cases:
        speedups.append((str(c.prefix_rows), *[f"{c.speedup(a):.2f}x" for a in report.arms
                                            if a != FULL]))
    lines += grid(speedups).split("\n")
    ckpt = report.cases[0].checkpoint_bytes if report.cases else 0
    lines.append("")
    lines.append(
        f"suffix: {report.suffix} ({', '.join(str(c.suffix_rows) for c in report.cases)} rows); "
        f"{report.repeats} repeat(s), arm order alternating; context {report.context}; the "
        f"prefixes cut from one {report.episode_steps}-step noevict episode of simdesk "
        f"demonstrations")
    lines.append(f"tail arms start from the zero recurrent state and hold no checkpoint: "
                 f"{ckpt / 1024:.1f} KiB saved per episode against the exact arm")
    same = all(c.bitwise[EXACT] for c in report.cases)
    lines.append(f"exact arm bitwise the full prefill: {'yes' if same else 'NO'}; every arm "
                 f"deterministic: "
                 f"{'yes' if all(all(c.deterministic.values()) for c in report.cases) else 'NO'}")
    lines.append(f"machine load (1-min average) at start {load[0]:.2f}, at end {load[-1]:.2f}; "
                 f"{os.cpu_count()} cores")
    return "\n".join(lines)
