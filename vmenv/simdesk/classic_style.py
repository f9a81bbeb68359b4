"""Classic-style layouts: the classic layout's arrangement (``layout.classic_layout``) drawn
around a randomized kind's scene — what the ``classic-*`` kinds are laid out in.

The classic layout is one fixed picture; an agent that never saw its arrangement reads it
badly (its taskbar tiles at the screen's left edge, its sizes of 8-px units at 640x384, its
step counter).  A classic-style layout keeps that arrangement and draws the rest: the
theme, which tiles the taskbar holds (the Terminal's and the Notes' — every classic kind's
target is one of them — and up to two of the scene's decoys, in a random order, spaced as
the classic tiles are), the windows moved off the classic places by less than a unit,
decoy windows anywhere.  Dialogs come from the kind's ``finish``
(``placement.place_dialog``) in the classic sizes.  No menu and no desktop icons, as the
classic layout has none: a scene whose required apps are not the classic two is refused.

Invariant (tested): the classic instances of ``tasks.default_tasks`` are not among these
pictures — the theme is never one with the classic desktop colour (drawn again), and the
desktop shows on every classic screen, so a classic-style screen never equals a classic one
pixel for pixel: an agent trained on these kinds has not seen the classic tasks' screens.
"""

from __future__ import annotations

import random

from vmenv.simdesk import geometry as geo
from vmenv.simdesk.geometry import Metrics, Rect, Sizes
from vmenv.simdesk.layout import CLASSIC_THEME, Launcher, Layout
from vmenv.simdesk.placement import CellGrid, Placed, Scene, recall_spec
from vmenv.simdesk.state import Window
from vmenv.simdesk.themes import random_theme

__all__ = ["MAX_DECOY_TILES", "place_classic_style"]

#: decoy tiles beside the classic two, at most
MAX_DECOY_TILES = 2
CLASSIC_APPS = ("terminal", "notes")


def _tiles(m: Metrics, apps: list[str]) -> tuple[Launcher, ...]:
    """Square tiles left to right from the taskbar's left edge, as ``geometry.icon`` puts
    the classic two."""
    first = geo.icon(m, "terminal")
    step = first.width + m.unit // 2
    return tuple(Launcher(app, first.moved(i * step, 0), "tile") for i, app in enumerate(apps))


def place_classic_style(rng: random.Random, width: int, height: int, scene: Scene) -> Placed:
    """A classic-style layout for ``scene`` (see the module docstring)."""
    if scene.required - set(CLASSIC_APPS):  # its target would have no launcher
        raise ValueError(f"a classic-style layout launches only {', '.join(CLASSIC_APPS)} "
                         f"from its tiles; the scene requires {sorted(scene.required)}")
    m = Metrics(width, height)
    u = m.unit
    grid = CellGrid(rng, width, height, u, jitter=True)
    theme = random_theme(rng)
    while theme.desktop == CLASSIC_THEME.desktop:
        theme = random_theme(rng)
    decoys = [a for a in dict.fromkeys((*scene.taskbar, *scene.desktop))
              if a not in CLASSIC_APPS]
    apps = [*CLASSIC_APPS, *rng.sample(decoys, min(len(decoys), rng.randint(0, MAX_DECOY_TILES)))]
    rng.shuffle(apps)
    openings = {app: _moved(rng, geo.default_window(m, app), m.desktop, u)
                for app in CLASSIC_APPS}
    for app in scene.windows:
        if app not in openings:
            openings[app] = grid.window_rect(app)
    sizes = Sizes.classic(m)
    layout = Layout(width=width, height=height, sizes=sizes, theme=theme,
                    taskbar=geo.taskbar(m), clock=geo.clock(m), launchers=_tiles(m, apps),
                    openings=tuple(openings.items()),
                    recall=recall_spec(grid, sizes) if scene.recall else None,
                    keep_inside=True, jitter=True)
    return Placed(layout, tuple(Window(a, openings[a]) for a in scene.windows))


def _moved(rng: random.Random, r: Rect, bound: Rect, unit: int) -> Rect:
    """``r`` moved by -unit + 1 .. unit - 1 px on each axis, staying inside ``bound``."""
    dx = rng.randint(max(1 - unit, bound.x0 - r.x0), min(unit - 1, bound.x1 - r.x1))
    dy = rng.randint(max(1 - unit, bound.y0 - r.y0), min(unit - 1, bound.y1 - r.y1))
    return r.moved(dx, dy)
