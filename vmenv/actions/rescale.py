"""Points from the screenshot's pixels to the screen's.

A model points at pixels of the image it saw; pyautogui moves the mouse in screen pixels.
The two differ when the VM's screenshots are not taken at its screen resolution (a HiDPI
scale factor, a VM that resizes its captures): OSWorld's ``DesktopEnv.vm_screen_size`` is
then not the screenshot's size.  ``rescale`` maps every point of an action from one to the
other; amounts (scroll clicks, seconds) and text are unchanged.

Each screenshot pixel ``u`` covers the screen interval ``[u * S / s, (u + 1) * S / s)``
(``s``: screenshot size, ``S``: screen size on that axis); the point goes to the screen pixel
holding that interval's centre, ``floor((u + 0.5) * S / s)``.  So a point inside the
screenshot always lands inside the screen, and the map is monotonic.
"""

from __future__ import annotations

import attrs

from vmenv.actions.coords import Screen
from vmenv.actions.errors import InvalidActionError
from vmenv.actions.types import Action, Click, DragTo, MoveTo, Scroll


def rescale_axis(u: int, image: int, screen: int) -> int:
    """Pixel ``u`` of an ``image``-pixel axis as a pixel of a ``screen``-pixel axis (points
    outside the image are first clamped onto it)."""
    u = min(max(u, 0), image - 1)
    return (2 * u + 1) * screen // (2 * image)


def rescale(action: Action, image: Screen, screen: Screen) -> Action:
    """``action`` with its points moved from pixels of an ``image``-sized screenshot to
    pixels of ``screen``.  Raises ``InvalidActionError`` for an empty size."""
    if min(*image, *screen) < 1:
        raise InvalidActionError(f"sizes must be positive, got {image} -> {screen}")
    if image == screen:
        return action

    def x(u: int) -> int:
        return rescale_axis(u, image[0], screen[0])

    def y(v: int) -> int:
        return rescale_axis(v, image[1], screen[1])

    match action:
        case Click() | MoveTo():
            return attrs.evolve(action, x=x(action.x), y=y(action.y))
        case DragTo():
            return DragTo(x(action.x0), y(action.y0), x(action.x1), y(action.y1))
        case Scroll(x=int() as sx, y=int() as sy):
            return attrs.evolve(action, x=x(sx), y=y(sy))
    return action
