"""relocate's prefetch (issue 48): the window's slide and the action text happen during the VM
time, so a step prefills only its new screenshot and the generation prompt — with the same
cache, and the same answer, as when the step does it all itself."""

from __future__ import annotations

import attrs

from replay_helpers import AGENT
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory


def test_relocate_with_overlap_answers_alike_with_less_on_the_critical_path(engines) -> None:
    window, steps = 3, 6
    plain, ahead = run_arms(engines("llama"), ["relocate", "relocate+overlap"],
                            trajectory(steps, 128, 96),
                            attrs.evolve(AGENT, window=window, decode_tokens=4))
    # the same answers, token for token, and the same steps marked approximate
    assert [s["output_tokens"] for s in ahead.steps] == [s["output_tokens"] for s in plain.steps]
    assert [s["approximate"] for s in ahead.steps] == [False] * window + [True] * (steps - window)
    # the same work, less of it waited for: after the first step only the new screenshot and
    # the generation prompt are on the critical path (the action text and, from the first
    # slide on, the cut and shift ran in the prefetch)
    assert sum(s["prefill_tokens"] for s in ahead.steps) == sum(
        s["prefill_tokens"] for s in plain.steps)
    for p, a in zip(plain.steps[1:], ahead.steps[1:]):
        assert p["critical_path_prefill_tokens"] == p["prefill_tokens"]
        assert a["critical_path_prefill_tokens"] < p["critical_path_prefill_tokens"]
    new_shot = {a["critical_path_prefill_tokens"] for a in ahead.steps[1:]}
    assert len(new_shot) == 1, new_shot  # every step: one screenshot and the prompt's tail
