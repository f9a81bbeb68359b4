"""Tiny GBNF combinators that carry each expression's longest match, in characters.

Every grammar kvagent hands to llama.cpp (its own action language, the agent profiles' output
formats) is built from these, so its length bound is computed from the very text the sampler
gets, not maintained by hand.  The bound matters: with one token per character in the worst
case (the test vocabularies hold every printable ASCII character and every byte as a token), a
generation of ``bound + 1`` tokens always ends on its own, on end-of-generation.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Expr:
    """A GBNF expression and the length of its longest match, in characters.

    ``atomic``: the text can take a suffix (``?``, ``{m,n}``) without parentheses.
    ``body``: for a group made by ``alt``, the alternatives without the parentheses.
    """

    text: str
    max_chars: int
    atomic: bool = True
    body: str | None = None


def lit(s: str) -> Expr:
    """A literal string (length in characters; keep it ASCII so characters bound tokens)."""
    escaped = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return Expr(f'"{escaped}"', len(s))


def cls(spec: str) -> Expr:
    """A character class; every class used matches one ASCII character."""
    return Expr(f"[{spec}]", 1)


def seq(*parts: Expr) -> Expr:
    return Expr(" ".join(p.text for p in parts), sum(p.max_chars for p in parts), atomic=False)


def alt(*parts: Expr) -> Expr:
    body = " | ".join(p.text for p in parts)
    return Expr(f"({body})", max(p.max_chars for p in parts), body=body)


def _group(part: Expr) -> str:
    return part.text if part.atomic else f"({part.text})"


def opt(part: Expr) -> Expr:
    return Expr(f"{_group(part)}?", part.max_chars)


def rep(part: Expr, lo: int, hi: int) -> Expr:
    return Expr(f"{_group(part)}{{{lo},{hi}}}", part.max_chars * hi)


def int_upto(n: int) -> Expr:
    """Decimal integers 0..n, no leading zeros: exactly the integers a bounded axis admits."""
    if n < 0:
        raise ValueError(f"int_upto needs n >= 0, got {n}")
    s = str(n)
    k = len(s)
    if k == 1:
        return cls(f"0-{s}")
    # shorter numbers: 0, or a non-zero digit then up to k-2 more digits
    parts = [lit("0"), seq(cls("1-9"), rep(cls("0-9"), 0, k - 2)) if k > 2 else cls("1-9")]
    # k-digit numbers <= n: equal to n on a prefix, then a smaller digit, then anything
    for i in range(k):
        low = 1 if i == 0 else 0
        high = int(s[i]) - 1
        if high < low:
            continue
        head = [lit(s[:i])] if i else []
        tail = [rep(cls("0-9"), k - i - 1, k - i - 1)] if k - i - 1 else []
        parts.append(seq(*head, cls(f"{low}-{high}"), *tail))
    parts.append(lit(s))
    return alt(*parts)


class Rules:
    """Named rules in definition order; a reference carries the rule's longest match."""

    def __init__(self) -> None:
        self._rules: dict[str, Expr] = {}

    def define(self, name: str, expr: Expr) -> Expr:
        assert name not in self._rules, name
        self._rules[name] = expr
        return Expr(name, expr.max_chars)

    def grammar(self, root: Expr) -> str:
        """The whole grammar, ``root`` first: llama.cpp starts from the rule named "root"
        wherever it is, but readers start at the top."""
        rules = "".join(f"{name} ::= {expr.body or expr.text}\n"
                        for name, expr in self._rules.items())
        return f"root ::= {root.body or root.text}\n{rules}"
