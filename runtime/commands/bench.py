"""``kvagent bench``: the cache policies side by side on one replayed trajectory.

All arms run in one process on one engine: the same screenshots (a different one each step,
sized to cost about ``--image-tokens`` tokens), the same teacher-forced action texts, and a
fixed number of greedily decoded tokens per step.  ``output_sha256`` (over each arm's decoded
token ids) makes exactness between arms checkable from the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

HELP = "compare cache policies on one replayed screenshot trajectory (prefill, reuse, bytes)"
POLICY_ARMS = ("evict", "noevict", "terminal-scratch", "terminal-slot", "relocate")
ALL_ARMS = POLICY_ARMS + ("terminal-slot+overlap",)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="GGUF model (default: forge the qwen35 M model)")
    p.add_argument("--mmproj", type=Path, help="vision projector for --model (required with it)")
    p.add_argument("--arms", default=None,
                   help=f"comma-separated policies (default: {','.join(ALL_ARMS)}; none when "
                        "--episodes > 1)")
    p.add_argument("--episodes", type=int, default=1,
                   help="run N episodes concurrently through the scheduler, then back to back")
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget for --episodes: bytes (2GiB, 512MiB) or a multiple of one "
                        "episode's measured peak (3.2x); default: unlimited")
    p.add_argument("--policy", default="terminal-slot", choices=POLICY_ARMS[:4],
                   help="the cache policy of the --episodes runs")
    p.add_argument("--wait-seconds", type=float, default=30.0,
                   help="bound of the scheduler's wait-for-release rung")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--window", type=int, default=3, help="screenshots kept (K)")
    p.add_argument("--image-tokens", type=int, default=512, help="target tokens per screenshot")
    p.add_argument("--vm-seconds", type=float, default=0.0, help="simulated VM time per action")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--json", type=Path, dest="json_out", help="write the full results here")


def _check(args: argparse.Namespace) -> str | None:
    from runtime.sizes import parse_bytes

    if args.arms is None:
        arms = [] if args.episodes > 1 else list(ALL_ARMS)
    else:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        unknown = [a for a in arms if a not in ALL_ARMS]
        if unknown or not arms:
            return f"unknown arm(s) {unknown or args.arms!r}; choose from {', '.join(ALL_ARMS)}"
    if args.episodes < 1:
        return "--episodes must be >= 1"
    args.budget_bytes, args.budget_factor = None, None
    if args.memory_budget is not None:
        text = args.memory_budget.strip().lower()
        try:
            if text.endswith("x"):
                args.budget_factor = float(text[:-1])
                if args.budget_factor <= 0:
                    raise ValueError
            else:
                args.budget_bytes = parse_bytes(text)
        except ValueError:
            return (f"--memory-budget {args.memory_budget!r}: give bytes (2GiB, 512MiB) or a "
                    "multiple of one episode's peak (3.2x)")
    if args.model is not None and args.mmproj is None:
        return "--model needs --mmproj: the bench replays screenshots"
    for name in ("steps", "window", "image_tokens", "decode_tokens", "threads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if args.vm_seconds < 0:
        return "--vm-seconds must be >= 0"
    args.arm_list = arms
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"kvagent bench: error: {problem}", file=sys.stderr)
        return 2
    from cachepolicy.engine import Engine, EngineConfig
    from cachepolicy.errors import KvagentCacheError
    from cachepolicy.images import fit_resolution
    from cachepolicy.segments import SegmentFactory
    from runtime.bench.arms import rss_bytes, rss_peak_bytes, run_arm
    from runtime.bench.report import REFERENCE_ARM, summarize, table
    from runtime.bench.trajectory import screenshot, trajectory

    model, mmproj = args.model, args.mmproj
    if model is None:
        from cachepolicy.forge import forge_cached
        forged = forge_cached("qwen35", "M", vision=True)
        model, mmproj = forged.model_path, forged.mmproj_path
        print(f"using the forged qwen35 M model with vision: {model.parent}", file=sys.stderr)
    per_seq = max(4096, args.steps * (args.image_tokens + 96) * 11 // 10 + 2048)
    config = EngineConfig(n_ctx_per_seq=per_seq, n_seq_max=max(2, args.episodes + 1),
                          n_batch=args.n_batch, n_threads=args.threads)
    try:
        engine = Engine(model, mmproj, config)
    except KvagentCacheError as exc:
        print(f"kvagent bench: error: {exc}", file=sys.stderr)
        return 2
    with engine:
        w, h, tokens = fit_resolution(lambda w, h: engine.image_tokens(screenshot(0, w, h))[0],
                                      args.image_tokens)
        print(f"{engine.kind.value} model {model.name}, {engine.n_params / 1e6:.1f}M params; "
              f"screenshots {w}x{h} = {tokens} tokens (target {args.image_tokens}); "
              f"{args.steps} steps, window {args.window}", file=sys.stderr)
        traj = trajectory(args.steps, w, h)
        # Room for one window of screenshots plus the new one: retained screenshots are
        # re-prefilled from the cache instead of re-running the vision encoder.
        engine.image_cache.max_bytes = (args.window + 1) * engine.encode_image(traj[0].png).nbytes
        factory = SegmentFactory(engine)
        rss_loaded = rss_bytes()  # model, mmproj and the preallocated KV buffers are in
        results = []
        for name in args.arm_list:
            def progress(rec, name=name) -> None:
                print(f"[{name}] step {rec.step + 1}/{args.steps}: prefill "
                      f"{rec.prefill_tokens} tok in {rec.prefill_s:.2f} s, reused "
                      f"{rec.reused_tokens}, decode {rec.decode_tokens} tok in "
                      f"{rec.decode_s:.2f} s", file=sys.stderr, flush=True)
            res = run_arm(engine, factory, name, traj, window=args.window,
                          decode_tokens=args.decode_tokens, scratch_seq=1,
                          vm_seconds=args.vm_seconds, on_step=progress)
            if res.refused:
                print(f"[{name}] refused: {res.refused}", file=sys.stderr)
            results.append(res)
        concurrency = (_concurrency(args, engine, factory, traj) if args.episodes > 1
                       else None)
        ref = next((r.output_sha256 for r in results if r.arm == REFERENCE_ARM), None)
        arms = [{"arm": r.arm, "policy": r.policy, "overlap": r.overlap, "refused": r.refused,
                 "steps": list(r.steps), "summary": summarize(r, ref, args.window),
                 "output_sha256": r.output_sha256} for r in results]
        report = {"config": {
            "model": str(model), "mmproj": str(mmproj), "model_kind": engine.kind.value,
            "n_params": engine.n_params, "steps": args.steps, "window": args.window,
            "image_tokens_target": args.image_tokens, "image_tokens": tokens,
            "screenshot_size": [w, h], "vm_seconds": args.vm_seconds,
            "decode_tokens": args.decode_tokens, "threads": args.threads,
            "n_batch": args.n_batch, "reference_arm": REFERENCE_ARM,
            "rss_after_load_bytes": rss_loaded, "rss_peak_bytes": rss_peak_bytes(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"},
            "arms": arms}
        if concurrency is not None:
            report["config"].update(episodes=args.episodes, policy=args.policy,
                                    memory_budget=args.memory_budget)
            report.update(concurrency)
    if arms:
        print(table(arms))
    if concurrency is not None:
        print(_concurrency_table(concurrency))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json_out}")
    return 0


def _concurrency(args: argparse.Namespace, engine: object, factory: object,
                 traj: list) -> dict:
    import anyio

    from runtime.bench.concurrent import measure_concurrency, run_sequentially
    from runtime.sizes import format_bytes
    from scheduler.ledger import MemoryLedger
    from scheduler.scheduler import Scheduler
    from scheduler.transaction import StepOptions

    options = StepOptions(decode_tokens=args.decode_tokens)
    kw = dict(policy=args.policy, window=args.window, decode_tokens=args.decode_tokens,
              vm_seconds=args.vm_seconds)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    async def main() -> dict:
        budget = args.budget_bytes
        calibration = None
        if budget is None:
            ledger = MemoryLedger(1 << 50)
            say("measuring one episode's peak (calibration run)")
            async with Scheduler(engine, ledger, factory, options=options) as sched:
                await run_sequentially(sched, factory, traj, 1, **{**kw, "vm_seconds": 0.0})
            calibration = ledger.snapshot().peak
            budget = int(calibration * args.budget_factor) if args.budget_factor else 1 << 50
            say(f"one episode's peak: {format_bytes(calibration)}; budget "
                f"{format_bytes(budget) if args.budget_factor else 'unlimited'}")
        result = await measure_concurrency(
            engine, factory, traj, args.episodes, budget=budget, options=options,
            wait_s=args.wait_seconds, progress=say, **kw)
        result["ledger"]["one_episode_peak_bytes"] = calibration
        return result

    return anyio.run(main)


def _concurrency_table(c: dict) -> str:
    from runtime.sizes import format_bytes

    def counts(eps: list) -> str:
        statuses = [e["status"] for e in eps]
        return (f"{statuses.count('ok')} ok, {statuses.count('degraded')} degraded, "
                f"{statuses.count('failed')} failed")

    t, led = c["throughput"], c["ledger"]
    budget = "unlimited" if led["budget_bytes"] >= 1 << 50 else format_bytes(led["budget_bytes"])
    return "\n".join([
        f"concurrent: {counts(c['episodes'])}; {t['concurrent_steps_per_s']:.2f} steps/s; "
        f"ledger peak {format_bytes(led['peak_bytes'])} of {budget}",
        f"sequential: {counts(c['sequential_episodes'])}; {t['sequential_steps_per_s']:.2f} "
        f"steps/s; ledger peak {format_bytes(led['sequential_peak_bytes'])}",
        f"throughput ratio (concurrent / sequential): {t['ratio']:.2f}"])
