"""``kvagent bench eval`` (``kvagent bench-eval``): task success per cache policy on held-out
simdesk instances — the engine sized for the largest arm, the arms run, judged and reported
(the evaluation: ``runtime.bench.evaluate``; the arguments and why this is a bench of its own:
``runtime/commands/bench_eval.py``).

Exit status: 0 when every arm ran (whatever the success rate) and every exact arm agreed with
its reference on every step; 1 when an exact arm did not; 2 for a model that does not load.
"""

from __future__ import annotations

import argparse
import json
import sys

import attrs

from cachepolicy.engine import Engine
from cachepolicy.errors import KvagentCacheError, PolicyRefusedError
from runtime.bench.arms import ArmSpec
from runtime.bench.evaluate import (
    cost_table, judge, kind_table, run_arms, success_table, with_references,
)
from runtime.config import AgentConfig
from runtime.context_budget import ContextNeed, estimate_image_tokens
from runtime.engine_setup import DEMO_MODEL, ModelFiles, engine_config, load_engine, resolve_model
from runtime.run.agents import EpisodeEvent, RunConfig
from runtime.run.success import rule_label, success_rule
from vmenv.simdesk import DeskState, resolve_task
from vmenv.simdesk.render import render_png
from vmenv.simdesk.tasks import default_tasks
from vmenv.trajectory_writer import write_durably

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``args``: the checked options of ``kvagent bench eval`` (``args.arm_list``,
    ``args.tasks``, ``args.screen_wh``, ``args.agent``, ``args.engine_fields``)."""
    arms = list(with_references(args.arm_list))
    try:
        files = resolve_model(args.model, args.mmproj, default=DEMO_MODEL)
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
              f"{files.model.name}, profile {args.agent.profile}, window "
              f"{args.agent.window_label}, "
              f"screen {w}x{h}, success by {rule_label(success_rule(args.stop_on_success))}",
              file=sys.stderr, flush=True)

        def progress(arm: str, e: EpisodeEvent) -> None:
            if e.kind == "end":
                print(f"[{arm}] {e.spec.task}: {e.status} after {e.step} step(s), reward "
                      f"{e.reward or 0:g}", file=sys.stderr, flush=True)

        runs = run_arms(engine, arms, args.tasks, args.agent, max_steps=args.max_steps,
                        screen=args.screen_wh, vm_seconds=args.vm_seconds,
                        clock_step_s=args.clock_step, stop_on_success=args.stop_on_success,
                        concurrency=args.concurrency, on_event=progress)
        judged = judge(runs, args.tasks, args.agent.window)
        report = {"config": {
            "model": str(files.model), "mmproj": str(files.mmproj),
            "model_kind": engine.kind.value, "instances": len(args.tasks), "seeds": args.seeds,
            "max_steps": args.max_steps, "screen": [w, h], "vm_seconds": args.vm_seconds,
            "clock_step_s": args.clock_step,
            "success_rule": success_rule(args.stop_on_success),
            "concurrency": args.concurrency, "agent": _agent_dict(args.agent)},
            "tasks": list(args.tasks), "arms": judged}
    print(success_table(judged))
    print()
    print(cost_table(judged))
    print()
    print(kind_table(judged))
    if args.json_out is not None:
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


def _load(args: argparse.Namespace, files: ModelFiles, arms: list[str]) -> Engine:
    """The engine, each sequence sized for the largest arm's prompt (measured with the
    projector on a real first screen)."""
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


def _agent_dict(agent: object) -> dict[str, object]:
    return json.loads(json.dumps(attrs.asdict(agent), default=str))  # type: ignore[arg-type]
