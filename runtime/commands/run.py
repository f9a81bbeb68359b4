"""``kvagent run``: GUI agents on the simulated desktop, concurrently, through one engine.

Every episode gets its own simulated desktop (or replayed trajectory) and sequence; all share
one engine, scheduler and memory budget.  Decoding is grammar-constrained, so every action
is valid; with the forged random-weight model the actions are aimless — the run shows the
runtime (overlap, bounded exact caching, admission), not intelligence.  Results go to
``--result-dir`` in OSWorld's layout, plus ``kvagent_steps.png``.

Exit status: 0 when every episode ran (whether or not it solved its task), 1 when an episode
failed with an error, 2 for bad arguments or a model that does not load (nothing written).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

HELP = ("run GUI agents concurrently on the simulated desktop through one engine and "
        "scheduler; record OSWorld-style results and a per-step plot")
POLICIES = ("terminal-slot", "terminal-scratch", "evict", "noevict", "relocate")
TASKS = ("open-terminal", "type-in-field", "click-ok", "save-note")  # vmenv.simdesk_tasks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, help="GGUF model (default: forge the tiny qwen35)")
    p.add_argument("--mmproj", type=Path, help="vision projector GGUF (required with --model)")
    p.add_argument("--policy", default="terminal-slot", choices=POLICIES)
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True,
                   help="prefetch the next step while the VM executes the action")
    p.add_argument("--env", default="simdesk", choices=("simdesk", "replay"))
    p.add_argument("--trajectory", type=Path, help="trajectory directory for --env replay")
    p.add_argument("--task", choices=TASKS,
                   help="simdesk task of every episode (default: episode i gets task i mod 4)")
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--memory-budget", default=None,
                   help="ledger budget (2GiB, 512MiB; default: the memory available now)")
    p.add_argument("--result-dir", type=Path, default=Path("results"))
    p.add_argument("--window", type=int, default=3, help="screenshots the model sees (K)")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--screen", default="640x360", help="simdesk screen WxH (min 320x240)")
    p.add_argument("--vm-seconds", type=float, default=0.3,
                   help="simulated time the VM takes per action (what overlap hides)")


def _error(message: str) -> int:
    print(f"kvagent run: error: {message}", file=sys.stderr)
    return 2


def _default_budget() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 40


def _check(args: argparse.Namespace) -> str | None:
    """Validate everything that needs no model; fills ``args.screen_wh`` / ``budget``."""
    from runtime.sizes import parse_bytes

    for name in ("episodes", "max_steps", "window", "threads"):
        if getattr(args, name) < 1:
            return f"--{name.replace('_', '-')} must be >= 1"
    if args.temperature < 0:
        return "--temperature must be >= 0"
    if args.vm_seconds < 0:
        return "--vm-seconds must be >= 0"
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", args.screen)
    if not m or not (320 <= int(m[1]) <= 7680 and 240 <= int(m[2]) <= 4320):
        return f"--screen {args.screen!r}: give WxH between 320x240 and 7680x4320"
    args.screen_wh = (int(m[1]), int(m[2]))
    try:
        args.budget = (parse_bytes(args.memory_budget) if args.memory_budget is not None
                       else _default_budget())
    except ValueError as exc:
        return f"--memory-budget: {exc}"
    if (args.model is None) != (args.mmproj is None):
        return "--model and --mmproj go together (screenshots need a vision projector)"
    if args.env == "replay" and args.trajectory is None:
        return "--env replay needs --trajectory DIR"
    if args.env == "simdesk" and args.trajectory is not None:
        return "--trajectory is only for --env replay"
    if args.result_dir.exists() and not args.result_dir.is_dir():
        return f"--result-dir {args.result_dir} exists and is not a directory"
    return None


def _setup(args: argparse.Namespace) -> Any:
    """(config, specs, make_env, layout) for the chosen env; raises on bad input."""
    from runtime.recording import ResultLayout
    from runtime.run_agents import AgentRunConfig, EpisodeSpec, simdesk_env, simdesk_specs

    kw: dict[str, Any] = {
        "episodes": args.episodes, "policy": args.policy, "overlap": args.overlap,
        "max_steps": args.max_steps, "window": args.window, "temperature": args.temperature,
        "seed": args.seed, "screen": args.screen_wh, "vm_seconds": args.vm_seconds,
        "memory_budget": args.budget}
    if args.task:
        kw["tasks"] = (args.task,)
    if args.env == "simdesk":
        config = AgentRunConfig(**kw)
        return (config, simdesk_specs(config), simdesk_env(config),
                ResultLayout(args.result_dir, args.model_name, "simdesk"))
    from vmenv.replay import ReplayEnv
    from vmenv.trajectory import load_trajectory

    traj = load_trajectory(args.trajectory)
    if len(traj.frames) < 2:
        raise ValueError(f"{args.trajectory}: a replay needs at least two screenshots")
    first = traj.frames[0]
    config = AgentRunConfig(**{**kw, "screen": (first.width, first.height),
                               "tasks": ("replay",)})
    name = args.trajectory.resolve().name
    specs = tuple(EpisodeSpec(i, f"ep{i}", "replay", f"{name}-ep{i}",
                              traj.instruction or "Complete the task on the screen.")
                  for i in range(config.episodes))
    return (config, specs, lambda spec: ReplayEnv(traj, vm_seconds=config.vm_seconds),
            ResultLayout(args.result_dir, args.model_name, "replay"))


def _estimate_image_tokens(mmproj: Path, width: int, height: int) -> int:
    """An upper bound of a screenshot's tokens from the projector's metadata (the context
    must be sized before the model loads; the real count is checked after loading)."""
    try:
        from gguf import GGUFReader

        fields = GGUFReader(str(mmproj)).fields

        def value(key: str) -> Any:
            return fields[key].contents() if key in fields else None

        patch = int(value("clip.vision.patch_size") or 14)
        merge = value("clip.vision.spatial_merge_size")
        if merge is None and "qwen" not in str(value("clip.projector_type") or ""):
            size = int(value("clip.vision.image_size") or 336)  # fixed-size projector
            return (size // patch) ** 2
        cell = patch * int(merge or 2)
        return -(-width // cell) * -(-height // cell)
    except Exception:  # noqa: BLE001  unreadable metadata: 14 px patches, no merging
        return -(-width // 14) * -(-height // 14)


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        return _error(problem)
    model, mmproj = args.model, args.mmproj
    args.model_name = model.stem if model is not None else "forged-qwen35-tiny"
    from runtime.recording import RecordingError
    from vmenv.errors import VmEnvError

    try:
        config, specs, make_env, layout = _setup(args)
        for spec in specs:
            layout.task_dir(spec.task_id)  # refuse unsafe names before anything is written
    except (RecordingError, VmEnvError, ValueError) as exc:
        return _error(str(exc))
    if model is None:
        from cachepolicy.forge import ForgeError, forge_cached

        try:
            forged = forge_cached("qwen35", "tiny", vision=True)
        except (ForgeError, OSError) as exc:
            return _error(f"cannot forge the tiny model: {exc}")
        model, mmproj = forged.model_path, forged.mmproj_path
        print(f"no --model: using the forged tiny qwen35 model with vision "
              f"({forged.model_path.parent}). Its weights are random: actions are valid "
              f"(grammar-constrained) but aimless; this run shows the runtime, not "
              f"intelligence.", flush=True)
    return _run_loaded(args, config, specs, make_env, layout, model, mmproj)


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


def _load(model: Path, mmproj: Path, args: argparse.Namespace, config: Any, probe: bytes,
          bounded: bool) -> Any:
    """Load the engine with each sequence sized for the run, then check the estimate with
    the real screenshot token count (reloading once if the projector surprised us)."""
    from cachepolicy.engine import Engine, EngineConfig

    w, h = config.screen
    n_ctx = config.context_tokens(_estimate_image_tokens(mmproj, w, h), bounded=bounded)
    for _ in range(2):
        engine = Engine(model, mmproj, EngineConfig(
            n_ctx_per_seq=max(n_ctx, 512), n_seq_max=config.episodes + 1,
            n_threads=args.threads))
        try:
            need = config.context_tokens(engine.image_tokens(probe)[0], bounded=bounded)
            if need <= engine.config.n_ctx_per_seq:
                # room for every episode's window plus the incoming screenshot, no more
                per_image = engine.encode_image(probe).nbytes
                engine.image_cache.max_bytes = (per_image * (config.window + 1)
                                                * config.episodes)
                return engine
        except BaseException:
            engine.close()
            raise
        engine.close()
        n_ctx = need
    raise AssertionError("unreachable: the second load is sized from the measured count")


def _run_loaded(args: argparse.Namespace, config: Any, specs: Any, make_env: Any, layout: Any,
                model: Path, mmproj: Path) -> int:
    import anyio

    import cachepolicy.policies  # noqa: F401  (registers the built-in policies)
    from cachepolicy.base import POLICIES
    from cachepolicy.errors import KvagentCacheError
    from runtime.plot import PLOT_FILE, plot_steps
    from runtime.progress import ProgressDisplay, summary_table
    from runtime.run_agents import run_agents
    from runtime.sizes import format_bytes

    bounded = POLICIES[config.policy].manifest.bounded
    try:
        probe = _probe_screenshot(make_env, specs[0])
        engine = _load(model, mmproj, args, config, probe, bounded)
    except KvagentCacheError as exc:
        return _error(str(exc))
    progress = ProgressDisplay(sys.stderr)
    with engine:
        print(f"{engine.kind.value} model {model.name} ({engine.n_params / 1e6:.1f}M params), "
              f"{config.episodes} episode(s) x {config.max_steps} steps, policy "
              f"{config.policy}, overlap {'on' if config.overlap else 'off'}, screen "
              f"{config.screen[0]}x{config.screen[1]}", flush=True)
        try:
            result = anyio.run(lambda: run_agents(engine, config, layout, specs=specs,
                                                  make_env=make_env, on_event=progress))
        except KvagentCacheError as exc:  # e.g. a policy refused on this model kind
            return _error(str(exc))
        finally:
            progress.close()
    plot = plot_steps({f"{e.spec.episode_id} {e.spec.task}": e.metrics for e in result.episodes},
                      args.result_dir / PLOT_FILE,
                      title=f"{args.model_name}: {config.policy}, overlap "
                            f"{'on' if config.overlap else 'off'}")
    print(summary_table(result))
    steps = sum(e.steps for e in result.episodes)
    print(f"{steps} steps in {result.wall_s:.1f} s; ledger peak "
          f"{format_bytes(result.ledger_peak_bytes)}; {result.summary}")
    print(f"plot: {plot}")
    print(f"results: {layout.domain_dir}")
    return 1 if result.errors else 0
