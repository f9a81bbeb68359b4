"""The bench trajectory: deterministic synthetic screenshots and teacher-forced action texts,
as a ``vmenv.trajectory.Trajectory`` that ``ReplayEnv`` replays (``kvagent bench
--trajectory DIR`` replays a recorded one instead).

Every step's screenshot differs (a moving window, a counter, a changing list), so a policy
cannot get away with caching a stale image — unless asked for steps whose action changed
nothing (``unchanged``: the screen before, pixel for pixel, as agents' traces have after a
wait or a click that missed); sizes are chosen so each screenshot costs about
``image_tokens`` tokens on the model's projector.
"""

from __future__ import annotations

import io
from collections.abc import Collection

from PIL import Image, ImageDraw

from vmenv.trajectory import Trajectory

INSTRUCTION = "Save the quarterly report and close the editor."

ACTIONS = (
    "click(412, 236)", "type('quarterly report')", "press('enter')", "double_click(88, 140)",
    "scroll(0, -5)", "hotkey('ctrl', 's')", "click(1020, 644)", "drag(100, 200, 400, 260)",
    "right_click(300, 310)", "type('hello world')", "press('tab')", "click(640, 360)",
)


def screenshot(step: int, width: int, height: int) -> bytes:
    """A desktop-like PNG that changes every step (deterministic)."""
    img = Image.new("RGB", (width, height), (228, 230, 236))
    d = ImageDraw.Draw(img)
    d.rectangle([0, height - max(8, height // 18), width, height], fill=(32, 36, 48))
    for i in range(6):  # taskbar icons
        x = 8 + i * max(12, width // 24)
        d.rectangle([x, height - max(7, height // 20), x + max(6, width // 40), height - 2],
                    fill=(70 + 30 * i, 120, 200 - 20 * i))
    # a window that moves with the step
    wx = (step * 37) % max(1, width // 2)
    wy = (step * 23) % max(1, height // 3)
    ww, wh = width // 2, height // 2
    d.rectangle([wx, wy, wx + ww, wy + wh], fill=(250, 250, 250), outline=(40, 40, 40))
    d.rectangle([wx, wy, wx + ww, wy + max(6, wh // 10)], fill=(50, 90, 160))
    for row in range(6):  # list rows whose shading encodes the step
        shade = 200 - ((step * 13 + row * 29) % 120)
        y = wy + max(8, wh // 8) + row * max(4, wh // 9)
        d.rectangle([wx + 6, y, wx + ww - 6, y + max(2, wh // 14)], fill=(shade, shade, 255))
    d.text((width - 60, height - 16 if height > 40 else 0), f"{step:04d}", fill=(255, 255, 255))
    buf = io.BytesIO()
    img.save(buf, "PNG", compress_level=1)
    return buf.getvalue()


def trajectory(steps: int, width: int, height: int, *,
               unchanged: Collection[int] = ()) -> Trajectory:
    """``steps`` agent steps: ``steps + 1`` screens (the last is where the last action led),
    each but the last with the action text the history records for it.  The screens at
    ``unchanged`` steps are the previous step's, pixel for pixel (an action that changed
    nothing)."""
    shown = 0
    pairs = []
    for i in range(steps + 1):
        if i not in unchanged:
            shown = i
        pairs.append((screenshot(shown, width, height),
                      ACTIONS[i % len(ACTIONS)] if i < steps else None))
    return Trajectory.from_pairs(pairs, instruction=INSTRUCTION)


def unchanged_every(steps: int, every: int) -> frozenset[int]:
    """Every ``every``-th step (from the second) shows the screen before it again."""
    return frozenset(range(every, steps + 1, every)) if every > 0 else frozenset()
