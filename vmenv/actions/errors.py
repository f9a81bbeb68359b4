"""Typed errors of the action layer, grouped by cause.

* ``InvalidActionError`` — an action record was built with values outside its contract
  (negative coordinates, an unknown mouse button, an empty text).  It is also a ``ValueError``
  so attrs-style validation failures read naturally to callers.
* ``InvalidKeyError`` — a key name is not one pyautogui knows (after alias normalisation).
* ``ActionParseError`` — model text is not an action of the action language.

``runtime.actions.parse_action`` never lets these escape for model text: it turns them into ``NoOp(reason,
raw)``.  ``parse_action_strict`` raises them, for callers that want the cause.
"""

from __future__ import annotations


class ActionError(Exception):
    """Base class for errors raised by ``runtime.actions``."""


class InvalidActionError(ActionError, ValueError):
    """An action record's fields violate its contract."""


class InvalidKeyError(InvalidActionError):
    """A key name is not a pyautogui key name (nor a known alias of one)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"unknown key name: {key!r}")
        self.key = key


class ActionParseError(ActionError):
    """Model text could not be parsed into an action."""
