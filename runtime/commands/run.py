"""``kvagent run``: GUI agents on the simulated desktop, concurrently, through one engine.

Every episode gets its own simulated desktop (or replayed trajectory) and sequence; all share
one engine, scheduler and memory budget.  Decoding is grammar-constrained, so every action
is valid; with the forged random-weight model the actions are aimless — the run shows the
runtime (overlap, bounded exact caching, admission), not intelligence.  Results go to
``--result-dir`` in OSWorld's layout, plus ``kvagent_steps.png``.  A rerun into the same
result dir resumes the run (finished episodes kept, the others restarted), refuses to mix in
a run with other options, or starts fresh with ``--overwrite`` (``runtime.run.result_dir``).

Exit status: 0 when every episode ran (whether or not it solved its task), 1 when an episode
failed with an error, 2 for bad arguments, a result dir that cannot take the run, or a model
that does not load (nothing written).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import attrs

HELP = ("run GUI agents concurrently on the simulated desktop through one engine and "
        "scheduler; record OSWorld-style results and a per-step plot")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.commands.options import (
        add_agent_arguments, add_engine_arguments, add_model_arguments,
    )
    from runtime.engine_setup import DEMO_MODEL
    from runtime.env_loop import DEFAULT_ENV_TIMEOUT_S
    from runtime.run import envs

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--env", default=envs.names()[0], choices=envs.names(),
                   help="where the agents act (runtime/run/envs: one file per env)")
    for name in envs.names():
        envs.get(name).add_arguments(p)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget (2GiB, 512MiB; default: the memory available now)")
    p.add_argument("--result-dir", type=Path, default=Path("results"))
    p.add_argument("--overwrite", action="store_true",
                   help="delete this run's earlier results in --result-dir and start fresh "
                        "(default: resume a run with the same options, refuse another)")
    add_engine_arguments(p)
    p.add_argument("--screen", default="640x384",
                   help="simdesk screen WxH (min 320x240; the shipped agents know 640x384)")
    p.add_argument("--vm-seconds", type=float, default=0.3,
                   help="simulated time the VM takes per action (what overlap hides)")
    p.add_argument("--env-timeout", type=float, default=DEFAULT_ENV_TIMEOUT_S,
                   help="seconds an env step may take before it is abandoned and recorded "
                        f"as failed (default {DEFAULT_ENV_TIMEOUT_S:g}: OSWorld's 120 s "
                        "execute timeout, its pause and a screenshot)")
    p.add_argument("--stop-on-success", action="store_true",
                   help="also end an episode the moment simdesk's checker passes (the old "
                        "rule; default: OSWorld's — only the agent's done() / fail() or "
                        "--max-steps end it, and success is the checker on the final state)")
    add_agent_arguments(p)


def _error(message: str) -> int:
    print(f"kvagent run: error: {message}", file=sys.stderr)
    return 2


#: Steps of one episode at the most (the context is sized from it).
MAX_STEPS = 1000
MAX_EPISODES = 64


def _check(args: argparse.Namespace) -> str | None:
    """Validate everything that needs no model; fills ``args.screen_wh`` / ``budget`` /
    ``agent``."""
    from runtime.arg_parsers import check_range, parse_memory_budget, parse_wxh
    from runtime.commands.options import agent_config, engine_fields
    from runtime.engine_setup import available_memory, check_model_choice

    for name, top in (("episodes", MAX_EPISODES), ("max_steps", MAX_STEPS)):
        if not 1 <= getattr(args, name) <= top:
            return f"--{name.replace('_', '-')} must be 1..{top}"
    try:
        args.engine_fields = engine_fields(args)
        check_range(args.vm_seconds, option="--vm-seconds", low=0, high=3600)
        check_range(args.env_timeout, option="--env-timeout", low=0, high=3600,
                    low_open=True)
        args.agent = agent_config(args)
        args.screen_wh = parse_wxh(args.screen, option="--screen", low=(320, 240),
                                   high=(7680, 4320))
        budget = parse_memory_budget(args.memory_budget)
    except ValueError as exc:
        return str(exc)
    if args.env == "simdesk" and args.vm_seconds >= args.env_timeout:
        return (f"--vm-seconds {args.vm_seconds:g} would time out every step "
                f"(--env-timeout {args.env_timeout:g})")
    args.budget = available_memory() if budget.unlimited else budget.resolve()
    try:
        check_model_choice(args.model, args.mmproj)
    except ValueError as exc:
        return str(exc)
    from runtime.run import envs

    problem = envs.foreign_options(args) or envs.get(args.env).check(args)
    if problem:
        return problem
    if args.result_dir.exists() and not args.result_dir.is_dir():
        return f"--result-dir {args.result_dir} exists and is not a directory"
    from runtime.run.result_dir import ResultDirError, check_writable

    try:
        check_writable(args.result_dir)  # up front: not after the model has loaded
    except ResultDirError as exc:
        return f"--result-dir: {exc}"
    return None


def _setup(args: argparse.Namespace) -> Any:
    """(config, specs, make_env, teacher, layout) of the chosen env; raises on bad input."""
    from runtime.run import envs
    from runtime.run.recording import ResultLayout

    setup = envs.get(args.env).setup(args, {
        "agent": args.agent, "episodes": args.episodes, "max_steps": args.max_steps,
        "screen": args.screen_wh, "vm_seconds": args.vm_seconds, "memory_budget": args.budget,
        "env_timeout_s": args.env_timeout, "stop_on_success": args.stop_on_success})
    return (setup.config, setup.specs, setup.make_env, setup.teacher,
            ResultLayout(args.result_dir, args.model_name, setup.domain))


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        return _error(problem)
    from runtime.commands.options import model_files
    from runtime.engine_setup import DEMO_MODEL
    from runtime.run.recording import RecordingError
    from vmenv.errors import VmEnvError

    try:
        files = model_files(args, DEMO_MODEL)
    except (ValueError, OSError) as exc:  # OSError: the default could not be forged
        return _error(f"{exc}")
    args.model_name = files.name
    try:
        config, specs, make_env, teacher, layout = _setup(args)
        for spec in specs:
            layout.task_dir(spec.task_id)  # refuse unsafe names before anything is written
    except (RecordingError, VmEnvError, ValueError) as exc:
        return _error(str(exc))
    if (note := files.note()) is not None:
        print(note, flush=True)
    from runtime.run.result_dir import plan_resume

    try:  # reads only: a refusal leaves the result dir as it was
        plan = plan_resume(layout, _manifest(args, config, files),
                           [s.task_id for s in specs], overwrite=args.overwrite)
    except (RecordingError, OSError) as exc:
        return _error(str(exc))
    if plan.resuming or plan.overwrite:
        print(plan.describe(), flush=True)
    specs = tuple(s for s in specs if s.task_id in plan.run)
    if not specs:
        print("every episode of this run is finished; nothing to do (--overwrite to rerun)")
        return 0
    return _run_loaded(args, config, specs, make_env, teacher, layout, files, plan)


def _manifest(args: argparse.Namespace, config: Any, files: Any) -> dict[str, Any]:
    """What makes a rerun the same run (see ``runtime.run.result_dir``)."""
    from cachepolicy.engine.loading import file_identity
    from runtime.run.result_dir import manifest

    return manifest(
        model={"name": files.model.name, "identity": file_identity(files.model)},
        mmproj={"name": files.mmproj.name, "identity": file_identity(files.mmproj)},
        env=args.env, trajectory=str(args.trajectory.resolve()) if args.trajectory else None,
        agent=attrs.asdict(config.agent), max_steps=config.max_steps,
        screen=list(config.screen), success_rule=config.success_rule)


def _probe_screenshot(make_env: Any, spec: Any) -> bytes:
    """The first screen of an episode (sizes the context and the image cache)."""
    import anyio

    async def first() -> bytes:
        env = make_env(spec)
        try:
            return (await env.reset(spec.task)).screenshot
        finally:
            await env.close()

    return anyio.run(first)


def _engine_config(args: argparse.Namespace, config: Any, files: Any,
                   n_ctx: int) -> Any:
    """The engine's config for ``n_ctx`` tokens per sequence; ValueError naming the options
    when it is out of bounds or would not fit in memory (before anything loads)."""
    from runtime.engine_setup import engine_config

    return engine_config(files.model, what="--max-steps, --episodes, --window and --screen",
                         n_ctx_per_seq=max(n_ctx, 512), n_seq_max=config.episodes + 1,
                         **args.engine_fields)


def _load(files: Any, args: argparse.Namespace, config: Any, probe: bytes) -> Any:
    """Load the engine with each sequence sized for the run (estimated from the projector's
    metadata, then checked with the real screenshot's token count: reloaded once if the
    projector surprised us); the image cache holds every episode's window."""
    from runtime.context_budget import estimate_image_tokens
    from runtime.engine_setup import load_engine

    engine = load_engine(
        files, lambda n_ctx: _engine_config(args, config, files, n_ctx),
        need=lambda e: config.context_need(e.image_tokens(probe)[0]),
        n_ctx=config.context_need(estimate_image_tokens(files.mmproj, config.screen)).tokens)
    try:
        # room for every episode's window plus the incoming screenshot, no more
        per_image = engine.encode_image(probe).nbytes
        engine.set_image_cache_bytes(per_image * (config.agent.window + 1) * config.episodes)
    except BaseException:
        engine.close()
        raise
    return engine


def _run_loaded(args: argparse.Namespace, config: Any, specs: Any, make_env: Any,
                teacher: Any, layout: Any, files: Any, plan: Any) -> int:
    import anyio

    from cachepolicy.errors import KvagentCacheError
    from cachepolicy.segments import SegmentFactory
    from runtime.context_budget import estimate_image_tokens
    from runtime.run.plot import PLOT_FILE, plot_steps
    from runtime.run.progress import ProgressDisplay, summary_table
    from runtime.run.agents import run_agents
    from runtime.run.recording import RecordingError
    from runtime.run.result_dir import remove_stale_temporaries
    from runtime.run.success import rule_label
    from scheduler.sizes import format_bytes

    agent = config.agent
    try:  # every bound before the model loads (the estimate; rechecked when measured)
        _engine_config(args, config, files, config.context_need(
            estimate_image_tokens(files.mmproj, config.screen)).tokens)
        probe = _probe_screenshot(make_env, specs[0])
        engine = _load(files, args, config, probe)
    except (KvagentCacheError, ValueError) as exc:
        return _error(str(exc))
    progress = ProgressDisplay(sys.stderr)
    with engine:
        print(f"{engine.kind.value} model {files.model.name} ({engine.n_params / 1e6:.1f}M params), "
              f"{len(specs)} episode(s) x {config.max_steps} steps, policy "
              f"{agent.policy}, profile {agent.profile}, window {agent.window_label}, overlap "
              f"{'on' if agent.overlap else 'off'}, screen "
              f"{config.screen[0]}x{config.screen[1]}, success by "
              f"{rule_label(config.success_rule)}", flush=True)
        for differs in agent.make_profile().layout.unhonoured:
            print(f"profile {agent.profile}: unlike its training, {differs}", flush=True)
        try:  # a policy this model cannot run is refused before anything is written
            agent.make_policy(SegmentFactory(engine), config.screen)
        except KvagentCacheError as exc:
            return _error(str(exc))
        try:
            plan.apply()
        except (RecordingError, OSError) as exc:
            return _error(f"cannot prepare {layout.domain_dir}: {exc}")
        try:
            result = anyio.run(lambda: run_agents(engine, config, layout, specs=specs,
                                                  make_env=make_env, teacher=teacher,
                                                  on_event=progress))
        except KvagentCacheError as exc:  # e.g. a policy refused on this model kind
            return _error(str(exc))
        finally:
            progress.close()
            try:  # what interrupted atomic writes left behind (a full disk, a kill)
                remove_stale_temporaries(layout, [s.task_id for s in specs])
            except OSError as exc:
                print(f"kvagent run: warning: could not tidy {layout.domain_dir}: {exc}",
                      file=sys.stderr)
    print(summary_table(result))
    steps = sum(e.n_steps for e in result.episodes)
    print(f"{steps} steps in {result.wall_s:.1f} s; ledger peak "
          f"{format_bytes(result.ledger_peak_bytes)}; {result.summary}")
    try:
        plot = plot_steps({f"{e.episode_id} {e.task}": [s.as_dict() for s in e.steps]
                           for e in result.episodes},
                          args.result_dir / PLOT_FILE,
                          title=f"{args.model_name}: {agent.policy}, overlap "
                                f"{'on' if agent.overlap else 'off'}")
        print(f"plot: {plot}")
    except OSError as exc:  # the results are on disk: a missing plot is not worth a traceback
        print(f"kvagent run: warning: could not write the plot: {exc}", file=sys.stderr)
    print(f"results: {layout.domain_dir}")
    if result.errors:
        print(f"kvagent run: {len(result.errors)} episode(s) ended in an error (causes above "
              f"and in their traj.jsonl); they have no result.txt, so rerunning the same "
              f"command retries them and keeps the finished ones", file=sys.stderr)
    return 1 if result.errors else 0
