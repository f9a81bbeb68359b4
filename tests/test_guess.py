"""The unchanged screenshot: after the prefetch, the current screenshot is prefilled as the
guess for the next one (its checkpoint kept apart, in the ledger).  A right guess leaves the
step its closing text and the decode; a wrong one is cut back before the guessed image.
Either way the outputs are bitwise those of terminal-scratch (the exactness reference) and of
terminal-slot with overlap and no guess — and the ledger matches the engine throughout
(``KVAGENT_DEBUG``: every scheduler checks its integrity when idle)."""

from __future__ import annotations

import attrs
import pytest

from cachepolicy.segments import SegmentFactory
from runtime.bench.trajectory import trajectory
from scheduler.ledger import MemoryLedger
from scheduler.scheduler import Scheduler

from replay_helpers import AGENT, OPTIONS, SCREEN, outputs, replay

UNCHANGED = frozenset({2, 3, 5})
STEPS = 7


async def _replay(engine, agent, *, vm_seconds: float):
    traj = trajectory(STEPS, *SCREEN, unchanged=UNCHANGED)
    factory = SegmentFactory(engine)
    ledger = MemoryLedger(1 << 40)
    async with Scheduler(engine, ledger, factory, options=OPTIONS) as sched:
        (result,) = await replay(sched, traj, 1, agent=agent, vm_seconds=vm_seconds)
    assert ledger.snapshot().held == 0 and ledger.snapshot().reserved == 0
    assert result.status != "error", result.error
    return result


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
async def test_guesses_change_no_output(engines, arch) -> None:
    e = engines(arch)
    scratch = await _replay(e, attrs.evolve(AGENT, policy="terminal-scratch", overlap=False),
                            vm_seconds=0.0)
    no_guess = await _replay(e, attrs.evolve(AGENT, overlap=True, guess="off"),
                             vm_seconds=0.3)
    # a VM second: time for the guess to reach its image even on a loaded machine
    guessed = await _replay(e, attrs.evolve(AGENT, overlap=True, guess="always"),
                            vm_seconds=1.0)
    assert outputs(scratch) == outputs(no_guess) == outputs(guessed)
    assert all(s.guess == "" for s in scratch.steps + no_guess.steps)
    # after step 0 every step had a guess: right where the screen did not change
    kinds = [s.guess for s in guessed.steps]
    assert kinds == [""] + ["hit" if i in UNCHANGED else "miss" for i in range(1, STEPS)]
    for plain, g in zip(no_guess.steps[1:], guessed.steps[1:]):
        if g.guess == "hit":  # the step prefilled only its closing text and the generation
            assert g.start == "keep"  # prompt: the guess did the screenshot
            assert g.critical_path_prefill_tokens < plain.critical_path_prefill_tokens
            assert g.guess_prefill_tokens > 0
        elif g.start == "keep":  # stopped before it reached its image: nothing to cut
            assert (g.critical_path_prefill_tokens + g.guess_prefill_tokens
                    == plain.critical_path_prefill_tokens)
        else:  # cut back before the guessed image: the screenshot's label stays
            assert g.start == ("truncate" if e.kind.has_recurrent_state else "trim")
            assert g.critical_path_prefill_tokens < plain.critical_path_prefill_tokens


async def test_auto_guesses_only_when_the_vm_leaves_time(engines) -> None:
    """auto: no guess before the VM's time is known, none when the VM is quicker than the
    prefetch; the outputs are the same either way."""
    e = engines("qwen35")
    quick = await _replay(e, attrs.evolve(AGENT, overlap=True, guess="auto"), vm_seconds=0.0)
    assert all(s.guess == "" for s in quick.steps)
    # a VM second, as above: the prefetch must finish inside it even on a loaded machine
    # (at 0.5 s a CI run on a busy host once saw no hit)
    slow = await _replay(e, attrs.evolve(AGENT, overlap=True, guess="auto"), vm_seconds=1.0)
    assert slow.steps[1].guess == ""  # step 1: no VM time measured yet
    assert any(s.guess == "hit" for s in slow.steps)
    assert outputs(quick) == outputs(slow)
