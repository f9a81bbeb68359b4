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

The grammar is built from the combinators of ``gbnf`` that carry each expression's longest
match, so the bound is computed from the very text handed to llama.cpp, not maintained by hand.
With a ``screen``, absolute coordinates are bounded by its size (x by the width, y by the
height), so a constrained model cannot point off the screen.
"""

from __future__ import annotations

import functools

from runtime.actions.gbnf import Expr, Rules, alt, cls, int_upto, lit, opt, rep, seq
from vmenv.actions.coords import CoordConvention, Screen
from vmenv.actions.keys import GRAMMAR_MODIFIERS, GRAMMAR_NAMED_KEYS

#: The longest action text the grammar admits (one token per character, worst case).
MAX_ACTION_CHARS = 47
TYPE_MAX_CHARS = 24
TYPE_MAX_CHARS_ESCAPED = 16
#: Scroll amounts: at most this many digits, signed.
SCROLL_DIGITS = 2


def coord_number(convention: CoordConvention, size: int | None = None) -> Expr:
    """One coordinate in ``convention``; ``size``: the axis length bounding absolute pixels."""
    if convention is CoordConvention.ABSOLUTE:
        # 0..size-1 px, or 0..9999 px without a screen; no leading zeros
        return int_upto(9999 if size is None else size - 1)
    if convention is CoordConvention.RELATIVE_999:  # 0..999
        return int_upto(999)
    # RELATIVE_1: 0, 0.x..0.xxx, 1, 1.0..1.000
    return alt(seq(lit("0"), opt(seq(lit("."), rep(cls("0-9"), 1, 3)))),
               seq(lit("1"), opt(seq(lit("."), rep(lit("0"), 1, 3)))))


def quoted_text(r: Rules, quote: str, max_plain: int, max_escaped: int) -> Expr:
    """The inside of a ``quote``-delimited string: printable ASCII without the quote and the
    backslash, or escapes (``\\`` + quote, backslash, n, t) that take two characters each."""
    exclude = {'"': r" !#-\[\]-~", "'": r" -&(-\[\]-~"}[quote]
    name = {'"': "dq", "'": "sq"}[quote]
    plain = r.define(f"{name}-plain", cls(exclude))
    unit = r.define(f"{name}-unit", alt(plain, seq(lit("\\"), cls(quote + r"\\nt"))))
    return r.define(f"{name}-text", alt(rep(plain, 1, max_plain), rep(unit, 1, max_escaped)))


@functools.cache
def _build(convention: CoordConvention, screen: Screen | None) -> tuple[str, int]:
    r = Rules()
    if convention is CoordConvention.ABSOLUTE and screen is not None:
        nx = r.define("num-x", coord_number(convention, screen[0]))
        ny = r.define("num-y", coord_number(convention, screen[1]))
    else:
        nx = ny = r.define("num", coord_number(convention))
    point = r.define("point", seq(nx, lit(", "), ny))
    amount = r.define("amount", alt(lit("0"), seq(opt(lit("-")), cls("1-9"),
                                                  rep(cls("0-9"), 0, SCROLL_DIGITS - 1))))
    text = quoted_text(r, '"', TYPE_MAX_CHARS, TYPE_MAX_CHARS_ESCAPED)
    keyname = r.define("keyname", alt(cls("a-z0-9"), *(lit(k) for k in GRAMMAR_NAMED_KEYS)))
    key = r.define("key", seq(lit('"'), keyname, lit('"')))
    modname = r.define("modname", alt(*(lit(k) for k in GRAMMAR_MODIFIERS)))
    mod = r.define("mod", seq(lit('"'), modname, lit('"')))
    sep = lit(", ")
    actions = {
        "click": seq(lit("click("), point, lit(")")),
        "double-click": seq(lit("double_click("), point, lit(")")),
        "right-click": seq(lit("right_click("), point, lit(")")),
        "move-to": seq(lit("move_to("), point, lit(")")),
        "drag": seq(lit("drag("), point, sep, point, lit(")")),
        "type": seq(lit('type("'), text, lit('")')),
        "hotkey": seq(lit("hotkey("), mod, sep, opt(seq(mod, sep)), key, lit(")")),
        "press": seq(lit("press("), key, lit(")")),
        "scroll": seq(lit("scroll("), amount, sep, amount, lit(")")),
        "wait": seq(lit("wait("), cls("1-9"), lit(")")),
        "done": lit("done()"),
        "fail": lit("fail()"),
    }
    root = alt(*(r.define(name, expr) for name, expr in actions.items()))
    return r.grammar(root), root.max_chars


def action_grammar(convention: CoordConvention = CoordConvention.ABSOLUTE,
                   screen: Screen | None = None) -> str:
    """The GBNF text of the action language with coordinates in ``convention`` (absolute ones
    bounded by ``screen`` when given)."""
    return _build(convention, screen)[0]


def max_action_chars(convention: CoordConvention = CoordConvention.ABSOLUTE,
                     screen: Screen | None = None) -> int:
    """The longest action the grammar for ``convention`` (and ``screen``) admits, in characters."""
    return _build(convention, screen)[1]


for _c in CoordConvention:  # the bound is part of the contract: check it at import
    assert max_action_chars(_c) <= MAX_ACTION_CHARS, (_c, max_action_chars(_c))

#: The action grammar with absolute pixel coordinates (OSWorld's convention).
ACTION_GRAMMAR: str = action_grammar(CoordConvention.ABSOLUTE)
