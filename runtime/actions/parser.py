"""Model text → a structured ``Action``.  Model output is data: it is parsed, never executed.

The text is read with ``ast.parse(mode="eval")`` (a parser, not an evaluator) and only a call of
a known action name with literal arguments is accepted; argument values are read with
``ast.literal_eval`` (see ``calls``).  Accepted forms, besides the grammar's own language (see
``grammar.py``):

* surrounding whitespace, a code fence, an ``Action:`` prefix (the text after the last one is
  used, so UI-TARS' "Thought: ...\\nAction: ..." works), trailing end-of-turn tokens;
* keyword arguments (``click(x=1, y=2, button="right")``) and aliases (``left_click``,
  ``hover``, ``write``, ``finished``, ``DONE``, ...);
* UI-TARS boxes: ``click(start_box='(x,y)')``, ``drag(start_box=..., end_box=...)``,
  ``scroll(start_box=..., direction='down')``, ``hotkey(key='ctrl c')``, ``type(content=...)``;
  a 4-number box means its centre.

``parse_action`` returns ``NoOp(reason, raw)`` for anything else and never raises for bad
model text; ``parse_action_strict`` raises the typed error instead; ``parse_action_detailed``
also reports what was changed on the way (``Parsed.notes``: clamped coordinates).
"""

from __future__ import annotations

import re

import structlog

from runtime.actions.calls import CALLS, Reader, read_call
from runtime.actions.parsed import Parsed
from vmenv.actions.coords import CoordConvention, Screen
from vmenv.actions.errors import ActionError, ActionParseError, InvalidActionError
from vmenv.actions.types import Action, Done, Fail, NoOp, Wait

log = structlog.get_logger(__name__)

#: Longer texts are refused before parsing (a model's one action is short; this also bounds
#: the parser's work on garbage).
MAX_RAW_CHARS = 8_000
_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)
END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
# [ \t]* (not \s*) around the prefix: a run of newlines must not cost quadratic time
_ACTION_PREFIX = re.compile(r"(?:^|\n)[ \t]*action[ \t]*:", re.IGNORECASE)
_BARE: dict[str, Action] = {"DONE": Done(), "FAIL": Fail(), "WAIT": Wait(1.0)}


def strip_end_of_turn(text: str) -> str:
    """``text`` without surrounding whitespace and trailing end-of-turn tokens (in a loop,
    not a regex: a backtracking pattern is quadratic on long whitespace runs)."""
    s = text.strip()
    while True:
        for token in END_OF_TURN:
            if s.endswith(token):
                s = s[: -len(token)].rstrip()
                break
        else:
            return s


def _clean(text: str) -> str:
    s = strip_end_of_turn(text)
    fence = _FENCE.match(s)
    if fence:
        s = fence.group(1).strip()
    prefixes = list(_ACTION_PREFIX.finditer(s))
    if prefixes:
        s = s[prefixes[-1].end():].strip()
    return s


def check_length(text: str) -> None:
    if len(text) > MAX_RAW_CHARS:
        raise ActionParseError(f"output of {len(text)} characters exceeds {MAX_RAW_CHARS}")


def read_action(text: str, reader: Reader) -> Action:
    """One action of kvagent's language (with the tolerated forms above), coordinates read by
    ``reader``.  Raises ``ActionError`` subclasses."""
    check_length(text)
    s = _clean(text)
    if not s:
        raise ActionParseError("empty output")
    if "\n" in s:
        raise ActionParseError("expected one action on one line")
    if s in _BARE:
        return _BARE[s]
    return read_call(s, reader, CALLS)


def parse_action_strict(text: str, *, convention: CoordConvention = CoordConvention.ABSOLUTE,
                        screen: Screen) -> Action:
    """Parse one action or raise ``ActionParseError`` / ``InvalidActionError`` (with the cause).

    Coordinates are read in ``convention`` and returned as absolute pixels of ``screen``
    (clamped onto it: see ``parse_action_detailed`` for which points were).
    """
    return read_action(text, Reader(convention, screen))


def check_screen(screen: Screen) -> None:
    """A bad screen is the caller's error, not the model's: it raises."""
    if screen[0] < 1 or screen[1] < 1:
        raise InvalidActionError(f"screen size must be positive, got {screen}")


def noop(text: str, exc: Exception) -> NoOp:
    """The ``NoOp`` for model ``text`` that failed to parse with ``exc``.

    An ``ActionError`` is the model's fault; anything else is a parser bug (the fuzz tests
    drive the strict parsers to make sure there is none) but must not end the episode either:
    it is logged as an error and the step idles like any unparsable output.
    """
    if isinstance(exc, ActionError):
        reason = str(exc) or type(exc).__name__
        log.debug("action_parse_failed", reason=reason, n_chars=len(text))
    else:
        reason = f"parser error: {type(exc).__name__}"
        log.error("action_parser_bug", error=repr(exc)[:200], n_chars=len(text))
    return NoOp(reason=reason, raw=text)


def parse_action_detailed(text: str, *,
                          convention: CoordConvention = CoordConvention.ABSOLUTE,
                          screen: Screen) -> Parsed:
    """``parse_action`` with the parser's notes (clamped coordinates) beside the action."""
    check_screen(screen)
    reader = Reader(convention, screen)
    try:
        return Parsed(read_action(text, reader), tuple(reader.notes))
    except Exception as exc:  # noqa: BLE001 — model text must not end the episode; see noop
        return Parsed(noop(text, exc))


def parse_action(text: str, *, convention: CoordConvention = CoordConvention.ABSOLUTE,
                 screen: Screen) -> Action:
    """Parse model text into an ``Action``; anything unparsable becomes ``NoOp(reason, raw)``.

    Never raises for bad model text (a bad ``screen`` is the caller's error and does raise).
    """
    return parse_action_detailed(text, convention=convention, screen=screen).action
