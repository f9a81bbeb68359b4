"""The squeeze without and with the fallback ladder's replay rung, side by side in one run
(``kvagent bench --episodes N --memory-budget B --compare-replay-rung``).

The same N teacher-forced episodes of one trajectory on the same budget, concurrently: with
the exact ladder (trim, evict, shrink) and with the replay rung allowed
(``AgentConfig.replay_rung``: idle episodes lose checkpoints and recurrent states before whole
caches, and replay a tail on their next step), in ABBA order when repeated so a drift in the
machine's load weighs on both alike.  The summary says how the two phases compare
in steps per second and CPU seconds (the work done, whatever else loads the machine), what
the rung did instead of evicting, and what it cost in exactness: every step decoded from an
approximate state is marked ``approximate`` in its record and counted, and a step whose
tokens differ from the back-to-back run's (exact) without that mark is counted apart
(``unmarked_differences``: 0 unless something is wrong).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from runtime.metrics import StepMetrics
from runtime.run.agents import RunResult
from scheduler.sizes import format_bytes

#: The name of the rung's phase in the bench's results (beside concurrent / sequential).
RUNG_PHASE = "concurrent+rung"


def _steps(run: RunResult) -> list[StepMetrics]:
    return [s for e in run.episodes for s in e.steps]


def _phase(runs: Sequence[tuple[RunResult, float]]) -> dict[str, Any]:
    """One variant over its repeats (run, CPU seconds): totals, and steps/s over them."""
    steps = [s for run, _ in runs for s in _steps(run)]
    wall = sum(run.wall_s for run, _ in runs)

    def count(key: str) -> int:
        return sum(run.counters.get(key, 0) for run, _ in runs)

    return {"repeats": len(runs), "steps": len(steps),
            "failed_steps": sum(s.status == "failed" for s in steps),
            "degraded_steps": sum(s.status == "degraded" for s in steps),
            "steps_per_s": len(steps) / wall if wall else 0.0,
            "wall_s": wall, "cpu_s": sum(c for _, c in runs),
            "wall_s_each": [run.wall_s for run, _ in runs],
            "cpu_s_each": [c for _, c in runs],
            "prefill_tokens": sum(s.prefill_tokens for s in steps),
            "replay_tokens": sum(s.replay_tokens for s in steps),
            "approximate_steps": sum(s.approximate for s in steps),
            "starts": dict(Counter(s.start for s in steps)),
            "evicted_episodes": count("evicted_episodes"),
            "trimmed_episodes": count("trimmed_episodes"),
            "replay_rung_checkpoints": count("replay_rung_checkpoints"),
            "replay_rung_recurrent": count("replay_rung_recurrent"),
            "ledger_peak_bytes": max(run.ledger_peak_bytes for run, _ in runs)}


def rung_summary(without: Sequence[tuple[RunResult, float]],
                 with_rung: Sequence[tuple[RunResult, float]],
                 sequential: RunResult) -> dict[str, Any]:
    """The two variants side by side, each a list of (run, CPU seconds) over its repeats;
    ``sequential`` (exact) is the reference each step's tokens are compared with."""
    a, b = _phase(without), _phase(with_rung)
    marked = unmarked = 0
    exact_identical = exact_episodes = 0
    for run, _ in with_rung:
        for ep, ref in zip(run.episodes, sequential.episodes):
            for s, r in zip(ep.steps, ref.steps):
                if s.output_tokens != r.output_tokens:
                    marked += s.approximate
                    unmarked += not s.approximate
            if not any(s.approximate for s in ep.steps):
                exact_episodes += 1
                exact_identical += ep.output_sha256 == ref.output_sha256
    return {"without": a, "with": b,
            # > 1: the phases with the rung did the same steps faster
            "steps_per_s_ratio": (b["steps_per_s"] / a["steps_per_s"]
                                  if a["steps_per_s"] else None),
            "cpu_ratio": a["cpu_s"] / b["cpu_s"] if b["cpu_s"] else None,
            "prefill_tokens_ratio": (b["prefill_tokens"] / a["prefill_tokens"]
                                     if a["prefill_tokens"] else None),
            "approximate_steps_differing": marked,
            "unmarked_differences": unmarked,
            "exact_episodes": exact_episodes,
            "exact_episodes_identical_to_sequential": exact_identical}


def rung_table(r: dict[str, Any]) -> str:
    """The comparison as the bench prints it."""
    rows = []
    for name, p in (("without the replay rung", r["without"]), ("with the replay rung", r["with"])):
        rows.append(
            f"{name} ({p['repeats']} run(s)): {p['steps_per_s']:.3f} steps/s ("
            f"{' + '.join(f'{w:.1f}' for w in p['wall_s_each'])} s, CPU "
            f"{' + '.join(f'{c:.1f}' for c in p['cpu_s_each'])} s); {p['failed_steps']} failed, {p['degraded_steps']} degraded "
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
    if r["prefill_tokens_ratio"] is not None:
        rows[-1] += f", prefill tokens with / without {r['prefill_tokens_ratio']:.2f}"
    rows.append(
        f"exactness: {r['approximate_steps_differing']} approximate step(s) decoded other tokens "
        f"than the sequential run, {r['unmarked_differences']} unmarked step(s) did; "
        f"{r['exact_episodes_identical_to_sequential']}/{r['exact_episodes']} episodes "
        "without an approximate step identical to the sequential run")
    return "\n".join(rows)
