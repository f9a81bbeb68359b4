"""The action layer: structured actions, the action grammar, parsing and pyautogui code.

Model output is data: ``parse_action`` turns text into an ``Action`` record (or ``NoOp``),
``to_pyautogui`` generates code from the record.  Raw model text is never executed.
"""

from runtime.actions.coords import CoordConvention, Screen, from_screen, to_screen
from runtime.actions.errors import (
    ActionError, ActionParseError, InvalidActionError, InvalidKeyError,
)
from runtime.actions.format import format_action
from runtime.actions.grammar import (
    ACTION_GRAMMAR, MAX_ACTION_CHARS, action_grammar, max_action_chars,
)
from runtime.actions.keys import KEY_NAMES, normalize_key
from runtime.actions.parser import parse_action, parse_action_strict
from runtime.actions.pyautogui_code import DONE, FAIL, SPECIAL_ACTIONS, WAIT, to_pyautogui
from runtime.actions.types import (
    TERMINAL_ACTIONS, Action, Click, Done, DragTo, Fail, Hotkey, MouseButton, MoveTo, NoOp,
    Press, Scroll, TypeText, Wait,
)

__all__ = [
    "ACTION_GRAMMAR", "DONE", "FAIL", "KEY_NAMES", "MAX_ACTION_CHARS", "SPECIAL_ACTIONS",
    "TERMINAL_ACTIONS", "WAIT", "Action", "ActionError", "ActionParseError", "Click",
    "CoordConvention", "Done", "DragTo", "Fail", "Hotkey", "InvalidActionError",
    "InvalidKeyError", "MouseButton", "MoveTo", "NoOp", "Press", "Screen", "Scroll",
    "TypeText", "Wait", "action_grammar", "format_action", "from_screen", "max_action_chars",
    "normalize_key", "parse_action", "parse_action_strict", "to_pyautogui", "to_screen",
]
