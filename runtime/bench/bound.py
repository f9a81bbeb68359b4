"""The wall-time bound of an episode, and the study's optimum — both computed from the
step records of one bench run, never typed in.

The bound of a step is what the step cannot avoid: the VM executing the action, encoding
and prefilling only the genuinely new content (the new screenshot, the text delta, the
generation prompt: ``new_content_tokens``), and decoding the action::

    bound_i = vm_s_i + encode_i + new_content_tokens_i × prefill_s_per_token + decode_s_i

with speeds measured in the same run:

* ``prefill_s_per_token`` — the fastest whole-episode prefill rate of any arm: its LLM
  prefill seconds (restores and checkpoints included) over every token it prefilled;
* ``encode_i`` — the fastest vision-encoder time any arm measured at step i (every arm
  encodes the same screenshot there);
* ``vm_s_i``, ``decode_s_i`` — the arm's own (decode is the same tokens at the arm's own
  context: the bound does not make a long context cheaper to decode).

So for an arm without overlap the bound is at most its wall time (it prefilled at least the
new content, at no better than the fastest rate); with overlap the prefetch's prefill hides
in VM time and the wall can come under it.

The study's optimum (evict's bounded context, only new content prefilled) is its own
formula — evict's wall − (evict's prefill s/step − noevict's prefill s/step) × steps — fed
with this run's evict and noevict records.  It is computed, not run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Steps = Sequence[Mapping[str, Any]]


def prefill_rate(arms: Mapping[str, Steps]) -> tuple[float, str] | None:
    """(seconds per prefilled token, the arm it comes from): the fastest arm's episode."""
    rates = []
    for name, steps in arms.items():
        tokens = sum(s["prefill_tokens"] for s in steps)
        if tokens:
            rates.append((sum(s["prefill_s"] for s in steps) / tokens, name))
    return min(rates) if rates else None


def lowest(columns: Sequence[Sequence[float]]) -> list[float]:
    """Per index, the lowest value of the columns that reach it."""
    n = max((len(c) for c in columns), default=0)
    return [min(c[i] for c in columns if i < len(c)) for i in range(n)]


def encode_floor(arms: Mapping[str, Steps]) -> list[float]:
    """Per step, the lowest ``encode_s`` any arm measured (steps some arm ran)."""
    return lowest([[s["encode_s"] for s in steps] for steps in arms.values()])


def step_bounds(steps: Steps, s_per_token: float, encode: Sequence[float]) -> dict[str, Any]:
    """An arm's bound: per step on the critical path (encode + new-content prefill +
    decode), per step with the VM time, and their episode sum."""
    critical = [encode[i] + s["new_content_tokens"] * s_per_token + s["decode_s"]
                for i, s in enumerate(steps)]
    with_vm = [c + s["vm_s"] for c, s in zip(critical, steps)]
    return {"episode_s": sum(with_vm), "steps_s": with_vm, "critical_path_steps_s": critical}


def study_optimum(evict_wall_s: float, evict_prefill_s_per_step: float,
                  noevict_prefill_s_per_step: float, steps: float) -> float:
    """The study's formula: evict's wall with its prefill replaced by noevict's
    (new content only), step for step."""
    return evict_wall_s - (evict_prefill_s_per_step - noevict_prefill_s_per_step) * steps


def optimum(evict: Steps, evict_wall_s: float, noevict: Steps) -> dict[str, Any]:
    """The study's optimum from this run's evict and noevict records, with its inputs and
    the arithmetic spelled out (``text``) so a reader can redo it."""
    n = len(evict)
    e = sum(s["prefill_s"] for s in evict) / n
    ne = sum(s["prefill_s"] for s in noevict) / len(noevict)
    value = study_optimum(evict_wall_s, e, ne, n)
    return {"computed_not_run": True,
            "formula": "evict wall_s - (evict prefill_s/step - noevict prefill_s/step) x steps",
            "evict_wall_s": evict_wall_s, "evict_prefill_s_per_step": e,
            "noevict_prefill_s_per_step": ne, "steps": n, "optimum_s": value,
            "text": f"{evict_wall_s:.2f} - ({e:.3f} - {ne:.3f}) x {n} = {value:.2f} s"}
