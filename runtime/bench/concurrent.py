"""Many bench episodes at once through one scheduler, then the same ones back to back.

Both phases run the shipping loop (``run_replay`` → ``run_agents``), overlap included when the
agent config has it: each episode replays the trajectory on its own sequence and waits
``vm_seconds`` per action (the VM executing it) without holding the engine — which is where
concurrency pays: one episode's VM time is another's engine time.  With ``compare_rung`` the
concurrent phase runs without and with the fallback ladder's replay rung on the same budget,
alternating ABBA over ``rung_repeats`` pairs (``runtime.bench.rung``).  Every phase starts
with a cold embedding cache.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import anyio
import attrs

from cachepolicy.engine import Engine
from runtime.bench.order import abba
from runtime.bench.rung import RUNG_PHASE, rung_summary
from runtime.run.replay import replay_run_config, run_replay
from runtime.config import AgentConfig
from runtime.run.agents import RunConfig, RunResult
from scheduler.sizes import Budget, format_bytes
from vmenv.trajectory import Trajectory


def _episodes(run: RunResult) -> list[dict[str, Any]]:
    return [{"episode": e.episode_id, "status": e.admission, "error": e.error or None,
             "output_sha256": e.output_sha256, "steps": [s.as_dict() for s in e.steps]}
            for e in run.episodes]


async def measure_concurrency(engine: Engine, traj: Trajectory, agent: AgentConfig, n: int, *,
                              budget: Budget, vm_seconds: float, wait_s: float,
                              progress: Callable[[str], None],
                              summary_every_s: float = 1.0,
                              compare_rung: bool = False,
                              rung_repeats: int = 1) -> dict[str, Any]:
    """Calibrate one episode's peak if the budget is relative, then N episodes concurrently
    (``compare_rung``: without the replay rung and with it, ``rung_repeats`` times each in
    ABBA order) and the same N back to back, each phase under the resolved budget."""
    if compare_rung:
        agent = attrs.evolve(agent, replay_rung=False)
    calibration = None
    if budget.relative:
        progress("measuring one episode's peak (calibration run)")
        one = replay_run_config(agent, traj, vm_seconds=0.0)
        calibration = (await run_replay(engine, one, traj, prefix="calib")).ledger_peak_bytes
    nbytes = budget.resolve(calibration)
    progress(f"budget {format_bytes(nbytes)}"
             + (f" ({budget}: {format_bytes(calibration)})" if calibration else ""))
    config = replay_run_config(agent, traj, episodes=n, vm_seconds=vm_seconds,
                               memory_budget=nbytes, wait_s=wait_s)
    rung_config = attrs.evolve(config, agent=attrs.evolve(agent, replay_rung=True))
    phases: dict[str, RunResult] = {}
    decode: dict[str, dict[str, float]] = {}
    cpu: dict[str, float] = {}  # this process's CPU seconds (all threads) per phase

    async def run_phase(phase: str, phase_config: RunConfig, sequential: bool) -> None:
        engine.clear_image_cache()  # every phase starts cold: the same work in each
        before = engine.decode_stats()
        cpu0 = time.process_time()
        last = {"summary": ""}

        def on_event(e: Any) -> None:
            last["summary"] = e.summary

        async with anyio.create_task_group() as tg:
            async def report() -> None:
                while True:
                    await anyio.sleep(summary_every_s)
                    progress(f"[{phase}] {last['summary']}")
            tg.start_soon(report)
            phases[phase] = await run_replay(engine, phase_config, traj, prefix=phase[:3],
                                             sequential=sequential, on_event=on_event)
            tg.cancel_scope.cancel()
        decode[phase] = (engine.decode_stats() - before).as_dict()
        cpu[phase] = time.process_time() - cpu0

    if compare_rung:  # A B, B A, ...: a drift in the machine's load weighs on both alike
        names: tuple[list[str], list[str]] = ([], [])
        for r, variant in abba(rung_repeats):
            name = ("concurrent", RUNG_PHASE)[variant] + (f"#{r + 1}" if r else "")
            names[variant].append(name)
            await run_phase(name, (config, rung_config)[variant], False)
    else:
        await run_phase("concurrent", config, False)
    await run_phase("sequential", config, True)
    conc, seq = phases["concurrent"], phases["sequential"]
    steps = sum(e.n_steps for e in conc.episodes)
    identical = [a.output_sha256 == b.output_sha256 for a, b in zip(conc.episodes, seq.episodes)]
    rung = None
    if compare_rung:
        rung = rung_summary([(phases[p], cpu[p]) for p in names[0]],
                            [(phases[p], cpu[p]) for p in names[1]], seq)
        rung["episodes"] = _episodes(phases[RUNG_PHASE])
        rung["scheduler"] = phases[RUNG_PHASE].counters
        rung["decode"] = decode[RUNG_PHASE]
    return {
        "replay_rung": rung,
        "episodes": _episodes(conc),
        "sequential_episodes": _episodes(seq),
        "outputs_identical_to_sequential": all(identical),
        "ledger": {"budget_bytes": nbytes, "peak_bytes": conc.ledger_peak_bytes,
                   "sequential_peak_bytes": seq.ledger_peak_bytes,
                   "one_episode_peak_bytes": calibration},
        "throughput": {"concurrent_steps_per_s": steps / conc.wall_s,
                       "sequential_steps_per_s": steps / seq.wall_s,
                       "ratio": seq.wall_s / conc.wall_s,
                       # work done, whatever else runs on the machine: the CPU seconds of
                       # each phase (concurrency may cost more work: re-encoded images, ...)
                       "concurrent_cpu_s": cpu["concurrent"],
                       "sequential_cpu_s": cpu["sequential"],
                       "concurrent_wall_s": conc.wall_s, "sequential_wall_s": seq.wall_s},
        "scheduler": {"concurrent": conc.counters, "sequential": seq.counters},
        # decode calls in each phase: rows per call and tokens per second of llama_decode
        "decode": {**decode, "speedup": (decode["concurrent"]["tokens_per_s"]
                                         / decode["sequential"]["tokens_per_s"]
                                         if decode["sequential"]["tokens_per_s"] else 0.0)},
    }
