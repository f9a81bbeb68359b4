"""Random colour themes from legible palettes.

Every palette entry keeps its text readable: white on the desktop, taskbar, title bars and
accent buttons (each of those is dark or saturated enough), black on paper and on dialogs.
"""

from __future__ import annotations

import random

from vmenv.simdesk.layout import Theme

DESKTOPS = ((46, 84, 126), (34, 96, 90), (70, 60, 110), (60, 70, 80), (40, 100, 60),
            (110, 70, 50), (30, 40, 60), (90, 50, 80), (50, 90, 120), (85, 85, 90))
TASKBARS = ((28, 28, 34), (20, 30, 45), (40, 40, 40), (35, 25, 45), (15, 45, 40))
ACCENTS = ((52, 101, 164), (160, 60, 60), (40, 120, 90), (120, 70, 160), (175, 90, 20),
           (30, 110, 150), (90, 90, 90))
INACTIVE = ((140, 140, 150), (120, 125, 135), (150, 140, 130))
PAPERS = ((246, 246, 242), (250, 250, 250), (240, 244, 250), (250, 246, 236), (236, 240, 236))
DIALOGS = ((236, 236, 236), (245, 245, 240), (232, 236, 242))
CLOSES = ((204, 64, 64), (190, 50, 80), (210, 80, 40))


def random_theme(rng: random.Random) -> Theme:
    accent = rng.choice(ACCENTS)
    return Theme(desktop=rng.choice(DESKTOPS), taskbar=rng.choice(TASKBARS),
                 title_active=accent, title_inactive=rng.choice(INACTIVE),
                 close=rng.choice(CLOSES), paper=rng.choice(PAPERS), primary=accent,
                 dialog=rng.choice(DIALOGS), menu=rng.choice(PAPERS))
