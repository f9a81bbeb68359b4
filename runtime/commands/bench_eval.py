"""``kvagent bench eval`` (``kvagent bench-eval``): task success per cache policy on held-out
simdesk instances (``runtime.bench.evaluate``; the run and its report:
``runtime.bench.run_eval``; here, the options and their checks).

A sibling of ``kvagent bench`` rather than a mode of it: the bench measures cost on one
replayed, teacher-forced trajectory with a fixed decode (16 tokens, no grammar, end of
generation ignored, so arms compare); an evaluation needs the opposite — the agent decoding
as it ships (the profile's grammar, stopping at the end of generation: ``AgentConfig``'s
defaults), acting on a live simdesk with a checker, on many sampled instances.  Almost no
option of the bench would mean the same here.

Exit status: 0 when every arm ran (whatever the success rate) and every exact arm agreed with
its reference on every step; 1 when an exact arm did not; 2 for bad arguments or a model
that does not load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.bench.family import Bench

HELP = ("task success per cache policy on held-out simdesk instances (95% CI, per kind) and "
        "per-step agreement with each policy's exact reference")

MAX_INSTANCES = 10_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    from runtime.bench.evaluate import DEFAULT_ARMS
    from vmenv.simdesk.render import SECONDS_PER_STEP
    from runtime.commands.options import (
        add_agent_arguments, add_engine_arguments, add_model_arguments,
    )
    from runtime.engine_setup import DEMO_MODEL

    add_model_arguments(p, DEMO_MODEL)
    p.add_argument("--instances", type=int, default=40,
                   help="held-out instances (instance i: kind i mod 8 on the i-th evaluation "
                        "seed; default 40)")
    p.add_argument("--task", default=None, metavar="KIND[,KIND...]",
                   help="only this kind, or these kinds in turn; look-back names "
                        "remember-code,marked-launch, dense the dense-* kinds, classic the "
                        "classic-* kinds (default: the eight kinds of kvagent run's default "
                        "mix in turn; marked-launch, dense-* and classic-* only when named)")
    p.add_argument("--seeds", default="eval", metavar="eval|A-B",
                   help="seeds of the instances (default eval: held out from training)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help="comma-separated policies, each optionally +overlap; an approximate "
                        "one may name its replay budget, tail-replay@5%%, tail-replay@64 "
                        f"(default: {','.join(DEFAULT_ARMS)}; relocate is skipped where the "
                        "model cannot run it)")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--screen", default="640x384",
                   help="simdesk screen WxH (min 320x240; the shipped agents know 640x384)")
    p.add_argument("--vm-seconds", type=float, default=0.0,
                   help="simulated VM time per action (0: as fast as the model)")
    p.add_argument("--clock-step", type=int, default=SECONDS_PER_STEP, metavar="SECONDS",
                   help="simulated seconds simdesk's clock advances a step (default "
                        f"{SECONDS_PER_STEP}: every screenshot differs; 0: the clock stands "
                        "still, so a step that changed nothing shows the same pixels — what "
                        "the unchanged-screenshot guess and kamera's +recall can reuse)")
    p.add_argument("--stop-on-success", action="store_true",
                   help="also end an episode the moment simdesk's checker passes (the old "
                        "rule; default: OSWorld's — only the agent's done() / fail() or "
                        "--max-steps end it, success is the checker on the final state)")
    p.add_argument("--concurrency", type=int, default=4,
                   help="episodes at once through the scheduler (outputs do not depend on it)")
    add_engine_arguments(p)
    p.add_argument("--json", type=Path, dest="json_out",
                   help="write every instance's episode under every arm here")
    add_agent_arguments(p)
    # each arm sets its own policy; an evaluation measures every approximate step's drift
    # against its exact prompt (not timed): --no-replay-drift skips it
    p.set_defaults(policy="terminal-scratch", overlap=False, replay_drift=True)


def _check(args: argparse.Namespace) -> str | None:
    from cachepolicy.policies import names
    from runtime.arg_parsers import check_range, parse_wxh
    from runtime.bench.arms import ArmSpec
    from runtime.commands.options import agent_config, engine_fields
    from runtime.engine_setup import check_model_choice
    from runtime.run.instances import CLASSIC, check_task, episode_tasks, parse_seeds

    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms:
        return (f"unknown arm(s) {args.arms!r}; choose from {', '.join(names())} (each "
                "optionally with +overlap; an approximate one with @<replay budget>)")
    try:
        for arm in arms:
            ArmSpec.parse(arm)
    except ValueError as exc:
        return str(exc)
    if not 1 <= args.instances <= MAX_INSTANCES:
        return f"--instances must be 1..{MAX_INSTANCES}"
    if not 1 <= args.max_steps <= 100 or not 1 <= args.concurrency <= 64:
        return "--max-steps must be 1..100 and --concurrency 1..64"
    try:
        check_model_choice(args.model, args.mmproj)
        if args.task is not None and "@" in check_task(args.task):
            return "--task takes a kind here (instances come from --seeds)"
        seeds = parse_seeds(args.seeds)
        if seeds.name == CLASSIC:
            return "--seeds classic: the evaluation runs sampled instances"
        args.tasks = episode_tasks(args.instances, seeds, args.task)
        args.screen_wh = parse_wxh(args.screen, option="--screen", low=(320, 240),
                                   high=(7680, 4320))
        check_range(args.vm_seconds, option="--vm-seconds", low=0, high=3600)
        check_range(args.clock_step, option="--clock-step", low=0, high=86400)
        args.engine_fields = engine_fields(args)
        args.agent = agent_config(args)
    except ValueError as exc:
        return str(exc)
    args.arm_list = arms
    return None


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"kvagent bench-eval: error: {problem}", file=sys.stderr)
        return 2
    from runtime.bench import run_eval
    return run_eval.run(args)


BENCH = Bench("eval", HELP, add_arguments, run, alias="bench-eval")
