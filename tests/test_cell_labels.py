"""The recogniser's classes: with ``entries="launch"`` a menu entry is its app's launcher
(``launch.<app>``) and the menu's own widgets keep theirs — so a menu-launch step asks the
lookup for the same class as a launch from the desktop; ``"menu"`` (the default, the shipped
agents' classes) keeps ``menu.<app>`` (``--from`` refusing base agents of the other kind:
test_recipe_base.py)."""

from __future__ import annotations

import numpy as np

from runtime.train.cell_labels import cell_classes, click_class, widget_class
from vmenv.actions import Click
from vmenv.simdesk.apply import apply_action
from vmenv.simdesk.kinds import sample_task
from vmenv.simdesk.state import DeskState

SCREEN = (640, 384)


def test_widget_names_map_to_the_class_a_task_asks_for() -> None:
    assert widget_class("menu.notes", "launch") == widget_class("icon.notes") == "launch.notes"
    assert (widget_class("desk.terminal") == widget_class("menu.terminal", "launch")
            == "launch.terminal")
    assert widget_class("menu.notes") == "menu.notes"  # the default: the shipped classes
    for part in ("menu.button", "menu.panel", "menu.outside"):
        assert widget_class(part) == widget_class(part, "launch") == part
    assert widget_class("dialog.retry") == "dialog.retry"
    assert widget_class(None) == widget_class("window.decoy") == "other"


def test_an_open_menus_entries_are_their_apps_launchers_on_screen() -> None:
    checked = 0
    for seed in range(12):
        task = sample_task("menu-launch", seed)
        state = task.setup(DeskState.empty(*SCREEN))
        menu = state.layout.menu
        assert menu is not None
        assert click_class(state, *menu.button.center, "launch") == "menu.button"
        before = set(np.unique(cell_classes(state, "launch")))
        opened = apply_action(state, Click(*menu.button.center))
        assert opened.menu_open
        for app, entry in opened.layout.menu.entries:
            assert click_class(opened, *entry.center, "launch") == f"launch.{app}"
            assert click_class(opened, *entry.center) == f"menu.{app}"
        # the scene shows the named app only in the menu: its launcher class appears with it
        goal = task.goal
        assert goal is not None and goal.app is not None
        assert f"launch.{goal.app}" not in before
        after = set(np.unique(cell_classes(opened, "launch")))
        assert f"launch.{goal.app}" in after
        assert not any(str(c).startswith("menu.") and c not in
                       ("menu.button", "menu.panel", "menu.outside") for c in after)
        checked += 1
    assert checked == 12
