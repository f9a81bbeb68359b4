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


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import (
        add_agent_arguments, add_engine_arguments, add_model_arguments, bench_agent_defaults,
    )
    from runtime.engine_setup import BENCH_MODEL

    add_model_arguments(p, BENCH_MODEL)
    p.add_argument("--arms", default=None,
                   help=f"comma-separated arms: policies, or <policy>{OVERLAP}; an approximate "
                        "policy may name its replay budget, <policy>@64 or <policy>@5%% (default: "
                        f"{','.join(default_arms())}; none when --episodes > 1)")
    p.add_argument("--episodes", type=int, default=1,
                   help="run N episodes concurrently through the scheduler, then back to back")
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget for --episodes: bytes (2GiB, 512MiB) or a multiple of one "
                        "episode's measured peak (3.2x); default: unlimited")
    p.add_argument("--compare-replay-rung", action="store_true",
                   help="with --episodes: run the concurrent phase twice on the same budget, "
                        "without and with the fallback ladder's replay rung (--replay-rung), "
                        "and print the throughput ratio; the rung's approximate steps are "
                        "marked in the records")
    p.add_argument("--rung-repeats", type=int, default=1,
                   help="with --compare-replay-rung: run each variant this many times, in ABBA "
                        "order (without, with, with, without, ...); the ratios are over the "
                        "sums")
    p.add_argument("--wait-seconds", type=float, default=30.0,
                   help="bound of the scheduler's wait-for-release rung")
    p.add_argument("--trajectory", type=Path,
                   help="replay this recorded trajectory directory (traj.jsonl + PNGs) instead "
                        "of the synthetic one")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--image-tokens", type=int, default=512, help="target tokens per screenshot")
    p.add_argument("--screen", default=None,
                   help="screenshot size WxH instead of --image-tokens (e.g. 1280x720: what "
                        "the projector makes of that size)")
    p.add_argument("--scenario", choices=["study"], default=None,
                   help="a preset run instead (study: the forged qwen35 L Q4_K_M with vision, "
                        "1280x720 and 1920x1080 screenshots x K = 3 and 5; see docs/benchmarks.md)")
    p.add_argument("--vm-seconds", type=float, default=0.0, help="simulated VM time per action")
    p.add_argument("--unchanged-every", type=int, default=0,
                   help="every N-th step of the synthetic trajectory shows the screen before "
                        "it again (an action that changed nothing; 0: none)")
    p.add_argument("--decode-arms", nargs="?", const="all", default=None,
                   help="instead of policy arms: terminal-slot+overlap once per decode variant "
                        "(lanes-fixed, lanes, runs, runs+drafts, runs+drafts+guess; comma-"
                        "separated, or all), --rounds times in alternating order: the "
                        "decode's share of the critical path and the actions' hashes")
    p.add_argument("--rounds", type=int, default=2, help="rounds of --decode-arms")
    add_engine_arguments(p, n_batch=True)
    p.add_argument("--json", type=Path, dest="json_out", help="write the full results here")
    p.add_argument("--plot", type=Path, default=None,
                   help="draw per-step critical-path prefill, latency and ledger bytes per arm "
                        "with the bound into this PNG (default: next to --json, as .png)")
    add_agent_arguments(p, defaults=bench_agent_defaults())
    p.set_defaults(policy="terminal-slot", overlap=False)  # arms set their own


OVERLAP = "+overlap"


def default_arms() -> tuple[str, ...]:
    from cachepolicy.policies import BUILTIN

    return BUILTIN + ("terminal-slot" + OVERLAP,)


def _check(args: argparse.Namespace) -> str | None:
    from runtime.bench.arms import ArmSpec
    from runtime.bench.study import parse_screen
    from cachepolicy.policies import names
    from runtime.arg_parsers import check_range, parse_memory_budget
    from runtime.commands.options import agent_config, engine_fields

    if args.arms is None:
        arms = [] if args.episodes > 1 else list(default_arms())
    else:
        arms = [a.strip() for a in args.arms.split(",") if a.strip()]
        if not arms:
            return (f"no arm in {args.arms!r}; choose from {', '.join(names())} (each "
                    f"optionally with {OVERLAP})")
        try:
            for arm in arms:
                ArmSpec.parse(arm)
        except ValueError as exc:
            return str(exc)
    if not 1 <= args.episodes <= 64:
        return "--episodes must be 1..64"
    if args.compare_replay_rung and args.episodes < 2:
        return "--compare-replay-rung needs --episodes N (N >= 2) and a --memory-budget"
    if not 1 <= args.rung_repeats <= 16:
        return "--rung-repeats must be 1..16"
    try:
        args.budget = parse_memory_budget(args.memory_budget, relative=True)
        if args.screen is not None:
            args.screen = parse_screen(args.screen)
        args.engine_fields = engine_fields(args)
        check_range(args.vm_seconds, option="--vm-seconds", low=0, high=3600)
        check_range(args.wait_seconds, option="--wait-seconds", low=0, high=3600,
                    low_open=True)
        args.agent = agent_config(args)
    except ValueError as exc:
        return str(exc)
    if args.model is not None and args.mmproj is None:
        return "--model needs --mmproj: the bench replays screenshots"
    if args.screen is not None:
        if args.trajectory is not None:
            return "--screen and --trajectory: a recorded trajectory has its own screenshots"
    if args.decode_arms is not None:
        from runtime.bench.decode_arms import DEFAULT, parse_variants
        try:
            args.decode_variants = (DEFAULT if args.decode_arms == "all"
                                    else parse_variants(args.decode_arms))
        except ValueError as exc:
            return str(exc)
        if not 1 <= args.rounds <= 20:
            return "--rounds must be 1..20"
    if not 0 <= args.unchanged_every <= 1000:
        return "--unchanged-every must be 0..1000"
    if args.trajectory is not None and not args.trajectory.is_dir():
        return f"--trajectory {args.trajectory}: not a directory"
    for name, top in (("steps", 1000), ("image_tokens", 16384)):
        if not 1 <= getattr(args, name) <= top:
            return f"--{name.replace('_', '-')} must be 1..{top}"
    args.arm_list = arms
    return None


def run(args: argparse.Namespace) -> int:
    if args.scenario == "study":
        from runtime.bench.study import run_study
        return run_study(args, run)
    problem = _check(args)
    if problem:
        print(f"kvagent bench: error: {problem}", file=sys.stderr)
        return 2
    from cachepolicy.engine.images import fit_resolution
    from cachepolicy.errors import KvagentCacheError
    from runtime.commands.options import model_files
    from runtime.engine_setup import BENCH_MODEL, engine_config, load_engine
    from runtime.bench.analysis import analyze
    from runtime.bench.arms import run_arms
    from runtime.bench.report import (
        REFERENCE_ARM, bound_text, latency_table, summarize, table, time_table,
    )
    from runtime.bench.targets import targets, targets_text
    from runtime.bench.trajectory import screenshot, trajectory, unchanged_every
    from runtime.metrics import rss_bytes, rss_peak_bytes
    from vmenv.errors import VmEnvError
    from vmenv.trajectory import load_trajectory

    recorded = None
    if args.trajectory is not None:
        try:
            recorded = load_trajectory(args.trajectory)
        except VmEnvError as exc:
            print(f"kvagent bench: error: {exc}", file=sys.stderr)
            return 2
        if len(recorded.frames) < 2:
            print(f"kvagent bench: error: {args.trajectory} needs at least two screenshots",
                  file=sys.stderr)
            return 2
    files = model_files(args, BENCH_MODEL)
    model, mmproj = files.model, files.mmproj
    if files.default is not None:
        print(f"using {files.default.describe()}: {model.parent}", file=sys.stderr)
    steps = len(recorded.frames) - 1 if recorded is not None else args.steps
    if args.screen is not None:  # size the context for what the projector makes of it
        from runtime.context_budget import estimate_image_tokens
        args.image_tokens = estimate_image_tokens(mmproj, args.screen)
    shot_tokens = args.image_tokens + 96
    decode = args.agent.decode_tokens  # the bench always fixes it (--decode-tokens N)
    assert decode is not None
    per_seq = max(4096, steps * (shot_tokens + decode) * 11 // 10 + 2048)
    try:
        config = engine_config(model, what="--steps, --image-tokens and --episodes",
                               n_ctx_per_seq=per_seq, n_seq_max=max(2, args.episodes + 1),
                               **args.engine_fields)
        engine = load_engine(files, config)
    except (KvagentCacheError, ValueError) as exc:
        print(f"kvagent bench: error: {exc}", file=sys.stderr)
        return 2
    with engine:
        if recorded is None:
            if args.screen is not None:
                w, h = args.screen
                tokens = engine.image_tokens(screenshot(0, w, h))[0]
            else:
                w, h, tokens = fit_resolution(
                    lambda w, h: engine.image_tokens(screenshot(0, w, h))[0], args.image_tokens)
            traj = trajectory(steps, w, h,
                              unchanged=unchanged_every(steps, args.unchanged_every))
        else:
            traj = recorded
            w, h = traj.frames[0].width, traj.frames[0].height
            tokens = engine.image_tokens(traj.frames[0].screenshot)[0]
        print(f"{engine.kind.value} model {model.name}, {engine.n_params / 1e6:.1f}M params; "
              f"screenshots {w}x{h} = {tokens} tokens (target {args.image_tokens}); "
              f"{steps} steps, window {args.agent.window_label}", file=sys.stderr)
        # Room for one window of screenshots plus the new one: retained screenshots are
        # re-prefilled from the cache instead of re-running the vision encoder.
        per_image = engine.encode_image(traj.frames[0].screenshot).nbytes
        engine.set_image_cache_bytes((args.agent.window + 1) * per_image * args.episodes)
        engine.clear_image_cache()  # every arm starts with a cold cache
        rss_loaded = rss_bytes()  # model, mmproj and the preallocated KV buffers are in

        def progress(arm: str, e) -> None:
            m = e.metrics
            if e.kind != "step" or m is None:
                return
            print(f"[{arm}] step {e.step}/{steps}: prefill {m.prefill_tokens} tok "
                  f"({m.critical_path_prefill_tokens} on the critical path) in "
                  f"{m.prefill_s:.2f} s + encode {m.encode_s:.2f} s, reused "
                  f"{m.reused_tokens}, decode {m.decode_tokens} tok in {m.decode_s:.2f} s, "
                  f"critical path {m.critical_path_s:.2f} s", file=sys.stderr, flush=True)

        if args.decode_arms is not None:
            return _decode_arms(args, engine, traj, progress,
                                {"model": str(model), "steps": steps, "image_tokens": tokens,
                                 "screenshot_size": [w, h], "vm_seconds": args.vm_seconds,
                                 "unchanged_every": args.unchanged_every,
                                 "threads": args.threads, "grammar": args.agent.grammar,
                                 "decode_tokens": decode, "window": args.agent.window,
                                 "pinned": args.agent.pinned})
        results = run_arms(engine, args.arm_list, traj, args.agent,
                           vm_seconds=args.vm_seconds, on_event=progress)
        for res in results:
            if res.refused:
                print(f"[{res.arm}] refused: {res.refused}", file=sys.stderr)
        concurrency = _concurrency(args, engine, traj) if args.episodes > 1 else None
        ref = next((r.output_sha256 for r in results if r.arm == REFERENCE_ARM), None)
        arms = [{"arm": r.arm, "policy": r.policy, "overlap": r.overlap, "refused": r.refused,
                 "steps": list(r.steps), "summary": summarize(r, ref, args.agent.window),
                 "output_sha256": r.output_sha256, "bound": None} for r in results]
        blocks = analyze(arms)
        report = {"config": {
            "model": str(model), "mmproj": str(mmproj), "model_kind": engine.kind.value,
            "n_params": engine.n_params, "steps": steps, "window": args.agent.window,
            "pinned": args.agent.pinned,
            "trajectory": str(args.trajectory) if args.trajectory else None,
            "image_tokens_target": args.image_tokens, "image_tokens": tokens,
            "screenshot_size": [w, h], "vm_seconds": args.vm_seconds,
            "profile": args.agent.profile, "decode_tokens": decode, "grammar": args.agent.grammar,
            "stop_at_eog": args.agent.stop_at_eog, "temperature": args.agent.temperature,
            "threads": args.threads, "n_batch": engine.config.n_batch,
            "decode_rows": engine.config.decode_rows,
            "decode_shape": engine.decode_shape.describe(),
            "row_classes": engine.row_classes.describe(),
            "jump_forward": args.agent.jump_forward, "drafts": args.agent.drafts,
            "reference_arm": REFERENCE_ARM,
            "rss_after_load_bytes": rss_loaded, "rss_peak_bytes": rss_peak_bytes(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"},
            "arms": arms, **blocks}
        if concurrency is not None:
            report["config"].update(episodes=args.episodes, policy=args.agent.policy,
                                    overlap=args.agent.overlap,
                                    memory_budget=args.memory_budget,
                                    replay_rung=args.agent.replay_rung,
                                    compare_replay_rung=args.compare_replay_rung,
                                    rung_repeats=args.rung_repeats,
                                    replay_budget=args.agent.replay_budget,
                                    replay_base=args.agent.replay_base)
            report.update(concurrency)
        report["targets"] = targets(report, default_model=args.model is None)
    if arms:
        print(table(arms))
        print()
        print(time_table(arms))
        print()
        print(latency_table(arms, report["bound"]))
        print()
        print(bound_text(report))
    if concurrency is not None:
        print(_concurrency_table(concurrency))
    print()
    print(targets_text(report["targets"]))
    plot = args.plot or (args.json_out.with_suffix(".png") if args.json_out else None)
    report["plot"] = None
    if plot is not None and any(not a["refused"] for a in arms):
        from runtime.bench.plot import plot_bench

        report["plot"] = str(plot_bench(
            arms, report["bound"], plot,
            title=f"kvagent bench: {model.parent.name}/{model.name}, {steps} steps, "
                  f"{tokens}-token screenshots, window {args.agent.window_label}, "
                  f"VM {args.vm_seconds:g} s"))
        print(f"wrote {plot}")
    if args.json_out is not None:
        from vmenv.trajectory_writer import write_durably

        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0


def _concurrency(args: argparse.Namespace, engine: object, traj: object) -> dict:
    import anyio

    from runtime.bench.concurrent import measure_concurrency

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return anyio.run(lambda: measure_concurrency(
        engine, traj, args.agent, args.episodes, budget=args.budget,  # type: ignore[arg-type]
        vm_seconds=args.vm_seconds, wait_s=args.wait_seconds, progress=say,
        compare_rung=args.compare_replay_rung, rung_repeats=args.rung_repeats))


def _concurrency_table(c: dict) -> str:
    from scheduler.sizes import format_bytes

    def counts(eps: list) -> str:
        statuses = [e["status"] for e in eps]
        return (f"{statuses.count('ok')} ok, {statuses.count('degraded')} degraded, "
                f"{statuses.count('failed')} failed")

    t, led = c["throughput"], c["ledger"]
    rung = []
    if c.get("replay_rung") is not None:
        from runtime.bench.rung import rung_table

        rung = [rung_table(c["replay_rung"])]
    return "\n".join([
        f"concurrent: {counts(c['episodes'])}; {t['concurrent_steps_per_s']:.2f} steps/s; "
        f"ledger peak {format_bytes(led['peak_bytes'])} of {format_bytes(led['budget_bytes'])}",
        f"sequential: {counts(c['sequential_episodes'])}; {t['sequential_steps_per_s']:.2f} "
        f"steps/s; ledger peak {format_bytes(led['sequential_peak_bytes'])}",
        f"throughput ratio (concurrent / sequential): {t['ratio']:.2f}; CPU seconds "
        f"{t['concurrent_cpu_s']:.1f} vs {t['sequential_cpu_s']:.1f}; outputs identical to "
        f"the sequential run: {'yes' if c['outputs_identical_to_sequential'] else 'no'}",
        f"decode: {c['decode']['concurrent']['tokens_per_s']:.1f} tokens/s concurrent "
        f"({c['decode']['concurrent']['rows_per_call']:.2f} rows per call) vs "
        f"{c['decode']['sequential']['tokens_per_s']:.1f} sequential: "
        f"{c['decode']['speedup']:.2f}x", *rung])


def _decode_arms(args: argparse.Namespace, engine: object, traj: object, progress: object,
                 config: dict) -> int:
    """``--decode-arms``: the decode variants side by side (``runtime.bench.decode_arms``)."""
    from runtime.bench.decode_arms import run_variants, summarize, table
    from vmenv.trajectory_writer import write_durably

    runs = run_variants(engine, traj, args.agent, args.decode_variants,  # type: ignore[arg-type]
                        rounds=args.rounds, vm_seconds=args.vm_seconds,
                        on_event=progress)  # type: ignore[arg-type]
    summary = summarize(runs)
    print(f"row classes: {engine.row_classes.describe()}")  # type: ignore[attr-defined]
    print(table(summary))
    groups = ({n for n in summary if n.startswith("lanes")},
              {n for n in summary if n.startswith("runs")})
    same = all(len({h for n in g for h in summary[n]["output_sha256"]}) <= 1 for g in groups)
    print(f"actions identical within lanes and within runs: {str(same).lower()}")
    if args.json_out is not None:
        config.update(row_classes=engine.row_classes.as_dict(),  # type: ignore[attr-defined]
                      rounds=args.rounds)
        write_durably(args.json_out, json.dumps(
            {"config": config, "decode_arms": summary, "identical_within_shapes": same,
             "steps": {f"{r.variant} r{r.round}": r.arm.steps for r in runs}},
            indent=1).encode())
    return 0 if same else 1
