"""The action language as a GBNF grammar (llama.cpp syntax), one action per output.

Every output is one call, no surrounding text and no optional whitespace::

    click(512, 300)        double_click(512, 300)    right_click(512, 300)
    move_to(512, 300)      drag(10, 20, 300, 400)    type("hello \\"world\\"")
    hotkey("ctrl", "c")    press("enter")            scroll(0, -5)
    wait(1)                done()                    fail()

The grammar is deliberately tight so that even a random-weight model terminates fast: every
number and string is bounded, and the longest sentence of the language is at most
``MAX_ACTION_CHARS`` characters.  The tiny test vocabularies hold every printable ASCII
character as a token, so the worst case is one token per character; with the end-of-generation
token a grammar-constrained generation of ``MAX_ACTION_CHARS + 1`` tokens always completes.
That is why typed text is printable ASCII only (a non-ASCII character can cost up to four
byte-fallback tokens) and at most ``TYPE_MAX_CHARS`` characters, or ``TYPE_MAX_CHARS_ESCAPED``
when it contains an escape (``\\"``, ``\\\\``, ``\\n``, ``\\t`` take two characters each).

The grammar is built from tiny combinators that carry each expression's longest match, so the
bound is computed from the very text handed to llama.cpp, not maintained by hand.
"""

from __future__ import annotations

import functools

import attrs

from vmenv.actions.coords import CoordConvention
from vmenv.actions.keys import GRAMMAR_MODIFIERS, GRAMMAR_NAMED_KEYS

#: The longest action text the grammar admits (one token per character, worst case).
MAX_ACTION_CHARS = 47
TYPE_MAX_CHARS = 24
TYPE_MAX_CHARS_ESCAPED = 16
#: Scroll amounts: at most this many digits, signed.
SCROLL_DIGITS = 2


@attrs.frozen
class _Expr:
    """A GBNF expression and the length of its longest match, in characters.

    ``atomic``: the text can take a suffix (``?``, ``{m,n}``) without parentheses.
    ``body``: for a group made by ``_alt``, the alternatives without the parentheses.
    """

    text: str
    max_chars: int
    atomic: bool = True
    body: str | None = None


def _lit(s: str) -> _Expr:
    escaped = s.replace("\\", "\\\\").replace('"', '\\"')
    return _Expr(f'"{escaped}"', len(s))


def _cls(spec: str) -> _Expr:
    return _Expr(f"[{spec}]", 1)  # every class below matches one ASCII character


def _seq(*parts: _Expr) -> _Expr:
    return _Expr(" ".join(p.text for p in parts), sum(p.max_chars for p in parts), atomic=False)


def _alt(*parts: _Expr) -> _Expr:
    body = " | ".join(p.text for p in parts)
    return _Expr(f"({body})", max(p.max_chars for p in parts), body=body)


def _group(part: _Expr) -> str:
    return part.text if part.atomic else f"({part.text})"


def _opt(part: _Expr) -> _Expr:
    return _Expr(f"{_group(part)}?", part.max_chars)


def _rep(part: _Expr, lo: int, hi: int) -> _Expr:
    return _Expr(f"{_group(part)}{{{lo},{hi}}}", part.max_chars * hi)


class _Rules:
    """Named rules in definition order; a reference carries the rule's longest match."""

    def __init__(self) -> None:
        self._rules: dict[str, _Expr] = {}

    def define(self, name: str, expr: _Expr) -> _Expr:
        assert name not in self._rules, name
        self._rules[name] = expr
        return _Expr(name, expr.max_chars)

    def text(self) -> str:
        return "".join(f"{name} ::= {expr.body or expr.text}\n"
                       for name, expr in self._rules.items())


def _coord(convention: CoordConvention) -> _Expr:
    nonzero = _cls("1-9")
    digit = _cls("0-9")
    if convention is CoordConvention.ABSOLUTE:  # 0..9999 px, no leading zeros
        return _alt(_lit("0"), _seq(nonzero, _rep(digit, 0, 3)))
    if convention is CoordConvention.RELATIVE_999:  # 0..999
        return _alt(_lit("0"), _seq(nonzero, _rep(digit, 0, 2)))
    # RELATIVE_1: 0, 0.x..0.xxx, 1, 1.0..1.000
    return _alt(_seq(_lit("0"), _opt(_seq(_lit("."), _rep(digit, 1, 3)))),
                _seq(_lit("1"), _opt(_seq(_lit("."), _rep(_lit("0"), 1, 3)))))


@functools.cache
def _build(convention: CoordConvention) -> tuple[str, int]:
    r = _Rules()
    num = r.define("num", _coord(convention))
    point = r.define("point", _seq(num, _lit(", "), num))
    amount = r.define("amount", _alt(_lit("0"), _seq(_opt(_lit("-")), _cls("1-9"),
                                                     _rep(_cls("0-9"), 0, SCROLL_DIGITS - 1))))
    # printable ASCII except '"' and '\' ; escapes for those two and for newline / tab
    plain = r.define("plain", _cls(r" !#-\[\]-~"))
    unit = r.define("unit", _alt(plain, _seq(_lit("\\"), _cls(r'"\\nt'))))
    text = r.define("text", _alt(_rep(plain, 1, TYPE_MAX_CHARS),
                                 _rep(unit, 1, TYPE_MAX_CHARS_ESCAPED)))
    keyname = r.define("keyname", _alt(_cls("a-z0-9"), *(_lit(k) for k in GRAMMAR_NAMED_KEYS)))
    key = r.define("key", _seq(_lit('"'), keyname, _lit('"')))
    modname = r.define("modname", _alt(*(_lit(k) for k in GRAMMAR_MODIFIERS)))
    mod = r.define("mod", _seq(_lit('"'), modname, _lit('"')))
    sep = _lit(", ")
    actions = {
        "click": _seq(_lit("click("), point, _lit(")")),
        "double-click": _seq(_lit("double_click("), point, _lit(")")),
        "right-click": _seq(_lit("right_click("), point, _lit(")")),
        "move-to": _seq(_lit("move_to("), point, _lit(")")),
        "drag": _seq(_lit("drag("), point, sep, point, _lit(")")),
        "type": _seq(_lit('type("'), text, _lit('")')),
        "hotkey": _seq(_lit("hotkey("), mod, sep, _opt(_seq(mod, sep)), key, _lit(")")),
        "press": _seq(_lit("press("), key, _lit(")")),
        "scroll": _seq(_lit("scroll("), amount, sep, amount, _lit(")")),
        "wait": _seq(_lit("wait("), _cls("1-9"), _lit(")")),
        "done": _lit("done()"),
        "fail": _lit("fail()"),
    }
    refs = [r.define(name, expr) for name, expr in actions.items()]
    root = _alt(*refs)
    # root goes first: llama.cpp starts from the rule named "root" wherever it is, but
    # readers start at the top.
    text_out = f"root ::= {root.body}\n{r.text()}"
    return text_out, root.max_chars


def action_grammar(convention: CoordConvention = CoordConvention.ABSOLUTE) -> str:
    """The GBNF text of the action language with coordinates in ``convention``."""
    return _build(convention)[0]


def max_action_chars(convention: CoordConvention = CoordConvention.ABSOLUTE) -> int:
    """The longest action the grammar for ``convention`` admits, in characters."""
    return _build(convention)[1]


for _c in CoordConvention:  # the bound is part of the contract: check it at import
    assert max_action_chars(_c) <= MAX_ACTION_CHARS, (_c, max_action_chars(_c))

#: The action grammar with absolute pixel coordinates (OSWorld's convention).
ACTION_GRAMMAR: str = action_grammar(CoordConvention.ABSOLUTE)
