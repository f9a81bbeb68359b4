"""A test helper: the GBNF subset kvagent's grammars use, translated into a Python regex.

kvagent's grammars are not recursive and use only literals, character classes, grouping,
alternation, ``?`` and ``{m,n}``: every rule can be inlined into one regular expression.
That gives the tests an independent reading of a grammar (hypothesis draws sentences from
it; formatted actions are checked against it) that does not go through llama.cpp.
"""

from __future__ import annotations

import functools
import re

_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{\d+(?:,\d*)?\}|[()|?*+]|[\w-]+|\s+')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "[": "[", "]": "]"}


def _literal(tok: str) -> str:
    body = re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], tok[1:-1])
    return re.escape(body)


def _translate(body: str, rules: dict[str, str], seen: tuple[str, ...]) -> str:
    out = []
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        assert m, f"cannot read GBNF at {body[pos:pos + 20]!r}"
        tok, pos = m.group(0), m.end()
        if tok.isspace():
            continue
        if tok.startswith('"'):
            out.append(f"(?:{_literal(tok)})")
        elif tok.startswith("["):
            # GBNF classes are regex classes, except that a regex needs no escape for '"'
            out.append(tok.replace('\\"', '"'))
        elif tok in "()|?*+" or tok.startswith("{"):
            out.append("(?:" if tok == "(" else tok)
        else:
            assert tok not in seen, f"recursive rule {tok}"
            out.append(f"(?:{_translate(rules[tok], rules, (*seen, tok))})")
    return "".join(out)


@functools.cache
def grammar_regex(grammar: str) -> str:
    """The regex (for ``re.fullmatch``) of the language of ``grammar``."""
    rules = {}
    for line in grammar.splitlines():
        if line.strip():
            name, _, body = line.partition(" ::= ")
            rules[name.strip()] = body
    return _translate(rules["root"], rules, ("root",))
