"""The lookup query's asks: a launcher menu's two clicks ask for the same two classes, entry
first, and the query built from them ranks the entry's cells over the button's over the rest."""

from __future__ import annotations

import numpy as np

from runtime.train.asks import FALLBACK, ask_code, asked_classes, format_asked, parse_asked
from runtime.train.cell_labels import click_class
from runtime.train.codes import spread_codes
from vmenv.actions import Click
from vmenv.simdesk import demonstration, sample_task


def test_a_menu_launch_asks_for_the_entry_then_the_button_at_both_of_its_clicks() -> None:
    chained = 0
    for seed in range(40):
        task = sample_task("menu-launch", seed)
        assert task.goal is not None and task.goal.app is not None
        entry = f"menu.{task.goal.app}"
        for step in demonstration(task, 640, 384):
            asked = asked_classes(step.state, step.action, task.goal)
            if not isinstance(step.action, Click):
                assert asked == ()
                continue
            clicked = click_class(step.state, step.action.x, step.action.y)
            if clicked in ("menu.button", entry):
                assert asked == (entry, "menu.button")
                chained += 1
            elif clicked == "notes.field":  # Notes opened from the menu: its field's chain
                assert asked == ("notes.field", "notes.title")
            else:
                assert asked == (clicked,), (seed, clicked)
    assert chained == 80  # both clicks of every instance


def test_other_kinds_ask_for_the_clicked_class_alone() -> None:
    for seed in range(10):
        task = sample_task("open-terminal", seed)
        for step in demonstration(task, 640, 384):
            clicked = click_class(step.state, step.action.x, step.action.y)
            assert asked_classes(step.state, step.action, task.goal) == (clicked,)
            assert clicked.startswith("launch.")


def test_the_asked_query_ranks_preferred_then_fallback_then_every_other_class() -> None:
    classes = [f"c{i}" for i in range(60)]
    codes = dict(zip(classes, spread_codes(len(classes), 36, seed=0)))
    q = ask_code(("c7", "c3"), codes)
    assert q is not None and abs(float(np.linalg.norm(q)) - 1.0) < 1e-6
    score = {c: float(codes[c] @ q) for c in classes}
    others = max(v for c, v in score.items() if c not in ("c7", "c3"))
    assert score["c7"] - score["c3"] > 0.2 and score["c3"] - others > 0.2
    assert np.isclose(score["c3"] / score["c7"], FALLBACK, atol=0.1)
    assert ask_code(("other", "nope"), codes) is None
    assert parse_asked(format_asked(("menu.notes", "menu.button"))) == ("menu.notes",
                                                                        "menu.button")
    assert parse_asked("") == ()


def test_a_covered_window_asks_for_its_field_then_its_title_until_the_field_has_focus() -> None:
    raised = 0
    for seed in range(20):
        task = sample_task("switch-window", seed)
        for step in demonstration(task, 640, 384):
            if not isinstance(step.action, Click):
                continue
            clicked = click_class(step.state, step.action.x, step.action.y)
            asked = asked_classes(step.state, step.action, task.goal)
            if clicked in ("notes.field", "notes.title"):
                assert asked == ("notes.field", "notes.title")
                raised += clicked == "notes.title"
            else:
                assert asked == (clicked,)
    assert raised >= 10  # most instances raise the window by its title first
