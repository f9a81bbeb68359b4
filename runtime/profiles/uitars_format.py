"""UI-TARS' responses: ``Thought: ...`` then ``Action: <call>``; the grammar, parser and writer.

Calls (Python-call syntax, read with ``ast``, never evaluated)::

    click(start_box='(x,y)')          left_double(start_box='(x,y)')
    right_single(start_box='(x,y)')   drag(start_box='(x1,y1)', end_box='(x2,y2)')
    hotkey(key='ctrl c')              type(content='hello\\n')
    scroll(start_box='(x,y)', direction='down')      wait()     finished()     call_user()

A box may carry the ``<|box_start|>``/``<|box_end|>`` markers, be a ``<point>x y</point>``
(UI-TARS 1.5's newer prompt, with ``point=``, ``start_point=``, ``end_point=``) or hold four
numbers (its centre is meant).  ``hotkey`` with one key is a key press; ``wait()`` waits 5 s
(the model's action space says so); ``scroll`` turns the wheel 5 clicks; ``call_user()`` (the
task needs the user or cannot be done) ends the episode as a failure.  A ``type`` whose
content holds unescaped quotes, which ``ast`` cannot read, is read by a fallback that only
unescapes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable

from runtime.actions.calls import Args, Builder, Reader, parse_expression, read_call
from runtime.actions.gbnf import Expr, Rules, alt, cls, int_upto, lit, rep, seq
from runtime.actions.grammar import quoted_text
from runtime.actions.parser import check_length, strip_end_of_turn
from vmenv.actions.errors import ActionError, ActionParseError, InvalidActionError
from vmenv.actions.keys import GRAMMAR_MODIFIERS, GRAMMAR_NAMED_KEYS
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, Press, Scroll, TypeText, Wait,
)

WAIT_S = 5.0  # "wait()": the model's action space sleeps 5 s
SCROLL_CLICKS = 5
THOUGHT_MAX_CHARS = 64
TEXT_MAX_CHARS, TEXT_MAX_ESCAPED = 24, 16

_ACTION = "Action:"
_ACTION_LINE = re.compile(r"(?:^|\n)[ \t]*Action:")
_THOUGHT = re.compile(r"^[ \t]*(?:thought|action_summary|reflection)[ \t]*:[ \t]*",
                      re.IGNORECASE)
_CONTENT_CALL = re.compile(r"^(type|finished)\(content=(['\"])(.*)\2\)$", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t"}
#: key names written for keys the model spells as words
_KEY_WORDS = {" ": "space", "\n": "enter", "\t": "tab"}


def _call_user(r: Reader, a: Args) -> Fail:
    r.notes.append("call_user: the task needs the user or cannot be done; ended as a failure")
    return Fail()


CALLS: dict[str, Builder] = {
    "click": lambda r, a: r.click(a),
    "left_single": lambda r, a: r.click(a),
    "left_double": lambda r, a: r.click(a, clicks=2),
    "right_single": lambda r, a: r.click(a, button="right"),
    "hover": lambda r, a: MoveTo(*r.point(a)),
    "drag": lambda r, a: r.drag(a),
    "select": lambda r, a: r.drag(a),
    "hotkey": lambda r, a: r.hotkey(a, single_is_press=True),
    "press": lambda r, a: r.hotkey(a, single_is_press=True),
    "type": lambda r, a: r.type(a),
    "scroll": lambda r, a: r.scroll(a),
    "wait": lambda r, a: r.wait(a),
    "finished": lambda r, a: r.finished(a),
    "call_user": _call_user,
}


def split_response(text: str) -> tuple[str, str]:
    """(thought, action text) of a response.  The action follows the first line that starts
    with 'Action:' (typed content may itself hold 'Action:'), else the last 'Action:'."""
    line = _ACTION_LINE.search(text)
    if line is not None:
        cut, after = line.start(), line.end()
    else:
        cut = text.rfind(_ACTION)
        if cut < 0:
            return "", text.strip()
        after = cut + len(_ACTION)
    thought = _THOUGHT.sub("", text[:cut].strip(), count=1)
    return thought.strip(), text[after:].strip()


def _python_syntax(text: str) -> bool:
    try:
        parse_expression(text)
    except ActionParseError:
        return False
    return True


def _unescape(body: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body,
                  flags=re.DOTALL)


def read_response(text: str, reader: Reader) -> Action:
    """One response → its action.  Raises ``ActionError`` subclasses."""
    check_length(text)
    _, action = split_response(strip_end_of_turn(text))
    calls = [c.strip() for c in action.split("\n\n") if c.strip()]
    if not calls:
        raise ActionParseError("no action after 'Action:'")
    if len(calls) > 1:
        reader.notes.append(f"{len(calls) - 1} further action(s) ignored: one action per step")
    call = calls[0].replace("\n", "\\n")  # a raw newline inside content means a typed one
    try:
        return read_call(call, reader, CALLS)
    except ActionError:
        # only text Python cannot read at all (an unescaped quote in the content) falls back
        fallback = _CONTENT_CALL.match(call)
        if fallback is None or _python_syntax(call):
            raise
    name, body = fallback.group(1), _unescape(fallback.group(3))
    reader.notes.append(f"{name}: content read without Python quoting rules")
    return TypeText(body) if name == "type" else Done()


def _quote(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


PointWriter = Callable[[int, int], tuple[int, int]]


def write_call(action: Action, point: PointWriter, *, markers: bool = False) -> str:
    """The call for ``action``; ``point(x, y)`` writes a screen point in model units.
    ``markers``: wrap boxes in ``<|box_start|>``/``<|box_end|>`` (the trained history form)."""
    def box(x: int, y: int) -> str:
        u, v = point(x, y)
        inner = f"({u},{v})"
        return _quote(f"<|box_start|>{inner}<|box_end|>" if markers else inner)

    match action:
        case Click(x=x, y=y, button="left", clicks=1):
            return f"click(start_box={box(x, y)})"
        case Click(x=x, y=y, button="left", clicks=2):
            return f"left_double(start_box={box(x, y)})"
        case Click(x=x, y=y, button="right", clicks=1):
            return f"right_single(start_box={box(x, y)})"
        case MoveTo(x=x, y=y):
            return f"hover(start_box={box(x, y)})"
        case DragTo(x0=x0, y0=y0, x1=x1, y1=y1):
            return f"drag(start_box={box(x0, y0)}, end_box={box(x1, y1)})"
        case Press(key=key):
            return f"hotkey(key={_quote(_KEY_WORDS.get(key, key))})"
        case Hotkey(keys=keys):
            return f"hotkey(key={_quote(' '.join(_KEY_WORDS.get(k, k) for k in keys))})"
        case TypeText(text=text):
            return f"type(content={_quote(text)})"
        case Scroll(dx=dx, dy=dy, x=x, y=y) if abs(dx) + abs(dy) == SCROLL_CLICKS and not (
                dx and dy):
            direction = {(0, 1): "up", (0, -1): "down", (-1, 0): "left", (1, 0): "right"}[
                (dx // SCROLL_CLICKS, dy // SCROLL_CLICKS)]
            at = "" if x is None or y is None else f"start_box={box(x, y)}, "
            return f"scroll({at}direction='{direction}')"
        case Wait(seconds=s) if s == WAIT_S:
            return "wait()"
        case Done():
            return "finished()"
        case Fail():
            return "call_user()"
    raise InvalidActionError(f"UI-TARS has no action for {action!r}")


@functools.cache
def build_grammar(image: tuple[int, int] | None) -> tuple[str, int]:
    """(GBNF text, longest sentence) of one response; ``image``: the model's pixel space
    (absolute coordinates up to its size), None: the 0–999 relative grid."""
    r = Rules()
    nx = r.define("num-x", int_upto(999 if image is None else image[0] - 1))
    ny = r.define("num-y", int_upto(999 if image is None else image[1] - 1))
    box = r.define("box", seq(lit("'("), nx, lit(","), ny, lit(")'")))
    text = quoted_text(r, "'", TEXT_MAX_CHARS, TEXT_MAX_ESCAPED)
    keyname = r.define("keyname", alt(cls("a-z0-9"), *(lit(k) for k in GRAMMAR_NAMED_KEYS)))
    mod = r.define("mod", seq(alt(*(lit(k) for k in GRAMMAR_MODIFIERS)), lit(" ")))

    def at(name: str) -> Expr:
        return seq(lit(f"{name}(start_box="), box, lit(")"))

    calls = {
        "click": at("click"), "left-double": at("left_double"),
        "right-single": at("right_single"),
        "drag": seq(lit("drag(start_box="), box, lit(", end_box="), box, lit(")")),
        "hotkey": seq(lit("hotkey(key='"), rep(mod, 0, 2), keyname, lit("')")),
        "type": seq(lit("type(content='"), text, lit("')")),
        "scroll": seq(lit("scroll(start_box="), box, lit(", direction='"),
                      alt(*(lit(d) for d in ("up", "down", "left", "right"))), lit("')")),
        "wait": lit("wait()"), "finished": lit("finished()"), "call-user": lit("call_user()"),
    }
    call = r.define("call", alt(*(r.define(name, e) for name, e in calls.items())))
    # the thought: printable ASCII without '<' (it cannot open a tag)
    thought = r.define("thought", rep(cls(r" -;=-~"), 1, THOUGHT_MAX_CHARS))
    root = seq(lit("Thought: "), thought, lit("\nAction: "), call)
    return r.grammar(root), root.max_chars
