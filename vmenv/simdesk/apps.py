"""The apps of the simulated desktop: two that do something and decoys that do not.

``terminal`` and ``notes`` are the working apps (a command line, a text field with Save).
Decoys exist so that a screen holds more than the one icon a task needs: most open a harmless
window with a line or two of static text, a few (``DEAD_DECOYS``) do nothing when clicked.
Every app has a title (its label on icons, menu entries and title bars) and a glyph (one or
two characters on a coloured tile) so that icons differ in shape, colour and text.

Invariant: app ids are lowercase ASCII words without dots (widget names are ``<app>.<part>``).
"""

from __future__ import annotations

import attrs

Color = tuple[int, int, int]

#: The apps whose windows do something (text fields, a command line).
WORKING_APPS: tuple[str, ...] = ("terminal", "notes")


@attrs.frozen
class AppSpec:
    """What an app looks like and whether clicking its icon opens a window."""

    id: str
    title: str
    glyph: str
    tile: Color
    ink: Color
    body: tuple[str, ...] = ()  # the static text of a decoy's window
    opens: bool = True

    def __attrs_post_init__(self) -> None:
        assert self.id.isascii() and self.id.isalpha() and self.id.islower(), self.id


_SPECS: tuple[AppSpec, ...] = (
    AppSpec("terminal", "Terminal", ">_", (18, 18, 18), (80, 220, 100)),
    AppSpec("notes", "Notes", "", (250, 214, 90), (150, 120, 30)),
    AppSpec("files", "Files", "F", (70, 130, 200), (255, 255, 255), ("Home", "3 folders")),
    AppSpec("calculator", "Calculator", "+-", (90, 90, 100), (255, 255, 255), ("0",)),
    AppSpec("mail", "Mail", "@", (200, 70, 70), (255, 255, 255), ("Inbox is empty",)),
    AppSpec("music", "Music", "M", (150, 60, 170), (255, 255, 255), ("Nothing playing",)),
    AppSpec("photos", "Photos", "P", (230, 130, 40), (255, 255, 255), ("No photos yet",)),
    AppSpec("weather", "Weather", "W", (60, 160, 190), (255, 255, 255), ("12 C, cloudy",)),
    AppSpec("calendar", "Calendar", "31", (240, 240, 240), (200, 50, 50), ("No events today",)),
    AppSpec("browser", "Browser", "B", (40, 150, 90), (255, 255, 255), ("You are offline",)),
    AppSpec("settings", "Settings", "S", (110, 110, 120), (255, 255, 255),
            ("All settings saved",)),
    AppSpec("clock", "Clock", "C", (30, 60, 110), (255, 255, 255), ("No alarms",)),
    AppSpec("trash", "Trash", "T", (150, 150, 150), (30, 30, 30), opens=False),
    AppSpec("help", "Help", "?", (250, 250, 250), (40, 90, 180), opens=False),
)
APPS: dict[str, AppSpec] = {s.id: s for s in _SPECS}
#: Decoy apps, in a fixed order (samplers draw from this tuple).
DECOYS: tuple[str, ...] = tuple(s.id for s in _SPECS if s.id not in WORKING_APPS)
#: Decoys whose icons do nothing.
DEAD_DECOYS: tuple[str, ...] = tuple(s.id for s in _SPECS if not s.opens)


def app_spec(app: str) -> AppSpec:
    """The spec of ``app`` (raises ``KeyError`` for an unknown id)."""
    return APPS[app]


def app_title(app: str) -> str:
    return APPS[app].title
