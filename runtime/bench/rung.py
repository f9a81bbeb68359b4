"""The squeeze without and with the fallback ladder's replay rung, side by side in one run
(``kvagent bench --episodes N --memory-budget B --compare-replay-rung``).

The same N teacher-forced episodes of one trajectory on the same budget, concurrently: first
with the exact ladder (trim, evict, shrink), then with the replay rung allowed
(``AgentConfig.replay_rung``: idle episodes lose checkpoints and recurrent states before whole
caches, and replay a tail on their next step).  The summary says how the two phases compare
in steps per second and CPU seconds (the work done, whatever else loads the machine), what
the rung did instead of evicting, and what it cost in exactness: every step decoded from an
approximate state is marked ``approximate`` in its record and counted, and a step whose
tokens differ from the back-to-back run's (exact) without that mark is counted apart
(``unmarked_differences``: 0 unless something is wrong).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from runtime.metrics import StepMetrics
from runtime.run.agents import RunResult
from scheduler.sizes import format_bytes

#: The name of the rung's phase in the bench's results (beside concurrent / sequential).
RUNG_PHASE = "concurrent+rung"


def _steps(run: RunResult) -> list[StepMetrics]:
    return [s for e in run.episodes for s in e.steps]


def _phase(run: RunResult, cpu_s: float) -> dict[str, Any]:
    steps = _steps(run)
    c = run.counters
    return {"steps": len(steps),
            "failed_steps": sum(s.status == "failed" for s in steps),
            "degraded_steps": sum(s.status == "degraded" for s in steps),
            "steps_per_s": len(steps) / run.wall_s if run.wall_s else 0.0,
            "wall_s": run.wall_s, "cpu_s": cpu_s,
            "prefill_tokens": sum(s.prefill_tokens for s in steps),
            "replay_tokens": sum(s.replay_tokens for s in steps),
            "approximate_steps": sum(s.approximate for s in steps),
            "starts": dict(Counter(s.start for s in steps)),
            "evicted_episodes": c.get("evicted_episodes", 0),
            "trimmed_episodes": c.get("trimmed_episodes", 0),
            "replay_rung_checkpoints": c.get("replay_rung_checkpoints", 0),
            "replay_rung_recurrent": c.get("replay_rung_recurrent", 0),
            "ledger_peak_bytes": run.ledger_peak_bytes}


def rung_summary(without: RunResult, with_rung: RunResult, sequential: RunResult,
                 cpu_without: float, cpu_with: float) -> dict[str, Any]:
    """The two concurrent phases side by side; ``sequential`` (exact, no pressure beyond
    the budget's) is the reference each step's tokens are compared with."""
    a, b = _phase(without, cpu_without), _phase(with_rung, cpu_with)
    marked = unmarked = 0
    exact_identical = exact_episodes = 0
    for ep, ref in zip(with_rung.episodes, sequential.episodes):
        for s, r in zip(ep.steps, ref.steps):
            if s.output_tokens != r.output_tokens:
                marked += s.approximate
                unmarked += not s.approximate
        if not any(s.approximate for s in ep.steps):
            exact_episodes += 1
            exact_identical += ep.output_sha256 == ref.output_sha256
    return {"without": a, "with": b,
            # > 1: the phase with the rung did the same steps faster
            "steps_per_s_ratio": (b["steps_per_s"] / a["steps_per_s"]
                                  if a["steps_per_s"] else None),
            "cpu_ratio": a["cpu_s"] / b["cpu_s"] if b["cpu_s"] else None,
            "approximate_steps_differing": marked,
            "unmarked_differences": unmarked,
            "exact_episodes": exact_episodes,
            "exact_episodes_identical_to_sequential": exact_identical}


def rung_table(r: dict[str, Any]) -> str:
    """The comparison as the bench prints it."""
    rows = []
    for name, p in (("without the replay rung", r["without"]), ("with the replay rung", r["with"])):
        rows.append(
            f"{name}: {p['steps_per_s']:.3f} steps/s ({p['wall_s']:.1f} s, CPU "
            f"{p['cpu_s']:.1f} s); {p['failed_steps']} failed, {p['degraded_steps']} degraded "
            f"of {p['steps']}; prefill {p['prefill_tokens']} tokens (replayed "
            f"{p['replay_tokens']}); {p['evicted_episodes']} evictions, "
            f"{p['replay_rung_checkpoints']} checkpoint drops, {p['replay_rung_recurrent']} "
            f"recurrent-state drops; approximate steps {p['approximate_steps']}; ledger peak "
            f"{format_bytes(p['ledger_peak_bytes'])}")
    ratio, cpu = r["steps_per_s_ratio"], r["cpu_ratio"]
    rows.append(
        f"replay rung: steps/s with / without {ratio:.2f}" if ratio is not None
        else "replay rung: steps/s with / without n/a")
    rows[-1] += (f", CPU without / with {cpu:.2f}" if cpu is not None else "")
    rows.append(
        f"exactness: {r['approximate_steps_differing']} approximate step(s) decoded other tokens "
        f"than the sequential run, {r['unmarked_differences']} unmarked step(s) did; "
        f"{r['exact_episodes_identical_to_sequential']}/{r['exact_episodes']} episodes "
        "without an approximate step identical to the sequential run")
    return "\n".join(rows)
