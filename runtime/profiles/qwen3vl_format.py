"""Qwen3-VL's computer-use tool calls: the grammar, the parser and the writer.

A response is an optional one-line summary and one tool call::

    Action: open the file menu
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [512, 40]}}
    </tool_call>

``arguments.action`` is one of left_click, right_click, middle_click, double_click,
triple_click, mouse_move (with ``coordinate``), left_click_drag (to ``coordinate``, from the
pointer or ``start_coordinate``), type (``text``), key (``keys``: a chord, pressed in order and
released in reverse), scroll / hscroll (``pixels``: wheel clicks, positive up / right, optional
``coordinate``), wait (``time`` seconds), terminate (``status`` success / failure) and answer.
Coordinates are on a 0–999 grid over each axis.  The JSON is read with ``json.loads`` (data,
never evaluated) in any key order and spacing; the grammar writes the chat template's
spelling (``json.dumps`` defaults: ``", "`` and ``": "``).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from runtime.actions.calls import Args, Builder, Reader, number
from runtime.actions.gbnf import Rules, alt, cls, int_upto, lit, opt, rep, seq
from runtime.actions.grammar import quoted_text
from runtime.actions.parser import check_length, strip_end_of_turn
from vmenv.actions.coords import CoordConvention, Screen, from_screen
from vmenv.actions.errors import ActionParseError, InvalidActionError
from vmenv.actions.keys import GRAMMAR_MODIFIERS, GRAMMAR_NAMED_KEYS, KEY_NAMES
from vmenv.actions.types import (
    Action, Click, Done, DragTo, Fail, Hotkey, MoveTo, Press, Scroll, TypeText, Wait,
)

TOOL_NAME = "computer_use"
CONVENTION = CoordConvention.RELATIVE_999
SUMMARY_MAX_CHARS = 48
TEXT_MAX_CHARS, TEXT_MAX_ESCAPED = 24, 16
SCROLL_DIGITS = 3

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_SUMMARY = re.compile(r"^[ \t]*action[ \t]*:[ \t]*(.*)$", re.IGNORECASE | re.MULTILINE)
_BUTTONS = {"left_click": ("left", 1), "right_click": ("right", 1),
            "middle_click": ("middle", 1), "double_click": ("left", 2),
            "triple_click": ("left", 3)}


def _keys(r: Reader, a: Args) -> Press | Hotkey:
    value = a.get(None, "keys", "key")
    keys = [value] if isinstance(value, str) else value
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ActionParseError("key needs a list of key names")
    names: list[str] = []
    for k in keys:  # "ctrl+c" inside one string is a chord too ('+' alone is a key)
        names += k.split("+") if "+" in k and k.strip() not in KEY_NAMES else [k]
    return Press(names[0]) if len(names) == 1 else Hotkey(tuple(names))


def _scroll(axis: str) -> Builder:
    def build(r: Reader, a: Args) -> Scroll:
        amount = number(a.get(None, "pixels"), "pixels")
        if amount != int(amount):
            raise ActionParseError(f"pixels must be a whole number, got {amount}")
        at = r.point(a) if a.has("coordinate") else (None, None)
        dx, dy = (int(amount), 0) if axis == "x" else (0, int(amount))
        return Scroll(dx, dy, *at)
    return build


def _terminate(r: Reader, a: Args) -> Done | Fail:
    status = a.get(None, "status", default=None)
    if status is None:
        r.notes.append("terminate without a status: taken as success")
        return Done()
    if status not in ("success", "failure"):
        raise ActionParseError("terminate status must be success or failure")
    return Done() if status == "success" else Fail()


def _answer(r: Reader, a: Args) -> Action:
    raise ActionParseError("answer is not an action on the desktop")


ACTIONS: dict[str, Builder] = {
    **{name: (lambda b, n: lambda r, a: r.click(a, button=b, clicks=n))(*bn)
       for name, bn in _BUTTONS.items()},
    "mouse_move": lambda r, a: MoveTo(*r.point(a)),
    "left_click_drag": lambda r, a: r.drag_from_pointer(a),
    "type": lambda r, a: r.type(a),
    "key": _keys,
    "scroll": _scroll("y"),
    "hscroll": _scroll("x"),
    "wait": lambda r, a: r.wait(a),
    "terminate": _terminate,
    "answer": _answer,
}


def _load(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ActionParseError(f"tool call is not JSON: {type(exc).__name__}") from exc


def _call_json(text: str, notes: list[str]) -> str:
    """The JSON of the first tool call in ``text`` (a bare JSON object is accepted too)."""
    blocks = [m.group(1).strip() for m in _TOOL_CALL.finditer(text)]
    if len(blocks) > 1:
        notes.append(f"{len(blocks) - 1} further tool call(s) ignored: one action per step")
    if blocks:
        return blocks[0]
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ActionParseError("no <tool_call> in the output")
    return text[start:end + 1]


def read_tool_call(text: str, reader: Reader) -> Action:
    """One response → its action.  Raises ``ActionError`` subclasses."""
    check_length(text)
    call = _load(_call_json(strip_end_of_turn(text), reader.notes))
    if not isinstance(call, dict):
        raise ActionParseError("a tool call must be a JSON object")
    if "arguments" not in call and "action" in call:
        reader.notes.append("bare arguments without the tool-call wrapper")
        args = call
    else:
        if call.get("name") != TOOL_NAME:
            raise ActionParseError(f"unknown tool {str(call.get('name'))[:40]!r}")
        args = call.get("arguments")
        if isinstance(args, str):  # some servers hand arguments over as a JSON string
            args = _load(args)
    if not isinstance(args, dict) or not isinstance(args.get("action"), str):
        raise ActionParseError("tool arguments need an action name")
    name = args["action"]
    builder = ACTIONS.get(name)
    if builder is None:
        raise ActionParseError(f"unknown computer_use action {name[:40]!r}")
    a = Args(name, kw={str(k): v for k, v in args.items() if k != "action"})
    action = builder(reader, a)
    if a.unused():
        reader.notes.append(f"{name}: ignored arguments {', '.join(a.unused())}")
    return action


def summary(text: str) -> str:
    """The response's 'Action:' line (the model's own one-line description), or ''."""
    head = text[: text.find("<tool_call>")] if "<tool_call>" in text else text
    found = _SUMMARY.findall(head[:4000])
    return found[-1].strip() if found else ""


def arguments(action: Action, screen: Screen) -> dict[str, Any]:
    """The tool arguments that perform ``action``; ``InvalidActionError`` when none do."""
    def pt(x: int, y: int) -> list[int]:
        return list(from_screen(x, y, CONVENTION, screen))  # type: ignore[arg-type]

    match action:
        case Click(x=x, y=y, button=button, clicks=clicks):
            for name, bn in _BUTTONS.items():
                if bn == (button, clicks):
                    return {"action": name, "coordinate": pt(x, y)}
        case MoveTo(x=x, y=y):
            return {"action": "mouse_move", "coordinate": pt(x, y)}
        case DragTo(x0=x0, y0=y0, x1=x1, y1=y1):
            return {"action": "left_click_drag", "start_coordinate": pt(x0, y0),
                    "coordinate": pt(x1, y1)}
        case TypeText(text=text):
            return {"action": "type", "text": text}
        case Press(key=key):
            return {"action": "key", "keys": [key]}
        case Hotkey(keys=keys):
            return {"action": "key", "keys": list(keys)}
        case Scroll(dx=dx, dy=dy, x=x, y=y) if not (dx and dy):
            out: dict[str, Any] = ({"action": "hscroll", "pixels": dx} if dx
                                   else {"action": "scroll", "pixels": dy})
            if x is not None and y is not None:
                out["coordinate"] = pt(x, y)
            return out
        case Wait(seconds=s):
            return {"action": "wait", "time": int(s) if float(s).is_integer() else s}
        case Done():
            return {"action": "terminate", "status": "success"}
        case Fail():
            return {"action": "terminate", "status": "failure"}
    raise InvalidActionError(f"Qwen3-VL's computer_use has no action for {action!r}")


def write_tool_call(action: Action, screen: Screen) -> str:
    call = {"name": TOOL_NAME, "arguments": arguments(action, screen)}
    return f"<tool_call>\n{json.dumps(call, ensure_ascii=False)}\n</tool_call>"


@functools.cache
def build_grammar() -> tuple[str, int]:
    """(GBNF text, longest sentence in characters) of one response."""
    r = Rules()
    num = r.define("num", int_upto(999))
    point = r.define("point", seq(lit("["), num, lit(", "), num, lit("]")))
    # without the opening quote, so that "start_coordinate" can share it
    coordinate = r.define("coordinate", seq(lit('coordinate": '), point))
    amount = r.define("amount", alt(lit("0"), seq(opt(lit("-")), cls("1-9"),
                                                  rep(cls("0-9"), 0, SCROLL_DIGITS - 1))))
    text = quoted_text(r, '"', TEXT_MAX_CHARS, TEXT_MAX_ESCAPED)
    keyname = r.define("keyname", alt(cls("a-z0-9"), *(lit(k) for k in GRAMMAR_NAMED_KEYS)))
    mod = r.define("mod", seq(lit('"'), alt(*(lit(k) for k in GRAMMAR_MODIFIERS)), lit('", ')))
    calls = {
        "pointing": seq(lit('"'), alt(*(lit(n) for n in (*_BUTTONS, "mouse_move"))),
                        lit('", "'), coordinate),
        "drag": seq(lit('"left_click_drag", "'), opt(seq(lit("start_"), coordinate, lit(', "'))),
                    coordinate),
        "type": seq(lit('"type", "text": "'), text, lit('"')),
        "key": seq(lit('"key", "keys": ['), rep(mod, 0, 2), lit('"'), keyname, lit('"]')),
        "scroll": seq(lit('"'), alt(lit("scroll"), lit("hscroll")), lit('", "pixels": '), amount,
                      opt(seq(lit(', "'), coordinate))),
        "wait": seq(lit('"wait", "time": '), cls("1-9")),
        "terminate": seq(lit('"terminate", "status": "'), alt(lit("success"), lit("failure")),
                         lit('"')),
    }
    call = r.define("call", alt(*(r.define(name, e) for name, e in calls.items())))
    # the summary: printable ASCII without '<' (it cannot open a tag)
    line = r.define("summary", rep(cls(r" -;=-~"), 1, SUMMARY_MAX_CHARS))
    root = seq(opt(seq(lit("Action: "), line, lit("\n"))),
               lit('<tool_call>\n{"name": "computer_use", "arguments": {"action": '), call,
               lit("}}\n</tool_call>"))
    return r.grammar(root), root.max_chars
