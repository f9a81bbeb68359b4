"""``kvagent bench decode-arms`` (``kvagent bench --decode-arms``): terminal-slot with overlap
once per decode variant on the arms bench's engine and trajectory (``run_arms.load``), side
by side — the decode's share of the critical path and whether the actions stay the same
(``runtime.bench.decode_arms``).

Exit status 0 when the actions are identical within the lanes variants and within the runs
variants, 1 when not, 2 when the model does not load.
"""

from __future__ import annotations

import argparse
import json

from runtime.bench.decode_arms import run_variants, summarize, table
from runtime.bench.run_arms import Loaded, fail, load
from vmenv.trajectory_writer import write_durably

__all__ = ["run"]


def run(args: argparse.Namespace) -> int:
    """``args``: the arms bench's checked options with ``args.decode_variants``."""
    loaded = load(args)
    if isinstance(loaded, str):
        return fail(loaded)
    with loaded.engine:
        return _measure(args, loaded)


def _measure(args: argparse.Namespace, loaded: Loaded) -> int:
    engine, agent = loaded.engine, args.agent
    config = {"model": str(loaded.files.model), "steps": loaded.steps,
              "image_tokens": loaded.tokens, "screenshot_size": list(loaded.size),
              "vm_seconds": args.vm_seconds, "unchanged_every": args.unchanged_every,
              "threads": args.threads, "grammar": agent.grammar,
              "decode_tokens": agent.decode_tokens, "window": agent.window,
              "pinned": agent.pinned}
    runs = run_variants(engine, loaded.traj, agent, args.decode_variants, rounds=args.rounds,
                        vm_seconds=args.vm_seconds, on_event=loaded.progress)
    summary = summarize(runs)
    print(f"row classes: {engine.row_classes.describe()}")
    print(table(summary))
    groups = ({n for n in summary if n.startswith("lanes")},
              {n for n in summary if n.startswith("runs")})
    same = all(len({h for n in g for h in summary[n]["output_sha256"]}) <= 1 for g in groups)
    print(f"actions identical within lanes and within runs: {str(same).lower()}")
    if args.json_out is not None:
        config.update(row_classes=engine.row_classes.as_dict(), rounds=args.rounds)
        write_durably(args.json_out, json.dumps(
            {"config": config, "decode_arms": summary, "identical_within_shapes": same,
             "steps": {f"{r.variant} r{r.round}": r.arm.steps for r in runs}},
            indent=1).encode())
    return 0 if same else 1
