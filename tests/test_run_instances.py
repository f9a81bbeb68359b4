"""Which task each episode of ``kvagent run`` (and ``bench-eval``) runs: sampled instances on
held-out seeds by default, training seeds, a seed range, one instance, or the classic tasks."""

from __future__ import annotations

import pytest

from runtime.run.agents import RunConfig, simdesk_specs
from runtime.run.instances import (
    SeedChoice, check_task, episode_tasks, kind_of, parse_seeds,
)
from runtime.run.success import PairedDifference, SuccessRate, wilson_interval
from vmenv.simdesk import default_tasks, eval_seeds, is_eval_seed, sample_task, task_kinds


def test_default_is_every_kind_on_the_held_out_seeds() -> None:
    kinds, n = task_kinds(), 10
    tasks = episode_tasks(n)
    assert tasks == episode_tasks(n, parse_seeds("eval"))
    seeds = eval_seeds(n)
    assert tasks == tuple(f"{kinds[i % len(kinds)]}@{seeds[i]}" for i in range(n))
    assert tasks[:3] == ("open-terminal@1", "type-in-field@9", "click-ok@24")
    assert all(is_eval_seed(int(t.rpartition("@")[2])) for t in tasks)
    assert [kind_of(t) for t in tasks[:8]] == list(kinds)


def test_train_seeds_ranges_one_kind_one_instance_and_classic() -> None:
    train = episode_tasks(4, parse_seeds("train"), "menu-launch")
    assert all(t.startswith("menu-launch@") and not is_eval_seed(int(t[12:])) for t in train)
    assert episode_tasks(5, parse_seeds("40-42"), "click-ok") == (
        "click-ok@40", "click-ok@41", "click-ok@42", "click-ok@40", "click-ok@41")
    assert episode_tasks(2, parse_seeds("7")) == ("open-terminal@7", "type-in-field@7")
    assert episode_tasks(3, None, "save-note@5") == ("save-note@5",) * 3
    classic = tuple(default_tasks())
    assert episode_tasks(5, parse_seeds("classic")) == (*classic, classic[0])
    assert episode_tasks(2, parse_seeds("classic"), "click-ok") == ("click-ok", "click-ok")
    assert kind_of("click-ok") == "click-ok"


@pytest.mark.parametrize("text, message", [
    ("evals", "expected eval"), ("3-1", "A-B"), ("-1", "expected"), ("1-x", "expected"),
    (f"0-{2**63}", "A-B")])
def test_bad_seed_choices(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_seeds(text)


def test_several_kinds_are_taken_in_turn() -> None:
    assert episode_tasks(3, parse_seeds("40-42"), "click-ok,dialog-button") == (
        "click-ok@40", "dialog-button@41", "click-ok@42")
    assert check_task("click-ok,menu-launch") == "click-ok,menu-launch"
    with pytest.raises(ValueError, match="unknown task"):
        check_task("click-ok,nope")
    with pytest.raises(ValueError, match="unknown task"):
        check_task("click-ok@3,menu-launch")


def test_combinations_that_name_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="no fixed layout"):
        episode_tasks(1, SeedChoice("classic"), "remember-code")
    with pytest.raises(ValueError, match="no --seeds"):
        episode_tasks(1, SeedChoice("eval"), "remember-code@3")


def test_specs_carry_each_instance_s_instruction() -> None:
    config = RunConfig(episodes=3, tasks=episode_tasks(3))
    specs = simdesk_specs(config)
    assert [s.task_id for s in specs] == [f"{t}-ep{i}" for i, t in enumerate(config.tasks)]
    assert [s.instruction for s in specs] == [
        sample_task(*t.split("@")[:1], int(t.split("@")[1])).instruction for t in config.tasks]


def test_wilson_interval() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)  # textbook value
    low, high = wilson_interval(8, 10)
    assert (low, high) == (pytest.approx(0.4902, abs=1e-4), pytest.approx(0.9433, abs=1e-4))
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    assert str(SuccessRate(8, 10)) == "8/10 (80%, 95% CI 49-94%)"
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_paired_difference() -> None:
    """Newcombe's method 10 on paired outcomes (12 both, 9 the arm only, 2 the reference
    only, 21 neither: the interval recomputed independently from the published formula),
    and the degenerate cases where a Wald interval would collapse."""
    d = PairedDifference(12, 9, 2, 21)
    assert d.n == 44 and d.delta == pytest.approx(7 / 44)
    low, high = d.interval
    assert low == pytest.approx(0.0112, abs=1e-4) and high == pytest.approx(0.2954, abs=1e-4)
    none = PairedDifference.of([(False, False)] * 8)  # nothing differs: symmetric, not a point
    assert none.delta == 0 and none.interval[0] == pytest.approx(-none.interval[1])
    assert none.interval[1] == pytest.approx(wilson_interval(0, 8)[1])
    lost = PairedDifference.of([(True, True)] * 30 + [(False, True)] * 2 + [(False, False)] * 8)
    assert lost.delta == pytest.approx(-0.05)
    assert lost.interval[0] < -0.05 < 0 < lost.interval[1] < 0.05
    assert str(lost) == "-5 pts (95% CI -15 to +4; 0 won / 2 lost)"
    assert PairedDifference(0, 0, 0, 0).interval == (-1.0, 1.0)
