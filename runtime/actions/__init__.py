"""The runtime's side of actions: the grammar that constrains decoding and the parser that
turns model text into ``Action`` records.  The vocabulary itself (records, keys, coordinates,
pyautogui code) lives in ``vmenv.actions`` and is re-exported here for convenience.

Model output is data: ``parse_action`` turns text into an ``Action`` record (or ``NoOp``),
``to_pyautogui`` generates code from the record.  Raw model text is never executed.
"""

from vmenv.actions.coords import (
    CoordConvention, Placed, Screen, from_screen, place, to_screen,
)
from vmenv.actions.errors import (
    ActionError, ActionParseError, InvalidActionError, InvalidKeyError,
)
from vmenv.actions.format import format_action
from runtime.actions.grammar import (
    ACTION_GRAMMAR, MAX_ACTION_CHARS, action_grammar, max_action_chars,
)
from vmenv.actions.keys import KEY_NAMES, normalize_key
from runtime.actions.parsed import Parsed
from runtime.actions.parser import parse_action, parse_action_detailed, parse_action_strict
from vmenv.actions.pyautogui_code import DONE, FAIL, SPECIAL_ACTIONS, WAIT, to_pyautogui
from vmenv.actions.types import (
    TERMINAL_ACTIONS, Action, Click, Done, DragTo, Fail, Hotkey, MouseButton, MoveTo, NoOp,
    Press, Scroll, TypeText, Wait,
)

__all__ = [
    "ACTION_GRAMMAR", "DONE", "FAIL", "KEY_NAMES", "MAX_ACTION_CHARS", "SPECIAL_ACTIONS",
    "TERMINAL_ACTIONS", "WAIT", "Action", "ActionError", "ActionParseError", "Click",
    "CoordConvention", "Done", "DragTo", "Fail", "Hotkey", "InvalidActionError",
    "InvalidKeyError", "MouseButton", "MoveTo", "NoOp", "Parsed", "Placed", "Press", "Screen",
    "Scroll", "TypeText", "Wait", "action_grammar", "format_action", "from_screen",
    "max_action_chars", "normalize_key", "parse_action", "parse_action_detailed",
    "parse_action_strict", "place", "to_pyautogui", "to_screen",
]
