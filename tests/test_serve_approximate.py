"""Approximate policies behind ``kvagent serve``, said out loud (issue 48 item 2).

The engine's own record first: a removal that shifts positions marks the survivors
(``Run.shifted``), so a sequence holding them is approximate whatever is fed after it, and
a trim below them makes it exact again.  Then real ``kvagent serve`` processes on loopback:
every chat answer (plain and streamed) and every episode step says whether it was decoded
from an approximate state, and ``/metrics`` counts those steps per policy; the default
(exact) server never marks one."""

from __future__ import annotations

from cachepolicy.engine.checkpoint import holds_shift


def test_a_shifting_removal_marks_the_survivors_until_they_are_gone(engines) -> None:
    e = engines("llama")
    e.clear(0)
    first, second, third = (e.tokenize(t) for t in ("one two three", "four five", "six"))
    for piece in (first, second, third):
        e.prefill_tokens(0, piece, logits=False)
    end = e.seq_info(0).next_pos
    e.remove_range(0, end - len(third), end)  # a tail: nothing shifts, still exact
    assert not holds_shift(e.seq_info(0).history)
    e.prefill_tokens(0, third, logits=False)
    e.remove_range(0, len(first), len(first) + len(second))  # the middle: the tail shifts
    hist = e.seq_info(0).history
    assert [r.shifted for r in hist] == [False, True] and holds_shift(hist)
    e.prefill_tokens(0, e.tokenize("seven"), logits=False)  # fed after it: still marked
    assert holds_shift(e.seq_info(0).history)
    e.truncate(0, len(first))  # the shifted runs are gone: exact again
    assert not holds_shift(e.seq_info(0).history)
    e.clear(0)


def test_relocate_marks_its_steps_from_its_first_slide_on(engines) -> None:
    """In the step records (and so bench JSON): relocate's steps are exact while the window
    fills and approximate from its first slide on (the splicing policies, kamera and the
    token evictors, mark every step that splices); the exact policy's never."""
    import attrs

    from replay_helpers import AGENT
    from runtime.bench.arms import run_arms
    from runtime.bench.trajectory import trajectory

    window = 3
    slot, rel = run_arms(engines("llama"), ["terminal-slot", "relocate"],
                         trajectory(6, 128, 96),
                         attrs.evolve(AGENT, window=window, decode_tokens=4))
    assert [s["approximate"] for s in slot.steps] == [False] * 6
    assert [s["approximate"] for s in rel.steps] == [False] * window + [True] * 3
    # what relocate skips: the retained screenshots are not prefilled again
    assert all(r["prefill_tokens"] < s["prefill_tokens"]
               for r, s in zip(rel.steps[window:], slot.steps[window:]))
