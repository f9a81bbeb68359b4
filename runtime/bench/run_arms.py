"""``kvagent bench arms`` (the default ``kvagent bench``): the cache policies side by side on
one replayed trajectory, and with ``--episodes N`` many episodes through one scheduler.

All arms run in one process on one engine: the same screenshots (a different one each step,
sized to cost about ``--image-tokens`` tokens), the same teacher-forced action texts, and a
fixed number of greedily decoded tokens per step.  ``output_sha256`` (over each arm's decoded
token ids) makes exactness between arms checkable from the JSON.  ``load`` is shared with the
``decode-arms`` mode (``runtime.bench.run_decode_arms``).

``args``: ``kvagent bench``'s options as its command checked them (``args.agent``,
``args.arm_list``, ``args.engine_fields``, ``args.budget`` filled in).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

import anyio
import attrs

from cachepolicy.engine import Engine
from cachepolicy.engine.images import fit_resolution
from cachepolicy.errors import KvagentCacheError
from runtime.bench.analysis import analyze
from runtime.bench.arms import run_arms
from runtime.bench.concurrent import measure_concurrency
from runtime.bench.plot import plot_bench
from runtime.bench.report import (
    REFERENCE_ARM, bound_text, latency_table, summarize, table, time_table,
)
from runtime.bench.rung import rung_table
from runtime.bench.targets import targets, targets_text
from runtime.bench.trajectory import screenshot, trajectory, unchanged_every
from runtime.context_budget import estimate_image_tokens
from runtime.engine_setup import BENCH_MODEL, ModelFiles, engine_config, load_engine, resolve_model
from runtime.metrics import rss_bytes, rss_peak_bytes
from runtime.run.agents import EpisodeEvent
from scheduler.sizes import format_bytes
from vmenv.errors import VmEnvError
from vmenv.trajectory import Trajectory, load_trajectory
from vmenv.trajectory_writer import write_durably

__all__ = ["Loaded", "concurrency_table", "fail", "load", "run"]


def fail(problem: str) -> int:
    print(f"kvagent bench: error: {problem}", file=sys.stderr)
    return 2


@attrs.define(eq=False)
class Loaded:
    """The engine loaded for the run's trajectory, the trajectory and what describes it."""
    files: ModelFiles
    engine: Engine
    traj: Trajectory
    steps: int
    size: tuple[int, int]
    tokens: int  # a screenshot's tokens
    rss_loaded: int  # the process's RSS with the model, projector and KV buffers in

    def progress(self, arm: str, e: EpisodeEvent) -> None:
        """One line per step of an arm, on stderr."""
        m = e.metrics
        if e.kind != "step" or m is None:
            return
        print(f"[{arm}] step {e.step}/{self.steps}: prefill {m.prefill_tokens} tok "
              f"({m.critical_path_prefill_tokens} on the critical path) in "
              f"{m.prefill_s:.2f} s + encode {m.encode_s:.2f} s, reused "
              f"{m.reused_tokens}, decode {m.decode_tokens} tok in {m.decode_s:.2f} s, "
              f"critical path {m.critical_path_s:.2f} s", file=sys.stderr, flush=True)


def _recorded(args: argparse.Namespace) -> Trajectory | None | str:
    """``--trajectory``'s recording (None without one), or the problem with it."""
    if args.trajectory is None:
        return None
    try:
        recorded = load_trajectory(args.trajectory)
    except VmEnvError as exc:
        return str(exc)
    if len(recorded.frames) < 2:
        return f"{args.trajectory} needs at least two screenshots"
    return recorded


def load(args: argparse.Namespace) -> Loaded | str:
    """The model loaded with a context for the trajectory (recorded or synthetic, its
    screenshots sized to ``--image-tokens`` or ``--screen``) and an embedding cache for one
    window per episode, emptied; or the problem."""
    recorded = _recorded(args)
    if isinstance(recorded, str):
        return recorded
    files = resolve_model(args.model, args.mmproj, default=BENCH_MODEL)
    if files.default is not None:
        print(f"using {files.default.describe()}: {files.model.parent}", file=sys.stderr)
    steps = len(recorded.frames) - 1 if recorded is not None else args.steps
    if args.screen is not None:  # size the context for what the projector makes of it
        assert files.mmproj is not None  # the bench resolves a vision model
        args.image_tokens = estimate_image_tokens(files.mmproj, args.screen)
    shot_tokens = args.image_tokens + 96
    decode = args.agent.decode_tokens  # the bench always fixes it (--decode-tokens N)
    assert decode is not None
    per_seq = max(4096, steps * (shot_tokens + decode) * 11 // 10 + 2048)
    try:
        config = engine_config(files.model, what="--steps, --image-tokens and --episodes",
                               n_ctx_per_seq=per_seq, n_seq_max=max(2, args.episodes + 1),
                               **args.engine_fields)
        engine = load_engine(files, config)
    except (KvagentCacheError, ValueError) as exc:
        return str(exc)
    if recorded is None:
        if args.screen is not None:
            w, h = args.screen
            tokens = engine.image_tokens(screenshot(0, w, h))[0]
        else:
            w, h, tokens = fit_resolution(
                lambda w, h: engine.image_tokens(screenshot(0, w, h))[0], args.image_tokens)
        traj = trajectory(steps, w, h, unchanged=unchanged_every(steps, args.unchanged_every))
    else:
        traj = recorded
        w, h = traj.frames[0].width, traj.frames[0].height
        tokens = engine.image_tokens(traj.frames[0].screenshot)[0]
    print(f"{engine.kind.value} model {files.model.name}, {engine.n_params / 1e6:.1f}M params; "
          f"screenshots {w}x{h} = {tokens} tokens (target {args.image_tokens}); "
          f"{steps} steps, window {args.agent.window_label}", file=sys.stderr)
    # Room for one window of screenshots plus the new one: retained screenshots are
    # re-prefilled from the cache instead of re-running the vision encoder.
    per_image = engine.encode_image(traj.frames[0].screenshot).nbytes
    engine.set_image_cache_bytes((args.agent.window + 1) * per_image * args.episodes)
    engine.clear_image_cache()  # every arm starts with a cold cache
    return Loaded(files, engine, traj, steps, (w, h), tokens, rss_bytes())


def run(args: argparse.Namespace) -> int:
    """The arms (and with ``--episodes N`` the concurrency phases): tables on stdout, the
    report in ``--json``, the plot in ``--plot`` (or beside the JSON)."""
    loaded = load(args)
    if isinstance(loaded, str):
        return fail(loaded)
    with loaded.engine:
        report = _measure(args, loaded)
    _print(report)
    _plot(args, loaded, report)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.json_out}")
    return 0


def _measure(args: argparse.Namespace, loaded: Loaded) -> dict[str, Any]:
    """Every arm, then (``--episodes N``) the concurrency phases; the report."""
    engine = loaded.engine
    results = run_arms(engine, args.arm_list, loaded.traj, args.agent,
                       vm_seconds=args.vm_seconds, on_event=loaded.progress)
    for res in results:
        if res.refused:
            print(f"[{res.arm}] refused: {res.refused}", file=sys.stderr)
    concurrency = _concurrency(args, engine, loaded.traj) if args.episodes > 1 else None
    ref = next((r.output_sha256 for r in results if r.arm == REFERENCE_ARM), None)
    arms = [{"arm": r.arm, "policy": r.policy, "overlap": r.overlap, "refused": r.refused,
             "steps": list(r.steps), "summary": summarize(r, ref, args.agent.window),
             "output_sha256": r.output_sha256, "bound": None} for r in results]
    blocks = analyze(arms)
    report: dict[str, Any] = {"config": _config(args, loaded), "arms": arms, **blocks}
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
    return report


def _config(args: argparse.Namespace, loaded: Loaded) -> dict[str, Any]:
    """The report's ``config``: what ran, on what, with which settings."""
    engine, agent = loaded.engine, args.agent
    return {
        "model": str(loaded.files.model), "mmproj": str(loaded.files.mmproj),
        "model_kind": engine.kind.value, "n_params": engine.n_params, "steps": loaded.steps,
        "window": agent.window, "pinned": agent.pinned,
        "trajectory": str(args.trajectory) if args.trajectory else None,
        "image_tokens_target": args.image_tokens, "image_tokens": loaded.tokens,
        "screenshot_size": list(loaded.size), "vm_seconds": args.vm_seconds,
        "profile": agent.profile, "decode_tokens": agent.decode_tokens,
        "grammar": agent.grammar, "stop_at_eog": agent.stop_at_eog,
        "temperature": agent.temperature, "threads": args.threads,
        "n_batch": engine.config.n_batch, "decode_rows": engine.config.decode_rows,
        "decode_shape": engine.decode_shape.describe(),
        "row_classes": engine.row_classes.describe(),
        "jump_forward": agent.jump_forward, "drafts": agent.drafts,
        "reference_arm": REFERENCE_ARM,
        "rss_after_load_bytes": loaded.rss_loaded, "rss_peak_bytes": rss_peak_bytes(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}"}


def _print(report: dict[str, Any]) -> None:
    """The tables on stdout: the arms', the concurrency phases' (if run), the targets."""
    arms = report["arms"]
    if arms:
        print(table(arms))
        print()
        print(time_table(arms))
        print()
        print(latency_table(arms, report["bound"]))
        print()
        print(bound_text(report))
    if "throughput" in report:  # the concurrency phases ran (--episodes N)
        print(concurrency_table(report))
    print()
    print(targets_text(report["targets"]))


def _plot(args: argparse.Namespace, loaded: Loaded, report: dict[str, Any]) -> None:
    """The PNG (``--plot``, else beside ``--json``), if an arm ran; its path in the report."""
    arms = report["arms"]
    plot: Path | None = args.plot or (args.json_out.with_suffix(".png") if args.json_out
                                      else None)
    report["plot"] = None
    if plot is None or all(a["refused"] for a in arms):
        return
    model = loaded.files.model
    report["plot"] = str(plot_bench(
        arms, report["bound"], plot,
        title=f"kvagent bench: {model.parent.name}/{model.name}, {loaded.steps} steps, "
              f"{loaded.tokens}-token screenshots, window {args.agent.window_label}, "
              f"VM {args.vm_seconds:g} s"))
    print(f"wrote {plot}")


def _concurrency(args: argparse.Namespace, engine: Engine, traj: Trajectory) -> dict:
    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    return anyio.run(lambda: measure_concurrency(
        engine, traj, args.agent, args.episodes, budget=args.budget,
        vm_seconds=args.vm_seconds, wait_s=args.wait_seconds, progress=say,
        compare_rung=args.compare_replay_rung, rung_repeats=args.rung_repeats))


def concurrency_table(c: dict) -> str:
    """The concurrency phases' lines: concurrent vs sequential, decode, the rung's table."""
    def counts(eps: list) -> str:
        statuses = [e["status"] for e in eps]
        return (f"{statuses.count('ok')} ok, {statuses.count('degraded')} degraded, "
                f"{statuses.count('failed')} failed")

    t, led = c["throughput"], c["ledger"]
    rung = [rung_table(c["replay_rung"])] if c.get("replay_rung") is not None else []
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
