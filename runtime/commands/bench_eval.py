"""``kvagent bench-eval``: task success per cache policy on held-out simdesk instances
(``runtime.bench.evaluate``).

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
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cachepolicy.engine import Engine
    from runtime.config import AgentConfig
    from runtime.engine_setup import ModelFiles
    from runtime.run.agents import EpisodeEvent

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
                   help="only this kind, or these kinds in turn (default: every kind in turn)")
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
    p.add_argument("--concurrency", type=int, default=4,
                   help="episodes at once through the scheduler (outputs do not depend on it)")
    add_engine_arguments(p)
    p.add_argument("--json", type=Path, dest="json_out",
                   help="write every instance's episode under every arm here")
    add_agent_arguments(p)
    p.set_defaults(policy="terminal-scratch", overlap=False)  # each arm sets its own


def _check(args: argparse.Namespace) -> str | None:
    from cachepolicy.policies import names
    from runtime.arg_parsers import check_range, parse_wxh
    from runtime.bench.arms import ArmSpec
    from runtime.commands.options import agent_config, engine_fields
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
    if args.model is not None and args.mmproj is None:
        return "--model needs --mmproj: the agents read screenshots"
    args.arm_list = arms
    return None


def _load(args: argparse.Namespace, files: ModelFiles, arms: list[str]) -> Engine:
    """The engine, each sequence sized for the largest arm's prompt (measured with the
    projector on a real first screen)."""
    from cachepolicy.errors import PolicyRefusedError
    from runtime.bench.arms import ArmSpec
    from runtime.context_budget import ContextNeed, estimate_image_tokens
    from runtime.engine_setup import engine_config, load_engine
    from runtime.run.agents import RunConfig
    from vmenv.simdesk import DeskState, resolve_task
    from vmenv.simdesk.render import render_png
    from vmenv.simdesk.tasks import default_tasks

    def arm_agent(arm: str) -> AgentConfig | None:
        try:
            return ArmSpec.parse(arm).agent(args.agent)
        except PolicyRefusedError:
            return None  # refused when its turn comes (the others run): nothing to size

    agents = [c for c in map(arm_agent, arms) if c is not None] or [args.agent]

    def need(image_tokens: int) -> ContextNeed:
        return max((RunConfig(agent=agent, max_steps=args.max_steps, screen=args.screen_wh)
                    .context_need(image_tokens) for agent in agents), key=lambda c: c.tokens)

    w, h = args.screen_wh
    probe = render_png(resolve_task(args.tasks[0], default_tasks()).setup(DeskState.empty(w, h)))
    return load_engine(
        files, lambda n_ctx: engine_config(
            files.model, what="--max-steps, --concurrency, --window and --screen",
            n_ctx_per_seq=max(n_ctx, 512), n_seq_max=args.concurrency + 1,
            **args.engine_fields),
        need=lambda e: need(e.image_tokens(probe)[0]),
        n_ctx=need(estimate_image_tokens(files.mmproj, args.screen_wh)).tokens)


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem:
        print(f"kvagent bench-eval: error: {problem}", file=sys.stderr)
        return 2
    from cachepolicy.errors import KvagentCacheError
    from runtime.bench.evaluate import (
        cost_table, judge, kind_table, run_arms, success_table, with_references,
    )
    from runtime.commands.options import model_files
    from runtime.engine_setup import DEMO_MODEL

    arms = list(with_references(args.arm_list))
    try:
        files = model_files(args, DEMO_MODEL)
        engine = _load(args, files, arms)
    except (KvagentCacheError, ValueError, OSError) as exc:
        print(f"kvagent bench-eval: error: {exc}", file=sys.stderr)
        return 2
    if (note := files.note()) is not None:
        print(note, file=sys.stderr, flush=True)
    w, h = args.screen_wh
    with engine:
        print(f"held-out evaluation: {len(args.tasks)} instance(s) ({args.seeds} seeds) x "
              f"{len(arms)} arm(s), up to {args.max_steps} steps, {engine.kind.value} model "
              f"{files.model.name}, profile {args.agent.profile}, window {args.agent.window_label}, "
              f"screen {w}x{h}", file=sys.stderr, flush=True)

        def progress(arm: str, e: EpisodeEvent) -> None:
            if e.kind == "end":
                print(f"[{arm}] {e.spec.task}: {e.status} after {e.step} step(s), reward "
                      f"{e.reward or 0:g}", file=sys.stderr, flush=True)

        runs = run_arms(engine, arms, args.tasks, args.agent, max_steps=args.max_steps,
                        screen=args.screen_wh, vm_seconds=args.vm_seconds,
                        clock_step_s=args.clock_step,
                        concurrency=args.concurrency, on_event=progress)
        judged = judge(runs, args.tasks, args.agent.window)
        report = {"config": {
            "model": str(files.model), "mmproj": str(files.mmproj),
            "model_kind": engine.kind.value, "instances": len(args.tasks), "seeds": args.seeds,
            "max_steps": args.max_steps, "screen": [w, h], "vm_seconds": args.vm_seconds,
            "clock_step_s": args.clock_step,
            "concurrency": args.concurrency, "agent": _agent_dict(args.agent)},
            "tasks": list(args.tasks), "arms": judged}
    print(success_table(judged))
    print()
    print(cost_table(judged))
    print()
    print(kind_table(judged))
    if args.json_out is not None:
        from vmenv.trajectory_writer import write_durably

        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        write_durably(args.json_out, json.dumps(report, indent=1).encode())
        print(f"wrote {args.json_out}")
    broken = [a["arm"] for a in judged if a.get("agreement") and a["exact_expected"]
              and not a["agreement"]["exact_holds"]]
    if broken:
        print(f"exact arm(s) differ from their reference: {', '.join(broken)}",
              file=sys.stderr)
        return 1
    return 0


def _agent_dict(agent: object) -> dict[str, object]:
    import attrs

    return json.loads(json.dumps(attrs.asdict(agent), default=str))  # type: ignore[arg-type]
