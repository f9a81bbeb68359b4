"""Where the trained agents click and what the grounding probes say.

- ``aim_at_cells``: every aimed expert click is an encoder cell's centre (or the expert's own
  point where no cell centre reaches the widget), it reaches the widget the expert's point
  reaches, and the aimed demonstrations still solve every task kind (``demonstration`` raises
  otherwise).
- ``screen_probes``: each probe names a widget a click at its point reaches, by the words the
  screen shows on it; covered widgets (behind a dialog) and labels shown twice are left out;
  the order is the rng's, the count at most the limit.
- The readable projector's position features, read back from llama.cpp's encoder: every cell's
  embedding spells its centre's digits one-hot (the grid is solved against mtmd's resize).
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from cachepolicy.engine import Engine, EngineConfig
from runtime.agent_models import agent_files
from runtime.train.aim import aim_at_cells
from runtime.train.probes import screen_probes, widget_label
from runtime.train.readable_vision import DIGITS, cell_centres
from vmenv.actions import Click
from vmenv.simdesk import demonstration, sample_task, task_kinds
from vmenv.simdesk.render import render_png
from vmenv.simdesk.widgets import hit, widgets

SCREEN = (640, 360)


def test_cell_centres_of_the_default_screen() -> None:
    xs, ys = cell_centres(SCREEN)
    assert len(xs) == 20 and len(ys) == 11  # 640x352 after mtmd's resize, 32 px cells
    assert xs[:3] == [16, 48, 80] and ys[:3] == [16, 49, 82] and ys[-1] == 344


@pytest.mark.parametrize("kind", task_kinds())
def test_aimed_clicks_are_cell_centres_on_the_expert_s_widget(kind: str) -> None:
    aim = aim_at_cells(SCREEN)
    xs, ys = cell_centres(SCREEN)
    moved = 0
    for seed in range(6):
        task = sample_task(kind, 100 + seed)
        plain = demonstration(task, *SCREEN)
        aimed = demonstration(task, *SCREEN, aim=aim)  # raises if the task is not solved
        assert len(aimed) == len(plain)
        for step in aimed:
            a = step.action
            if not isinstance(a, Click):
                continue
            expert = task.next_action(step.state)
            assert isinstance(expert, Click)
            assert hit(step.state, a.x, a.y) == hit(step.state, expert.x, expert.y)
            if (a.x, a.y) != (expert.x, expert.y):
                moved += 1
                assert a.x in xs and a.y in ys
    assert moved > 0


def test_probes_name_reachable_widgets_once() -> None:
    task = sample_task("dialog-button", 11)
    state = demonstration(task, *SCREEN)[0].state
    assert state.dialog is not None
    probes = screen_probes(state, random.Random(0), 16)
    labels = [label for label, _ in probes]
    # a dialog covers the rest of the screen: only its buttons are reachable
    assert sorted(labels) == sorted(b.label for b in state.dialog.buttons
                                    if sum(c.label == b.label for c in state.dialog.buttons) == 1)
    for label, (x, y) in probes:
        w = hit(state, x, y)
        assert w is not None and widget_label(state, w.name) == label
    assert screen_probes(state, random.Random(0), 16) == probes  # the rng's order
    assert len(screen_probes(state, random.Random(0), 1)) == 1


def test_probes_leave_out_a_label_shown_twice() -> None:
    for seed in range(40):
        state = demonstration(sample_task("open-terminal", seed), *SCREEN)[0].state
        named = [widget_label(state, w.name) for w in widgets(state)]
        twice = {n for n in named if n is not None and named.count(n) > 1}
        labels = [label for label, _ in screen_probes(state, random.Random(seed), 99)]
        assert not twice & set(labels)
        assert len(labels) == len(set(labels)) > 0


def test_encoder_cells_spell_their_centres_digits() -> None:
    model, mmproj = agent_files("qwen35")
    png = render_png(demonstration(sample_task("menu-launch", 4), *SCREEN)[0].state)
    with Engine(model, mmproj, EngineConfig(n_seq_max=1, n_threads=2)) as engine:
        enc = engine.encode_image(png)
    xs, ys = cell_centres(SCREEN)
    rows = np.asarray(enc.embeddings)
    assert rows.shape[0] == len(xs) * len(ys)
    n_digits = sum(n for _, _, n in DIGITS)
    for r, row in enumerate(rows):
        cy, cx = divmod(r, len(xs))
        want = np.zeros(n_digits)
        col = 0
        for axis, place, n in DIGITS:
            want[col + min((xs[cx], ys[cy])[axis] // place % 10, n - 1)] = 1.0
            col += n
        # f16 weights and GELU's near-linear range: within 0.05 of the one-hot value
        assert np.abs(row[:n_digits] - want).max() < 0.05, (r, row[:n_digits])
