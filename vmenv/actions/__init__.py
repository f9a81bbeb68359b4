"""The action vocabulary every layer shares: structured action records, key names,
coordinate conventions, the action language's text form and pyautogui code generation.

It lives at the bottom (``vmenv``) so that environments and the runtime both import it
downward.  Model output is data: the runtime's parser (``runtime.actions``) turns text into
these records and ``to_pyautogui`` generates code from a record — raw model text is never
executed.
"""

from vmenv.actions.coords import (
    CLAMP_MARGIN, CoordConvention, Placed, Screen, from_screen, place, to_screen,
)
from vmenv.actions.errors import (
    ActionError, ActionParseError, InvalidActionError, InvalidKeyError,
)
from vmenv.actions.format import format_action
from vmenv.actions.keys import KEY_NAMES, normalize_key
from vmenv.actions.pyautogui_code import DONE, FAIL, SPECIAL_ACTIONS, WAIT, to_pyautogui
from vmenv.actions.rescale import rescale
from vmenv.actions.types import (
    TERMINAL_ACTIONS, Action, Click, Done, DragTo, Fail, Hotkey, MouseButton, MoveTo, NoOp,
    Press, Scroll, TypeText, Wait,
)

__all__ = [
    "CLAMP_MARGIN", "DONE", "FAIL", "KEY_NAMES", "SPECIAL_ACTIONS", "TERMINAL_ACTIONS", "WAIT",
    "Action", "ActionError", "ActionParseError", "Click", "CoordConvention", "Done", "DragTo",
    "Fail", "Hotkey", "InvalidActionError", "InvalidKeyError", "MouseButton", "MoveTo", "NoOp",
    "Placed", "Press", "Screen", "Scroll", "TypeText", "Wait", "format_action", "from_screen",
    "normalize_key", "place", "rescale", "to_pyautogui", "to_screen",
]
