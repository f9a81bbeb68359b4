"""``kvagent bench [NAME]``: the bench family on the command line (``runtime.bench.family``)
and the arms bench's options.

``FAMILY`` is every bench by name: ``arms`` (the default: the cache policies side by side on
one replayed trajectory) and its modes ``study``, ``decode-arms`` and ``rung`` — one option
set, one run, the mode chosen by an option (``--scenario study``, ``--decode-arms``,
``--compare-replay-rung``: the older spellings) — and the benches of their own, each with its
options in ``runtime/commands/bench_<name>.py``.  Here: the arms bench's options and their
checks; what it measures and reports is ``runtime.bench.run_arms`` (and ``run_decode_arms``,
``study``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench, BenchFamily
from runtime.commands import (
    bench_decode, bench_encode, bench_eval, bench_kernels, bench_peer, bench_replay_prefix,
    bench_serve,
)
from scheduler.release import STALL_TIMEOUT_S

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
    p.add_argument("--wait-seconds", type=float, default=STALL_TIMEOUT_S,
                   help="the scheduler's wait for memory: it gives up when no release can "
                        "come, or after this many seconds without any job's progress")
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
    # arms set their own policy; an approximate arm's drift (KL, top-1 against its exact
    # prompt) is measured unless --no-replay-drift: its reference prefill runs inside the
    # step, so time approximate arms without it (the study does)
    p.set_defaults(policy="terminal-slot", overlap=False, replay_drift=True)


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
    from runtime.engine_setup import check_model_choice

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
        check_model_choice(args.model, args.mmproj)
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
    """The arms bench in the mode its options choose: ``--scenario study`` (four ordinary
    runs of this one, ``runtime.bench.study``), ``--decode-arms`` or the policy arms (with
    ``--episodes N``, ``--compare-replay-rung``: the concurrency phases)."""
    if args.scenario == "study":
        from runtime.bench.study import run_study
        return run_study(args, run)
    problem = _check(args)
    if problem:
        print(f"kvagent bench: error: {problem}", file=sys.stderr)
        return 2
    if args.decode_arms is not None:
        from runtime.bench import run_decode_arms
        return run_decode_arms.run(args)
    from runtime.bench import run_arms
    return run_arms.run(args)


ARMS = Bench("arms", HELP, add_arguments, run)
#: the modes of the arms bench: its options and run, the mode's option set
MODES = (
    Bench("study", "the arms bench in the study's setting: the forged qwen35 L Q4_K_M, "
          "1280x720 and 1920x1080 screenshots x K = 3 and 5, one grid (= --scenario study)",
          add_arguments, run, defaults=(("scenario", "study"),)),
    Bench("decode-arms", "terminal-slot+overlap once per decode variant: the decode's share "
          "of the critical path and the actions' hashes (= --decode-arms [VARIANTS])",
          add_arguments, run, defaults=(("decode_arms", "all"),)),
    Bench("rung", "with --episodes N and a --memory-budget: the concurrent phase without and "
          "with the fallback ladder's replay rung (= --compare-replay-rung)",
          add_arguments, run, defaults=(("compare_replay_rung", True),)),
)
#: every bench of ``kvagent bench NAME``, in the order --help lists them
FAMILY = BenchFamily((ARMS, *MODES, bench_decode.BENCH, bench_encode.BENCH, bench_eval.BENCH,
                      bench_kernels.BENCH, bench_peer.BENCH, bench_replay_prefix.BENCH,
                      bench_serve.BENCH), default=ARMS.name)
