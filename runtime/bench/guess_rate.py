"""How often the unchanged-screenshot guess hits, read off a run's ``metrics.jsonl`` files:
``python -m runtime.bench.guess_rate RESULT_DIR [RESULT_DIR ...]``.

Any run that records metrics (``kvagent run`` on simdesk or a replay, a trained agent's
held-out runs, ``KvAgent`` in OSWorld) can be measured: run it with ``--guess always`` to
count how often a step's screenshot is its predecessor's (every step after the first gets a
guess when the VM outlasts the prefetch), or with ``--guess auto`` to see how many of those
the default realises.  Per directory: steps, guesses made, hits, the hit rate, and the mean
critical path and critical-path prefill tokens of hits against misses.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def step_records(root: Path) -> list[dict[str, Any]]:
    """Every step record of every ``metrics.jsonl`` under ``root`` (lines that do not
    parse, and lines without a step, are skipped)."""
    out = []
    for path in sorted(root.rglob("metrics.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "step" in rec and "guess" in rec:
                out.append(rec)
    return out


def rates(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    recs = list(records)
    hits = [r for r in recs if r.get("guess") == "hit"]
    misses = [r for r in recs if r.get("guess") == "miss"]

    def mean(rs: Sequence[dict[str, Any]], key: str) -> float | None:
        vals = [r[key] for r in rs if isinstance(r.get(key), int | float)]
        return statistics.fmean(vals) if vals else None

    guessed = len(hits) + len(misses)
    return {"steps": len(recs), "guesses": guessed, "hits": len(hits),
            "hit_rate": len(hits) / guessed if guessed else None,
            "critical_path_s_hit": mean(hits, "critical_path_s"),
            "critical_path_s_miss": mean(misses, "critical_path_s"),
            "critical_prefill_tokens_hit": mean(hits, "critical_path_prefill_tokens"),
            "critical_prefill_tokens_miss": mean(misses, "critical_path_prefill_tokens")}


def main(argv: Sequence[str] | None = None) -> int:
    roots = [Path(a) for a in (sys.argv[1:] if argv is None else argv)]
    if not roots or any(not r.is_dir() for r in roots):
        print("usage: python -m runtime.bench.guess_rate RESULT_DIR [RESULT_DIR ...]",
              file=sys.stderr)
        return 2
    for root in roots:
        r = rates(step_records(root))
        rate = f"{r['hit_rate']:.0%}" if r["hit_rate"] is not None else "-"
        print(f"{root}: {r['steps']} steps, {r['guesses']} guesses, {r['hits']} hits ({rate})")
        print(json.dumps(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
