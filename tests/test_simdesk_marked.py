"""marked-launch, simdesk's look-back kind the agents' vision can tell apart: the first screen
marks one app launcher, the task needs it four screens later; the ``look-back`` selector; the
recogniser's ``marked`` class."""

from __future__ import annotations

import itertools
import random

import attrs
import numpy as np
import pytest

from runtime.run.instances import check_task, episode_tasks, parse_seeds
from runtime.train.cell_labels import (
    MARKED, cell_classes, click_class, query_class, widget_class,
)
from runtime.train.cell_features import CELL
from vmenv import SimDesk, SimDeskConfig
from vmenv.actions import Click, Done, Hotkey, MoveTo, Press, TypeText, Wait
from vmenv.simdesk import (
    all_kinds, demonstration, eval_seeds, resolve_kinds, sample_task, task_kinds, train_seeds,
)
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.apps import APPS
from vmenv.simdesk.drafts import LOOK_BACK, MARK_CANDIDATES
from vmenv.simdesk.goals import Goal
from vmenv.simdesk.render import MARK, render, render_png
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task
from vmenv.simdesk.widgets import hit, hit_in, locate, widgets

KIND = "marked-launch"
SCREEN = (640, 384)  # the shipped agents' screen: 32 px cells
#: the window a plain sliding-window agent keeps, in screenshots
K = 3
SEEDS = (*itertools.islice(train_seeds(), 40), *eval_seeds(20))


def _start(task: Task, size: tuple[int, int] = SCREEN) -> DeskState:
    return task.setup(DeskState.empty(*size))


def _states(task: Task, size: tuple[int, int] = SCREEN) -> list[DeskState]:
    """The states the expert's solution passes through, the start first, solved last."""
    states = [_start(task, size)]
    for action in task.solve(states[0]):
        states.append(apply_action(states[-1], action))
    return states


def _mark_pixels(state: DeskState) -> np.ndarray:
    return (np.asarray(render(state)) == MARK).all(-1)


def _candidates(state: DeskState) -> list[str]:
    """Apps with a launcher that opens something, Notes aside: what a guess picks from."""
    return [x.app for x in state.layout.launchers if x.app != "notes" and APPS[x.app].opens]


# ---------------------------------------------------------------- the look-back property

def test_the_need_is_on_the_first_screenshot_only_and_four_screens_back() -> None:
    """For every seed: the first screenshot shows the mark (on the marked launcher's cells,
    which the recogniser labels ``marked``); the screenshot at the step that clicks the marked
    app does not; that step is >= K steps after the first, so a plain K = 3 window has lost
    the only screenshot that says where to click."""
    for seed in SEEDS:
        task = sample_task(KIND, seed)
        goal = task.goal
        assert goal is not None and goal.then is not None
        states = _states(task)
        solution = task.solve(states[0])
        # the step whose click opens the marked app: the last one
        need = next(i for i, a in enumerate(solution)
                    if isinstance(a, Click) and (w := hit(states[i], a.x, a.y)) is not None
                    and w.name in (f"icon.{goal.then}", f"desk.{goal.then}"))
        assert need == len(solution) - 1 == 4
        assert need >= K  # screenshots need-K+1 .. need are what the window shows
        assert 0 not in range(need - K + 1, need + 1)
        first, at_need = states[0], states[need]
        assert first.mark == goal.then and at_need.mark is None
        # drawn: MARK pixels on screenshot 0, all of them on the marked launcher; none later
        shown = _mark_pixels(first)
        assert shown.sum() > 500, (seed, shown.sum())
        ys, xs = np.nonzero(shown)
        rects = [x.rect for x in first.layout.launchers_of(goal.then)]
        assert all(any(r.contains(int(x), int(y)) for r in rects) for x, y in zip(xs, ys))
        for state in states[1:]:
            assert not _mark_pixels(state).any(), seed
        # the recogniser's view: marked cells on screenshot 0 only, and the clicked cell
        # there is the clicked cell at the need
        a = solution[need]
        assert isinstance(a, Click)
        cells0, cells_need = cell_classes(first), cell_classes(at_need)
        assert MARKED in cells0 and MARKED not in cells_need
        assert click_class(first, a.x, a.y) == MARKED
        assert click_class(at_need, a.x, a.y) == f"launch.{goal.then}"
        assert query_class(goal, at_need, a.x, a.y) == MARKED
        # the launcher does not move and nothing covers it when it is needed
        assert hit(at_need, a.x, a.y) == hit(first, a.x, a.y)


def test_nothing_but_the_mark_tells_the_marked_app() -> None:
    """The instruction names no candidate, and the first screen with another candidate marked
    differs from it only by where the plate is: the mark is the one clue."""
    for seed in SEEDS[:20]:
        task = sample_task(KIND, seed)
        goal = task.goal
        assert goal is not None and goal.then is not None
        start = _start(task)
        assert not any(APPS[a].title in task.instruction for a in _candidates(start))
        for other in _candidates(start):
            if other == goal.then:
                continue
            swapped = attrs.evolve(start, mark=other)
            a, b = np.asarray(render(start)), np.asarray(render(swapped))
            differ = (a != b).any(-1)
            (mine,), (theirs,) = (start.layout.launchers_of(goal.then),
                                  start.layout.launchers_of(other))
            ys, xs = np.nonzero(differ)
            assert len(ys) and all(mine.rect.contains(int(x), int(y))
                                   or theirs.rect.contains(int(x), int(y))
                                   for x, y in zip(xs, ys))


def test_the_mark_goes_with_the_first_action_which_still_acts() -> None:
    for seed in SEEDS[:20]:
        task = sample_task(KIND, seed)
        start = _start(task)
        notes = start.layout.launchers_of("notes")[0]
        for first in (Wait(1.0), MoveTo(3, 3), TypeText("zz"), Press("escape"), Click(2, 2),
                      Hotkey(("ctrl", "alt", "t")), Click(*notes.rect.center)):
            after = apply_action(start, first)
            assert after.mark is None and not _mark_pixels(after).any()
            if first == Click(*notes.rect.center):
                assert after.is_open("notes")  # unlike a transient dialog, it acted
            if isinstance(first, Hotkey):
                assert after.is_open("terminal")


# ---------------------------------------------------------------- the checker

def _shows(state: DeskState, app: str) -> list[tuple[int, int]]:
    """The centres of ``app``'s launchers that a click reaches."""
    return [x.rect.center for x in state.layout.launchers_of(app)
            if (w := hit(state, *x.rect.center)) is not None and w.name == x.name]


def _open(state: DeskState, app: str) -> DeskState:
    """A click on a launcher of ``app`` where it shows."""
    return apply_action(state, Click(*_shows(state, app)[0]))


def _save_note(goal: Goal, state: DeskState) -> DeskState:
    """Notes opened (on top), its field clicked, the word typed, Save clicked."""
    assert goal.text is not None
    state = _open(state, "notes")
    for action in (Click(*locate(state, "notes.field")), TypeText(goal.text)):
        state = apply_action(state, action)
    return apply_action(state, Click(*locate(state, "notes.save")))


def _expert(task: Task, state: DeskState, limit: int = 12) -> DeskState:
    for _ in range(limit):
        if task.check(state):
            return state
        state = apply_action(state, task.next_action(state))
    raise AssertionError(f"{task.name}: the expert did not finish")


def test_only_the_marked_app_opened_after_the_save_passes() -> None:
    early_seen = 0
    for seed in SEEDS[:30]:
        task = sample_task(KIND, seed)
        goal = task.goal
        assert goal is not None and goal.then is not None
        start = _start(task)
        saved = _save_note(goal, start)
        assert goal.text in saved.notes.saved and not task.check(saved)
        assert task.check(_open(saved, goal.then))
        others = [a for a in _candidates(start) if a != goal.then]
        assert len(others) >= MARK_CANDIDATES[0] - 1
        for other in others:
            wrong = _open(saved, other)
            assert not task.check(wrong)  # a wrong guess fails
            if _shows(wrong, goal.then):  # (the wrong window may cover it)
                assert not task.check(_open(wrong, goal.then))  # and so does every guess
            fixed = _expert(task, wrong)  # the expert closes it, then opens the marked app
            assert not fixed.is_open(other)
        # the marked app opened while the mark showed, before the save, does not count ...
        opened = _open(start, goal.then)
        if not _shows(opened, "notes"):  # its window covers the Notes icon
            continue
        early_seen += 1
        early = _save_note(goal, opened)
        assert early.is_open(goal.then) and not task.check(early)
        # ... until it is closed and opened again after the save
        redone = _expert(task, early)
        assert redone.events.count(("open", goal.then)) == 2
        assert not task.check(attrs.evolve(redone, events=redone.events[:-1]))
    assert early_seen >= 15


def test_a_random_guess_at_the_last_step_rarely_passes() -> None:
    """The chance of a plain K = 3 agent that did everything else right: a random candidate
    launcher (every app launcher that opens something but Notes) at the last step, 200
    seeds (100 training, 100 held out)."""
    rng = random.Random(0)
    seeds = (*itertools.islice(train_seeds(), 100), *eval_seeds(100))
    wins, chance = 0, []
    for seed in seeds:
        task = sample_task(KIND, seed)
        saved = _save_note(task.goal, _start(task))
        candidates = _candidates(saved)
        assert MARK_CANDIDATES[0] <= len(candidates) <= MARK_CANDIDATES[1]
        chance.append(1 / len(candidates))
        wins += task.check(_open(saved, rng.choice(candidates)))
    assert 0.16 < float(np.mean(chance)) < 0.25
    assert wins / len(seeds) <= 0.25, wins  # measured: 47 / 200


# ---------------------------------------------------------------- demonstrations, the env

def test_demonstrations_with_perturbations_and_slips() -> None:
    for seed in SEEDS[:12]:
        task = sample_task(KIND, seed)
        plain = demonstration(task, *SCREEN)
        assert len(plain) == 5 and plain[0].state.mark is not None
        for k in range(len(plain)):
            for kw in ({"perturb_at": k}, {"slip_at": k}):
                demo = demonstration(task, *SCREEN, rng=random.Random(seed * 7 + k), **kw)
                last = demo[-1]
                assert task.check(apply_action(last.state, last.action))
                if k == 0 and "perturb_at" in kw:  # nothing is put over the mark
                    assert demo[0].state.mark == plain[0].state.mark
                    assert (_mark_pixels(demo[0].state) == _mark_pixels(plain[0].state)).all()


async def test_the_env_runs_an_instance_by_name_and_scores_it() -> None:
    name = f"{KIND}@{eval_seeds(1)[0]}"
    env = SimDesk(SimDeskConfig(width=SCREEN[0], height=SCREEN[1]))
    obs = await env.reset(name)
    task = sample_task(KIND, eval_seeds(1)[0])
    assert obs.screenshot == render_png(_start(task))
    outs = [await env.step(a) for a in [*env.solution(), Done()]]
    assert outs[-1].done and outs[-1].reward == 1.0
    assert [o.reward for o in outs[:-2]] == [0.0] * (len(outs) - 2)


# ---------------------------------------------------------------- --task look-back

def test_look_back_names_the_look_back_kinds_in_one_place() -> None:
    assert LOOK_BACK == ("remember-code", "marked-launch")
    assert resolve_kinds("look-back") == LOOK_BACK
    assert resolve_kinds("save-note,look-back,click-ok") == ("save-note", *LOOK_BACK,
                                                             "click-ok")
    assert resolve_kinds(KIND) == (KIND,)
    for bad in ("nope", "look-back,nope", "", "look_back", "save-note@3"):
        with pytest.raises(ValueError, match="unknown task kind"):
            resolve_kinds(bad)
    # the default mix is the eight kinds it was; marked-launch only when named
    assert KIND in all_kinds() and KIND not in task_kinds() and len(task_kinds()) == 8
    assert all_kinds()[:8] == task_kinds()
    assert check_task("look-back") == "look-back"
    assert check_task("look-back,save-note") == "look-back,save-note"
    with pytest.raises(ValueError, match="unknown task"):
        check_task("look-back,nope")
    tasks = episode_tasks(4, parse_seeds("eval"), "look-back")
    seeds = eval_seeds(4)
    assert tasks == (f"remember-code@{seeds[0]}", f"marked-launch@{seeds[1]}",
                     f"remember-code@{seeds[2]}", f"marked-launch@{seeds[3]}")
    assert not any(t.startswith(KIND) for t in episode_tasks(40))


def test_run_and_bench_eval_take_look_back() -> None:
    from runtime.cli import build_parser

    parser = build_parser()
    run = parser.parse_args(["run", "--task", "look-back", "--episodes", "2"])
    assert run.task == "look-back"
    sub = parser._subparsers._group_actions[0].choices  # noqa: SLF001
    task = {a.dest: a for a in sub["run"]._actions}["task"]  # noqa: SLF001
    assert KIND in task.help and "look-back" in task.help
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--task", "look-forward"])
    bench = parser.parse_args(["bench-eval", "--task", "look-back"])
    assert bench.task == "look-back"


# ---------------------------------------------------------------- the recogniser's class

def _unmarked_classes(state: DeskState) -> np.ndarray:
    """Each cell's class as it was before ``marked`` existed: the widget's class alone."""
    lay, ws = state.layout, widgets(state)
    out = np.empty((lay.height // CELL, lay.width // CELL), object)
    for r, c in np.ndindex(out.shape):
        w = hit_in(ws, c * CELL + CELL // 2, r * CELL + CELL // 2)
        out[r, c] = widget_class(w.name if w else None)
    return out


@pytest.mark.parametrize("kind", task_kinds())
def test_the_marked_class_changes_no_cell_of_the_other_kinds(kind: str) -> None:
    for seed in SEEDS[:6]:
        for step in demonstration(sample_task(kind, seed), *SCREEN):
            got = cell_classes(step.state)
            assert MARKED not in got
            assert (got == _unmarked_classes(step.state)).all(), (kind, seed)


def test_only_the_marked_launcher_s_cells_change_class() -> None:
    for seed in SEEDS[:20]:
        task = sample_task(KIND, seed)
        goal = task.goal
        assert goal is not None and goal.then is not None
        first = _start(task)
        got, before = cell_classes(first), _unmarked_classes(first)
        changed = got != before
        assert changed.any()
        assert set(got[changed]) == {MARKED}
        assert set(before[changed]) == {f"launch.{goal.then}"}
        assert (before == f"launch.{goal.then}").sum() == changed.sum()
        for state in _states(task)[1:]:
            assert (cell_classes(state) == _unmarked_classes(state)).all()
