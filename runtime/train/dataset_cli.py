"""The dataset's command line: ``python -m runtime.train.dataset_cli --out DIR [--episodes N]
[--seed S] [--model F --mmproj F]`` writes
simdesk training shards through one engine (docs/training-data.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from runtime.train.dataset import DatasetConfig, DatasetError, generate


def main(argv: Sequence[str] | None = None) -> int:
    # model files and engine sizing (the forge, llama.cpp): the command line's only
    from runtime.engine_setup import DEMO_MODEL, engine_config, load_engine, resolve_model

    p = argparse.ArgumentParser(prog="python -m runtime.train.dataset_cli",
                                description="write simdesk training shards (see the module "
                                            "docstring and docs/training-data.md)")
    d = DatasetConfig()
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--episodes", type=int, default=d.episodes)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--perturbed", type=float, default=d.perturbed,
                   help="share of episodes knocked off-track once (a changed desktop)")
    p.add_argument("--slipped", type=float, default=d.slipped,
                   help="share of episodes where the agent makes one mistake (in the "
                        "history, not a target)")
    p.add_argument("--early-typing", type=float, default=d.early_typing,
                   help="share of slipped episodes whose mistake is typing the task's text "
                        "before its field is ready")
    p.add_argument("--max-slip-run", type=int, default=d.max_slip_run,
                   help="a slipped episode makes 1..N mistakes in a row")
    p.add_argument("--variants", type=int, default=d.variants)
    p.add_argument("--shard-episodes", type=int, default=d.shard_episodes)
    p.add_argument("--with-done", action="store_true")
    p.add_argument("--model", type=Path)
    p.add_argument("--mmproj", type=Path)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    config = DatasetConfig(seed=args.seed, episodes=args.episodes, perturbed=args.perturbed,
                           slipped=args.slipped, early_typing=args.early_typing,
                           max_slip_run=args.max_slip_run,
                           variants=args.variants, shard_episodes=args.shard_episodes,
                           with_done=args.with_done)
    files = resolve_model(args.model, args.mmproj, default=DEMO_MODEL)
    fields = {"n_threads": args.threads} if args.threads else {}
    engine = load_engine(files, engine_config(files.model, what="the dataset's engine",
                                              n_ctx_per_seq=512, n_seq_max=1, n_batch=512,
                                              **fields))
    with engine:
        try:
            m = generate(engine, config, args.out, files=files, overwrite=args.overwrite,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
        except DatasetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(json.dumps(m["totals"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
