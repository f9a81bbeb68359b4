"""Run GUI agents on the simulated desktop from Python: what ``kvagent run`` does, in short.

Two episodes run concurrently through one engine, scheduler and memory ledger; each step is
recorded in OSWorld's result layout under ./results-example, and progress goes to stderr.
The forged tiny model has random weights: its (grammar-constrained) actions are valid but
aimless — the example shows the runtime, not intelligence.

    python examples/run_simdesk.py     # a few seconds on 2 cores
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import anyio

from cachepolicy.engine import EngineConfig
from runtime.config import AgentConfig
from runtime.engine_setup import load_engine, resolve_model
from runtime.logs import configure_logging
from runtime.run.agents import RunConfig, run_agents
from runtime.run.progress import ProgressDisplay, summary_table
from runtime.run.recording import ResultLayout


def main() -> None:
    configure_logging("warning")
    files = resolve_model(None, None)  # the default model
    config = RunConfig(agent=AgentConfig(temperature=1.0), episodes=2,
                       tasks=("open-terminal", "click-ok"), max_steps=4, screen=(320, 240),
                       vm_seconds=0.05, memory_budget=1 << 30)
    # A 320x240 screenshot costs 80 tokens on this projector; size each sequence for that.
    engine_config = EngineConfig(n_ctx_per_seq=config.context_need(80).tokens,
                                 n_seq_max=config.episodes + 1, n_threads=2)
    layout = ResultLayout(Path("results-example"), model=files.name)
    progress = ProgressDisplay()
    with load_engine(files, engine_config) as engine:
        result = anyio.run(partial(run_agents, engine, config, layout, on_event=progress))
    progress.close()
    print(summary_table(result))
    for episode in result.episodes:
        print(f"{episode.episode_id}: {result.directories[episode.episode_id]}")


if __name__ == "__main__":
    main()
