"""Clicks on the 32-px cell grid the shipped agents answer in (``vmenv.simdesk.grid_clicks``).

The agents can click only cell centres (``runtime.train.agents.X_PIECES`` / ``Y_PIECES``).
Two facts the docs rest on:

* on every randomized kind's demonstration, ``on_grid`` moves the expert's click to a cell
  centre that reaches the same widget (so the demonstrations are clickable by the agents);
* on the classic layout at the agents' 640x384, click-ok's OK button and save-note's Notes
  tile hold no cell centre at all: no click an agent can write reaches them
  (docs/training.md, "Shipped (twenty-first session)": why the classic tasks stay out of
  reach).
"""

from __future__ import annotations

import pytest

from runtime.train.agents import AGENT_SCREEN, X_PIECES, Y_PIECES
from runtime.train.cell_features import CELL
from vmenv.actions import Click
from vmenv.simdesk import sample_task
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.demos import demonstration
from vmenv.simdesk.grid_clicks import on_grid
from vmenv.simdesk.kinds import task_kinds
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.tasks import default_tasks
from vmenv.simdesk.widgets import hit_in, widgets

W, H = AGENT_SCREEN
CENTRES = [(int(x), int(y.removeprefix(", "))) for y in Y_PIECES for x in X_PIECES]


def _reaching(state: DeskState, widget: str) -> list[tuple[int, int]]:
    ws = widgets(state)
    return [p for p in CENTRES if (w := hit_in(ws, *p)) is not None and w.name == widget]


@pytest.mark.parametrize("kind", [*task_kinds(), "marked-launch"])
def test_randomized_demonstrations_click_cell_centres_on_the_same_widget(kind: str) -> None:
    for seed in range(6):
        task = sample_task(kind, seed)
        state = task.setup(DeskState.empty(W, H))
        for step in demonstration(task, W, H, click_grid=CELL):
            if isinstance(step.action, Click):
                assert (step.action.x, step.action.y) in CENTRES, (task.name, step.action)
                expert = task.next_action(step.state)
                if isinstance(expert, Click) and not step.slip and not step.perturbed:
                    ws = widgets(step.state)
                    target = hit_in(ws, expert.x, expert.y)
                    assert target is not None
                    assert hit_in(ws, step.action.x, step.action.y) is target
            state = apply_action(step.state, step.action)
        assert task.check(state), task.name


def test_on_grid_leaves_a_click_no_cell_centre_reaches() -> None:
    tasks = default_tasks()
    unreachable = {}
    for name in ("open-terminal", "type-in-field", "click-ok", "save-note"):
        state = tasks[name].setup(DeskState.empty(W, H))
        for action in tasks[name].solve(state):
            if isinstance(action, Click):
                target = hit_in(widgets(state), action.x, action.y)
                assert target is not None
                moved = on_grid(state, action, CELL)
                if not _reaching(state, target.name):
                    unreachable[name] = target.name
                    assert moved == action  # nowhere to move it
                else:
                    assert (moved.x, moved.y) in _reaching(state, target.name)
            state = apply_action(state, action)
    # the classic layout's small tiles and dialog sit between the grid's centres
    assert unreachable == {"click-ok": "dialog.ok", "save-note": "icon.notes"}
