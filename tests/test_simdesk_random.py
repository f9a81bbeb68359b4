"""Randomized simdesk: determinism, solvability, recovery, the seed split, legibility, wiring."""

from __future__ import annotations

import random

import attrs
import pytest

from vmenv import SimDesk, SimDeskConfig, UnknownTaskError
from vmenv.actions import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, Press, TypeText, Wait, to_pyautogui,
)
from vmenv.osworld_vm import simdesk_example
from vmenv.osworld_vm.machine import SimMachine
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.demos import demonstration
from vmenv.simdesk.expert import RECOVERY_STEPS
from vmenv.simdesk.drafts import CLASSIC, DENSE
from vmenv.simdesk.geometry import Metrics
from vmenv.simdesk.grid_clicks import on_grid
from vmenv.simdesk.kinds import (all_kinds, parse_sampled_name, resolve_kinds, sample_task,
                                 task_kinds)
from vmenv.simdesk.layout import classic_layout
from vmenv.simdesk.perturb import PERTURBATIONS
from vmenv.simdesk.render import render_png
from vmenv.simdesk.seeds import eval_seeds, is_eval_seed, seed_split, train_seeds
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import Task, default_tasks
from vmenv.simdesk.widgets import hit, widgets
from vmenv.simdesk.words import EVAL_ONLY_WORDS

KINDS = all_kinds()  # the default mix and the opt-in kinds
SMALL = (640, 360)
#: How many actions the expert's solution from the start takes, per kind.
STEPS = {"open-terminal": {1}, "type-in-field": {2}, "click-ok": {1}, "save-note": {4},
         "menu-launch": {3, 4}, "dialog-button": {1}, "remember-code": {5, 6},
         "switch-window": {4}, "marked-launch": {5}}
#: kinds in the classic layout's sizes or half-size cells: targets as small as the classic's
SMALL_KINDS = tuple(k for k in KINDS if k.startswith(("dense-", "classic-")))
STEPS |= {k: STEPS[k.split("-", 1)[1]] for k in SMALL_KINDS}
#: At 640x360: the shortest side of a click target, and the margin around a click point
#: that must still hit the same target.
MIN_TARGET_PX, CLICK_MARGIN_PX = 40, 12
#: a dense layout's: two of its cells (7 px at 640x360; 16 px at 640x384, as the classic's)
DENSE_MIN_TARGET_PX = 14


def _start(task: Task, size: tuple[int, int] = SMALL) -> DeskState:
    return task.setup(DeskState.empty(*size))


def _run_expert(task: Task, state: DeskState, limit: int) -> tuple[DeskState, list[Action]]:
    """Follow the expert until the task is solved; fail the test past ``limit`` actions."""
    taken: list[Action] = []
    while not task.check(state):
        action = task.next_action(state)
        assert not isinstance(action, Done | Fail), (task.name, action, taken)
        assert len(taken) < limit, (task.name, taken)
        taken.append(action)
        state = apply_action(state, action)
        state.check_integrity()
    return state, taken


# ---------------------------------------------------------------- registry and determinism

def test_registry_has_the_classic_and_the_new_kinds() -> None:
    assert set(default_tasks()) <= set(KINDS)
    assert {"menu-launch", "dialog-button", "remember-code", "switch-window"} <= set(KINDS)
    with pytest.raises(ValueError, match="unknown task kind"):
        sample_task("make-coffee", 1)
    with pytest.raises(ValueError):
        sample_task("click-ok", -1)
    assert parse_sampled_name("menu-launch@17") == ("menu-launch", 17)
    assert parse_sampled_name(f"click-ok@{2**63 - 1}") == ("click-ok", 2**63 - 1)
    for bad in ("menu-launch", "menu-launch@", "menu-launch@x", "nope@3", "click-ok@-1",
                "click-ok@\u0663", f"click-ok@{2**63}", "click-ok@" + "9" * 5000):
        assert parse_sampled_name(bad) is None


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_screens_and_solution(kind: str) -> None:
    for seed in (3, 4):
        a, b = sample_task(kind, seed), sample_task(kind, seed)
        assert a.name == f"{kind}@{seed}" and a.instruction == b.instruction
        sa, sb = _start(a), _start(b)
        assert render_png(sa) == render_png(sb)
        sol = a.solve(sa)
        assert sol == b.solve(sb)
        for action in sol:  # every screen of the solution, byte for byte
            sa, sb = apply_action(sa, action), apply_action(sb, action)
            assert render_png(sa) == render_png(sb)
    pngs = {render_png(_start(sample_task(kind, seed))) for seed in range(6)}
    assert len(pngs) == 6  # and seeds differ


@pytest.mark.parametrize("kind", ["save-note", "remember-code", "menu-launch"])
def test_one_seed_is_the_same_picture_scaled(kind: str) -> None:
    """Windows and desktop icons are drawn in cells (switch-window's covering windows are
    accepted by pixel tests, which may round differently at another size)."""
    for seed in range(5):
        task = sample_task(kind, seed)
        small, big = _start(task, SMALL), _start(task, (1280, 720))
        assert [w.app for w in small.windows] == [w.app for w in big.windows]
        for ws, wb in zip(small.windows, big.windows, strict=True):
            assert (2 * ws.rect.x0, 2 * ws.rect.y1) == (wb.rect.x0, wb.rect.y1)
        icons = [(x.app, x.rect.x0 * 2, x.rect.y0 * 2) for x in small.layout.launchers
                 if x.style == "desktop"]
        assert icons == [(x.app, x.rect.x0, x.rect.y0) for x in big.layout.launchers
                         if x.style == "desktop"]


# ---------------------------------------------------------------- solvable, legible

def _assert_legible_click(state: DeskState, action: Click, dense: bool = False) -> None:
    """A dense layout's targets are smaller, its margins a quarter."""
    w = hit(state, action.x, action.y)
    assert w is not None and w.name not in ("modal", "taskbar", "menu.outside", "dialog"), w
    assert min(w.rect.width, w.rect.height) >= (DENSE_MIN_TARGET_PX if dense else MIN_TARGET_PX), w
    d = CLICK_MARGIN_PX // (4 if dense else 1)  # dense: off-grid windows leave thin strips
    for x, y in ((action.x - d, action.y), (action.x + d, action.y),
                 (action.x, action.y - d), (action.x, action.y + d)):
        got = hit(state, x, y)
        assert got is not None and got.name == w.name, (w, got, (x, y))


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_is_solved_by_its_expert_from_the_start(kind: str) -> None:
    for seed in range(100):
        task = sample_task(kind, seed)
        state = _start(task)
        assert not task.check(state), task.name
        solution = task.solve(state)
        assert len(solution) in STEPS[kind], (task.name, solution)
        for action in solution:
            assert not task.check(state), (task.name, "solved early")
            if isinstance(action, Click):
                _assert_legible_click(state, action, kind in SMALL_KINDS)
            assert task.next_action(state) == action  # solve is the expert, step by step
            state = apply_action(state, action)
        assert task.check(state), task.name
        assert task.next_action(state) == Done()


def test_instructions_say_what_the_task_needs() -> None:
    for seed in range(40):
        for kind in KINDS:
            task = sample_task(kind, seed)
            goal, text = task.goal, task.instruction
            assert goal is not None
            if goal.text is not None and not goal.code:
                assert f'"{goal.text}"' in text, text
            if goal.app is not None:
                assert goal.app.capitalize() in text, text
        state = _start(sample_task("dialog-button", seed))
        assert state.dialog is not None
        target = sample_task("dialog-button", seed).goal
        assert target is not None and target.answer is not None
        labels = {b.id: b.label for b in state.dialog.buttons}
        assert f'"{labels[target.answer]}"' in sample_task("dialog-button", seed).instruction
        menu = _start(sample_task("menu-launch", seed)).layout.menu
        assert menu is not None and f'"{menu.label}" menu' in sample_task(
            "menu-launch", seed).instruction


@pytest.mark.parametrize("kind", KINDS)
def test_targets_are_large_separate_and_uncovered(kind: str) -> None:
    """(On a dense layout: fonts half as large, targets at least two of its cells.)"""
    half = 2 if kind in SMALL_KINDS else 1
    min_px = DENSE_MIN_TARGET_PX if half == 2 else MIN_TARGET_PX
    for seed in range(60):
        state = _start(sample_task(kind, seed))
        lay = state.layout
        assert lay.sizes.font_px >= 14 // half and lay.sizes.big_font_px >= 28 // half
        screen_w, screen_h = SMALL
        targets = [x.rect for x in lay.launchers] + ([lay.menu.button] if lay.menu else [])
        for i, r in enumerate(targets):
            assert min(r.width, r.height) >= min_px, (seed, r)
            assert 0 <= r.x0 and r.x1 <= screen_w and 0 <= r.y0 and r.y1 <= screen_h
            assert not any(r.overlaps(o) for o in targets[i + 1:]), (seed, r)
        if lay.menu is not None:
            assert all(r.height >= min_px for _, r in lay.menu.entries)
            assert lay.menu.panel.y0 >= 0
        if state.dialog is not None:
            assert state.dialog.rect.inside(lay.desktop)
            assert all(min(b.rect.width, b.rect.height) >= min_px
                       for b in state.dialog.buttons)
        for w in widgets(state):
            if w.name.endswith((".close", ".title", ".field", ".save")):
                # a compact title bar's close button: the bar less its insets
                inset = 2 * lay.sizes.close_inset if w.name.endswith(".close") else 0
                floor = min_px - inset if half == 2 else min_px
                assert min(w.rect.width, w.rect.height) >= floor, (seed, w)
        bare = attrs.evolve(state, dialog=None)  # what the dialog hides, once it is gone
        for x in lay.launchers:
            r = x.rect
            for px, py in (r.center, (r.x0, r.y0), (r.x1 - 1, r.y0), (r.x0, r.y1 - 1),
                           (r.x1 - 1, r.y1 - 1)):
                got = hit(bare, px, py)
                assert got is not None and got.name == x.name, (seed, x, got)


# ---------------------------------------------------------------- recovery

@pytest.mark.parametrize("kind", KINDS)
def test_expert_recovers_from_perturbed_states(kind: str) -> None:
    for seed in range(60):
        task = sample_task(kind, seed)
        start = _start(task)
        solution = task.solve(start)
        rng = random.Random(seed)
        for _ in range(3):
            state = start
            for action in solution[:rng.randrange(len(solution))]:
                state = apply_action(state, action)
            state = task.perturb(state, rng)
            if rng.random() < 0.5:  # twice knocked off, with an expert step between
                if not task.check(state):
                    state = apply_action(state, task.next_action(state))
                state = task.perturb(state, rng)
            _run_expert(task, state, len(solution) + RECOVERY_STEPS)


def test_every_perturbation_happens_and_is_recovered_from() -> None:
    seen = dict.fromkeys(PERTURBATIONS, 0)
    for kind in KINDS:
        for seed in range(12):
            task = sample_task(kind, seed)
            assert task.goal is not None
            start = _start(task)
            states = [start]
            for action in task.solve(start)[:-1]:
                states.append(apply_action(states[-1], action))
            rng = random.Random(seed)
            for state in states:
                for name, fn in PERTURBATIONS.items():
                    out = fn(task.goal, state, rng)
                    if out is None or task.check(out):
                        continue
                    seen[name] += 1
                    assert out != state or name == "pointer", name
                    _run_expert(task, out, 4 + RECOVERY_STEPS)
    assert all(n > 0 for n in seen.values()), seen


def _random_action(rng: random.Random, state: DeskState) -> Action:
    r = rng.random()
    if r < 0.6:  # mostly clicks on something
        w = rng.choice(widgets(state)).rect
        return Click(min(rng.randrange(w.x0, w.x1), SMALL[0] - 1),
                     min(rng.randrange(w.y0, w.y1), SMALL[1] - 1))
    if r < 0.7:
        return TypeText(rng.choice(("abc", "x", "hello\n")))
    if r < 0.8:
        return Press(rng.choice(("escape", "enter", "backspace", "a", "space")))
    if r < 0.85:
        return Hotkey(rng.choice((("alt", "f4"), ("ctrl", "alt", "t"))))
    if r < 0.95:
        return DragTo(*(rng.randrange(n) for n in (*SMALL, *SMALL)))
    return rng.choice((Wait(1.0), MoveTo(5, 5)))


@pytest.mark.parametrize("kind", KINDS)
def test_expert_solves_from_any_state_random_actions_reach(kind: str) -> None:
    """Stronger than perturbations: any actions from the start (randomized kinds have no
    dead end: every working app can be reopened, every task dialog recalled)."""
    for seed in range(30):
        task = sample_task(kind, seed)
        start = _start(task)
        limit = len(task.solve(start)) + RECOVERY_STEPS
        rng = random.Random(1000 + seed)
        for _ in range(3):
            state = start
            for _ in range(rng.randint(1, 8)):
                state = apply_action(state, _random_action(rng, state))
            _run_expert(task, state, limit)


def test_classic_tasks_have_the_same_expert() -> None:
    for size in ((1280, 720), (640, 480)):
        for task in default_tasks().values():
            start = _start(task, size)
            assert _run_expert(task, start, 8)[1] == list(task.solve(start)), task.name
    click_ok = default_tasks()["click-ok"]  # the classic dialog is answered for good
    cancelled = apply_action(_start(click_ok), Press("escape"))
    assert click_ok.next_action(cancelled) == Fail()


# ---------------------------------------------------------------- remember-code

def test_the_code_is_on_the_first_screen_only() -> None:
    for seed in range(30):
        task = sample_task("remember-code", seed)
        goal = task.goal
        assert goal is not None and goal.code and goal.text is not None
        code = goal.text
        assert code not in task.instruction
        start = _start(task)
        assert start.dialog is not None and start.dialog.code == code
        assert code in start.revealed
        without = attrs.evolve(start, dialog=attrs.evolve(start.dialog, code=""))
        assert render_png(without) != render_png(start)  # the code is drawn
        rng = random.Random(seed)
        first = rng.choice((Wait(1.0), MoveTo(3, 3), TypeText("zz"), Press("enter"),
                            Click(*start.dialog.rect.center), Click(5, 5),
                            Hotkey(("ctrl", "alt", "t"))))
        after = apply_action(start, first)
        # whatever the first action, the notice is gone and nothing else happened
        assert after.dialog is None and after.windows == start.windows
        assert after.notes == start.notes and after.terminal == start.terminal
        solution = task.solve(start)
        typed = [i for i, a in enumerate(solution) if isinstance(a, TypeText)]
        assert typed and typed[0] >= 3 and solution[typed[0]] == TypeText(code)
        state = start
        for action in solution:
            state = apply_action(state, action)
            assert state.dialog is None or code not in state.dialog.code
        # a state that never showed the code: the expert gives up instead of typing it
        blind = attrs.evolve(after, revealed=())
        assert task.next_action(blind) == Fail()


# ---------------------------------------------------------------- seed split

def test_seed_split_is_fixed_disjoint_and_about_one_in_eight() -> None:
    assert eval_seeds(8) == (1, 9, 24, 38, 51, 56, 57, 61)  # the rule never changes
    first = [s for s, _ in zip(train_seeds(), range(4000), strict=False)]
    assert not any(is_eval_seed(s) for s in first)
    assert first == [s for s in range(len(first) + 600) if seed_split(s) == "train"][:4000]
    evals = set(eval_seeds(500))
    assert all(seed_split(s) == "eval" for s in evals) and not evals & set(first)
    share = sum(is_eval_seed(s) for s in range(16000)) / 16000
    assert 0.11 < share < 0.14
    later = list(zip(train_seeds(10**12), range(200), strict=False))
    assert not any(is_eval_seed(s) for s, _ in later)
    for bad in (-1, 2**63, 1.0, True, "3"):
        with pytest.raises(ValueError):
            seed_split(bad)  # type: ignore[arg-type]


def test_held_out_words_appear_only_for_evaluation_seeds() -> None:
    def word(seed: int) -> str:
        goal = sample_task("save-note", seed).goal
        assert goal is not None and goal.text is not None
        return goal.text

    train = [s for s, _ in zip(train_seeds(), range(600), strict=False)]
    assert not any(word(s) in EVAL_ONLY_WORDS for s in train)
    assert any(word(s) in EVAL_ONLY_WORDS for s in eval_seeds(60))


# ---------------------------------------------------------------- menus, dialogs, recall

def test_menu_clicks_outside_only_close_it() -> None:
    task = sample_task("menu-launch", 2)
    state = _start(task)
    menu = state.layout.menu
    assert menu is not None
    opened = apply_action(state, Click(*menu.button.center))
    assert opened.menu_open
    for action in (TypeText("abc"), Press("enter"), Hotkey(("ctrl", "alt", "t"))):
        assert apply_action(opened, action) == opened
    desk_icon = next((x for x in state.layout.launchers if not x.rect.overlaps(menu.panel)
                      and x.style == "desktop"), None)
    if desk_icon is not None:  # the click that closes the menu does not also open an app
        closed = apply_action(opened, Click(*desk_icon.rect.center))
        assert not closed.menu_open and closed.windows == opened.windows
    assert not apply_action(opened, Press("escape")).menu_open
    app, entry = menu.entries[0]
    launched = apply_action(opened, Click(*entry.center))
    assert not launched.menu_open
    assert launched.is_open(app) or app in ("trash", "help")


def test_a_wrong_answer_is_corrected_through_the_notification() -> None:
    task = sample_task("dialog-button", 5)
    goal = task.goal
    assert goal is not None and goal.answer is not None
    state = _start(task)
    assert state.dialog is not None
    wrong = next(b for b in state.dialog.buttons if b.id != goal.answer)
    state = apply_action(state, Click(*wrong.rect.center))
    assert state.dialog is None and state.dialog_result == wrong.id and not task.check(state)
    assert state.recall is not None and state.layout.recall is not None
    step = task.next_action(state)
    assert step == Click(*state.layout.recall.button.center)
    state = apply_action(state, step)
    assert state.dialog is not None and state.recall is None
    state = apply_action(state, task.next_action(state))
    assert task.check(state) and state.dialog_result == goal.answer


# ---------------------------------------------------------------- wiring

async def test_simdesk_runs_a_sampled_instance() -> None:
    task = sample_task("remember-code", 7)
    env = SimDesk(SimDeskConfig(width=640, height=360), tasks={task.name: task})
    obs = await env.reset(task.name)
    assert obs.instruction == task.instruction and obs.size == SMALL
    outs = [await env.step(a) for a in [*env.solution(), Done()]]
    assert outs[-1].done and outs[-1].reward == 1.0  # the agent's done() ends it (OSWorld)
    assert not any(o.done for o in outs[:-1]) and outs[-2].reward == 1.0
    assert [o.reward for o in outs[:-2]] == [0.0] * (len(outs) - 2)
    plain = SimDesk(SimDeskConfig(width=640, height=360))  # by name, on the default table
    obs = await plain.reset("dialog-button@3")
    assert obs.instruction == sample_task("dialog-button", 3).instruction
    assert obs.screenshot == render_png(_start(sample_task("dialog-button", 3)))
    for bad in ("dialog-button@x", "nope@3"):
        with pytest.raises(UnknownTaskError, match="KIND@SEED"):
            await plain.reset(bad)


def test_osworld_vm_starts_and_checks_a_sampled_instance() -> None:
    name = "menu-launch@11"
    example = simdesk_example(name)
    assert example["instruction"] == sample_task("menu-launch", 11).instruction
    machine = SimMachine("open-terminal", SMALL)
    assert machine.execute(["simdesk", "start", name]).returncode == 0
    for action in sample_task("menu-launch", 11).solve(machine.state):
        assert machine.execute(["python", "-c", to_pyautogui(action)]).returncode == 0
    assert machine.execute(["simdesk", "check"]).output.startswith("simdesk-check: pass")
    machine.revert()
    assert machine.task.name == name and not machine.solved()


async def test_demonstrations_are_the_env_s_screens_with_expert_labels() -> None:
    task = sample_task("save-note", 21)
    demo = demonstration(task, *SMALL, with_done=True)
    assert [s.action for s in demo[:-1]] == list(task.solve(_start(task)))
    assert demo[-1].action == Done() and task.check(demo[-1].state)
    assert not any(s.perturbed for s in demo)
    env = SimDesk(SimDeskConfig(width=640, height=360), tasks={task.name: task})
    shots = [(await env.reset(task.name)).screenshot]
    for step in demo[:-1]:
        shots.append((await env.step(step.action)).observation.screenshot)
    assert shots == [render_png(s.state) for s in demo]
    for seed in range(20):
        task = sample_task(KINDS[seed % len(KINDS)], seed)
        plain = demonstration(task, *SMALL)
        k = seed % len(plain)
        knocked = demonstration(task, *SMALL, perturb_at=k, rng=random.Random(seed))
        assert [s.perturbed for s in knocked].count(True) == 1 and knocked[k].perturbed
        assert knocked[:k] == plain[:k] and knocked[k].state != plain[k].state
        last = knocked[-1]
        assert task.check(apply_action(last.state, last.action))


# ---------------------------------------------------------------- dense layouts


def test_dense_kinds_are_their_kinds_in_half_size_cells_off_the_encoder_grid() -> None:
    """A dense instance says what its kind's instance of the same seed would (its own rng
    stream aside, the same draft function), in cells of half ``unit_for``; at 640x384 some
    of its expert clicks reach their target from no 32-px cell centre (what the kinds are
    for), where the default mix's reach every one."""
    assert resolve_kinds("dense") == DENSE and not set(DENSE) & set(task_kinds())
    off_grid = {"dense": 0, "plain": 0}
    for kind in DENSE:
        for seed in range(12):
            for name, k in (("dense", kind), ("plain", kind.removeprefix("dense-"))):
                task = sample_task(k, seed)
                state = _start(task, (640, 384))
                assert state.layout.sizes.unit == (8 if name == "dense" else 16)
                for step in demonstration(task, 640, 384):
                    a = step.action
                    if isinstance(a, Click):
                        g = on_grid(step.state, a, 32)
                        off_grid[name] += bool((g.x - 16) % 32 or (g.y - 16) % 32)
    assert off_grid["plain"] == 0 and off_grid["dense"] >= 10, off_grid


# ---------------------------------------------------------------- classic-style layouts


def test_classic_kinds_are_the_classic_arrangement_never_the_classic_screens() -> None:
    """A classic-style instance keeps the classic layout's sizes, taskbar and tile spacing
    (its target's tile among them), its windows within a unit of the classic places; its
    desktop colour is never the classic one, so none of its screens is a classic task's."""
    assert resolve_kinds("classic") == CLASSIC and not set(CLASSIC) & set(task_kinds())
    size = (640, 384)
    classic = classic_layout(Metrics(*size))
    classic_screens = {render_png(t.setup(DeskState.empty(*size))) for t in
                       default_tasks().values()}
    tiles = [x.rect for x in classic.launchers]
    step = tiles[1].x0 - tiles[0].x0
    for kind in CLASSIC:
        goal_app = {"classic-open-terminal": "terminal", "classic-click-ok": None}.get(
            kind, "notes")
        for seed in range(20):
            task = sample_task(kind, seed)
            state = _start(task, size)
            lay = state.layout
            assert lay.sizes == classic.sizes and lay.taskbar == classic.taskbar
            assert lay.theme.desktop != classic.theme.desktop
            assert [x.rect.x0 for x in lay.launchers] == [
                tiles[0].x0 + i * step for i in range(len(lay.launchers))]
            assert all(x.style == "tile" and x.rect.y0 == tiles[0].y0 for x in lay.launchers)
            if goal_app is not None:
                assert lay.launchers_of(goal_app)
            for app, r in classic.openings:
                got = lay.opening(app)
                assert got.width == r.width and got.height == r.height
                assert max(abs(got.x0 - r.x0), abs(got.y0 - r.y0)) < lay.sizes.unit
            for step_ in demonstration(task, *size):
                assert render_png(step_.state) not in classic_screens


def test_a_classic_style_layout_refuses_a_target_it_has_no_tile_for() -> None:
    from vmenv.simdesk.classic_style import place_classic_style
    from vmenv.simdesk.placement import Scene

    scene = Scene(taskbar=("calculator",), required=frozenset({"calculator"}), classic=True)
    with pytest.raises(ValueError, match="launches only terminal, notes"):
        place_classic_style(random.Random(0), 640, 384, scene)
    ok = place_classic_style(random.Random(0), 640, 384,
                             attrs.evolve(scene, required=frozenset({"notes"})))
    assert {x.app for x in ok.layout.launchers} >= {"terminal", "notes"}
