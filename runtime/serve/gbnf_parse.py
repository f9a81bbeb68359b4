"""llama.cpp's GBNF dialect read as llama.cpp 0.3.36 reads it (``src/llama-grammar.cpp``), in
pure Python (no libllama): every branch of ``parse_sequence``, ``handle_repetitions`` and
``parse_rule`` has its counterpart below, in the same order, so what llama.cpp refuses this
refuses (``GrammarRejected``: what, where, and at most ~40 characters of the source, escaped
— safe to show and log).  Repetitions are kept as counted records, not copies: the reader's
client (``gbnf_cost``) counts what llama.cpp would allocate before anything is expanded.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

#: llama.cpp's MAX_REPETITION_THRESHOLD: ``{m,n}`` with m above it is refused, n above it
#: becomes unbounded (``{m,}``), and a repetition of a repetition may not multiply past it.
MAX_REPETITION = 2000
#: Groups nested in groups: deeper is refused (the reader recurses once per group).
MAX_NESTING = 200

# llama.cpp's ``llama_gretype`` (llama.h), in its order
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)
TERMINALS = frozenset({CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT})
_QUOTE_CHARS = 40


class GrammarRejected(ValueError):
    """The grammar does not parse as llama.cpp's GBNF, or is refused; the message is safe to
    show and log (no raw newline, control or escape character; at most ~40 characters of the
    source)."""

    code = "invalid_grammar"


class GrammarTooCostly(GrammarRejected):
    """The grammar parses but would cost llama.cpp too much to expand or to match."""

    code = "grammar_too_costly"

def _is_word(c: int) -> bool:
    return 97 <= c <= 122 or 65 <= c <= 90 or c == 45 or 48 <= c <= 57


def _el(kind: int, value: int = 0) -> int:
    """An element, packed: value << 4 | type."""
    return value << 4 | kind


@attrs.frozen
class _Rep:
    """``times`` inline copies of ``chunk`` (items: packed elements or ``_Rep``)."""

    chunk: tuple[int | _Rep, ...]
    times: int
    size: int  # elements, all copies


@attrs.frozen
class _Family:
    """The rules one repetition makes: ids ``first .. first + count - 1``; bounded, rule i
    (from 1) is ``chunk [ref rule i-1] | `` (rule 1 without the ref); unbounded, one rule
    ``chunk ref itself | ``."""

    first: int
    count: int
    chunk: tuple[int | _Rep, ...]
    chunk_size: int
    unbounded: bool


def _size(items: list[int | _Rep] | tuple[int | _Rep, ...]) -> int:
    return sum(1 if isinstance(i, int) else i.size for i in items)


class GrammarParser:
    """llama.cpp's ``llama_grammar_parser`` over the UTF-8 bytes, with repetitions kept as
    ``_Rep`` / ``_Family`` records instead of copies (``count_elements`` counts them,
    ``expand`` makes them)."""

    def __init__(self, src: bytes) -> None:
        self.src = src
        self.symbols: dict[bytes, int] = {}  # names in the text (they have no '_')
        self.n_symbols = 0  # names and generated ids: llama.cpp's symbol_ids.size()
        self.rules: dict[int, list[int | _Rep]] = {}
        self.families: list[_Family] = []
        self.first_use: dict[int, int] = {}  # a name's id -> where it first appears
        self.depth = 0

    # what llama.cpp's C string reads at i (its NUL past the end)
    def at(self, i: int) -> int:
        return self.src[i] if i < len(self.src) else 0

    def fail(self, what: str, pos: int) -> GrammarRejected:
        return GrammarRejected(f"{what} at {_where(self.src, pos)}")

    def symbol(self, name: bytes, pos: int) -> int:
        if name not in self.symbols:
            self.symbols[name] = self.n_symbols
            self.first_use[self.n_symbols] = pos
            self.n_symbols += 1
        return self.symbols[name]

    def generate(self, count: int = 1) -> int:
        first = self.n_symbols
        self.n_symbols += count
        return first

    def space(self, pos: int, newline_ok: bool) -> int:
        while True:
            c = self.at(pos)
            if c == 35:  # '#': to the end of the line
                while self.at(pos) not in (0, 13, 10):
                    pos += 1
            elif c in (32, 9) or (newline_ok and c in (13, 10)):
                pos += 1
            else:
                return pos

    def name(self, pos: int) -> int:
        end = pos
        while _is_word(self.at(end)):
            end += 1
        if end == pos:
            raise self.fail("expecting a name", pos)
        return end

    def integer(self, pos: int, limit: int, what: str) -> tuple[int, int]:
        end = pos
        while 48 <= self.at(end) <= 57:
            end += 1
        if end == pos:
            raise self.fail("expecting an integer", pos)
        value = int(self.src[pos:end]) if end - pos <= 40 else limit + 1
        if value > limit:  # std::stoull / stoul out of range
            raise self.fail(f"{what} is too large (at most {limit})", pos)
        return value, end

    def hex(self, pos: int, size: int) -> tuple[int, int]:
        value = 0
        end = pos + size
        i = pos
        while i < end and self.at(i):
            c = self.at(i)
            if 48 <= c <= 57 or 97 <= c <= 102 or 65 <= c <= 70:
                value = value << 4 | int(chr(c), 16)
            else:
                break
            i += 1
        if i != end:
            raise self.fail(f"expecting {size} hex digits", pos)
        return value, i

    def char(self, pos: int) -> tuple[int, int]:
        c = self.at(pos)
        if c == 92:  # backslash
            e = self.at(pos + 1)
            if e == 120:
                return self.hex(pos + 2, 2)
            if e == 117:
                return self.hex(pos + 2, 4)
            if e == 85:
                return self.hex(pos + 2, 8)
            simple = {116: 9, 114: 13, 110: 10, 92: 92, 34: 34, 91: 91, 93: 93, 45: 45}
            if e in simple:
                return simple[e], pos + 2
            raise self.fail("unknown escape", pos)
        if c:  # llama.cpp's decode_utf8 (the text is valid UTF-8)
            n = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[c >> 4]
            value = c & ((1 << (8 - n)) - 1)
            i = pos + 1
            while i < pos + n and self.at(i):
                value = (value << 6) + (self.at(i) & 0x3F)
                i += 1
            return value, i
        raise self.fail("unexpected end of input", pos)

    def token(self, pos: int) -> tuple[int, int]:
        if self.at(pos) != 60:
            raise self.fail("expecting '<'", pos)
        pos += 1
        if self.at(pos) != 91:
            raise self.fail("a token named by its text (<...>) is not supported here; give "
                            "its id, as <[ID]>", pos - 1)
        value, pos = self.integer(pos + 1, (1 << 32) - 1, "the token id")
        if self.at(pos) != 93:
            raise self.fail("expecting ']'", pos)
        if self.at(pos + 1) != 62:
            raise self.fail("expecting '>'", pos + 1)
        return value, pos + 2

    def parse(self) -> None:
        pos = self.space(0, True)
        while self.at(pos):
            pos = self.parse_rule(pos)
        if not self.rules:
            raise GrammarRejected("the grammar has no rules")

    def parse_rule(self, pos: int) -> int:
        end = self.name(pos)
        rule_id = self.symbol(self.src[pos:end], pos)
        pos = self.space(end, False)
        if self.src[pos:pos + 3] != b"::=":
            raise self.fail("expecting '::='", pos)
        pos = self.space(pos + 3, True)
        pos = self.alternates(pos, rule_id, False)
        c = self.at(pos)
        if c == 13:
            pos += 2 if self.at(pos + 1) == 10 else 1
        elif c == 10:
            pos += 1
        elif c:
            raise self.fail("expecting a newline or the end (a rule's alternatives continue "
                            "on a new line only inside parentheses or after '|')", pos)
        return self.space(pos, True)

    def alternates(self, pos: int, rule_id: int, nested: bool) -> int:
        rule: list[int | _Rep] = []
        pos = self.sequence(pos, rule, nested)
        while self.at(pos) == 124:  # '|'
            rule.append(_el(ALT))
            pos = self.space(pos + 1, True)
            pos = self.sequence(pos, rule, nested)
        rule.append(_el(END))
        self.rules[rule_id] = rule
        return pos

    def sequence(self, pos: int, rule: list[int | _Rep], nested: bool) -> int:
        last_sym_start = len(rule)
        n_prev_rules = 1
        while c := self.at(pos):
            if c == 34:  # '"': a literal
                pos += 1
                last_sym_start, n_prev_rules = len(rule), 1
                while self.at(pos) != 34:
                    if not self.at(pos):
                        raise self.fail("unexpected end of input in a string", pos)
                    value, pos = self.char(pos)
                    rule.append(_el(CHAR, value))
                pos = self.space(pos + 1, nested)
            elif c == 91:  # '[': a character class
                pos += 1
                start = CHAR
                if self.at(pos) == 94:  # '^'
                    pos += 1
                    start = CHAR_NOT
                last_sym_start, n_prev_rules = len(rule), 1
                while self.at(pos) != 93:
                    if not self.at(pos):
                        raise self.fail("unexpected end of input in a character class", pos)
                    value, pos = self.char(pos)
                    rule.append(_el(CHAR_ALT if last_sym_start < len(rule) else start, value))
                    if self.at(pos) == 45 and self.at(pos + 1) != 93:  # a range
                        if not self.at(pos + 1):
                            raise self.fail("unexpected end of input in a character class",
                                            pos + 1)
                        value, pos = self.char(pos + 1)
                        rule.append(_el(CHAR_RNG_UPPER, value))
                pos = self.space(pos + 1, nested)
            elif c in (60, 33):  # '<' or '!': a token
                kind = TOKEN
                if c == 33:
                    kind = TOKEN_NOT
                    pos += 1
                value, end = self.token(pos)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append(_el(kind, value))
                pos = self.space(end, nested)
            elif _is_word(c):  # a rule reference
                end = self.name(pos)
                ref = self.symbol(self.src[pos:end], pos)
                pos = self.space(end, nested)
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append(_el(RULE_REF, ref))
            elif c == 40:  # '(': a group, a rule of its own
                if self.depth >= MAX_NESTING:
                    raise GrammarTooCostly(f"groups nested deeper than {MAX_NESTING} at "
                                           f"{_where(self.src, pos)}")
                pos = self.space(pos + 1, True)
                before = self.n_symbols
                sub = self.generate()
                self.depth += 1
                pos = self.alternates(pos, sub, True)
                self.depth -= 1
                n_prev_rules = max(1, self.n_symbols - before)
                last_sym_start = len(rule)
                rule.append(_el(RULE_REF, sub))
                if self.at(pos) != 41:
                    raise self.fail("expecting ')'", pos)
                pos = self.space(pos + 1, nested)
            elif c == 46:  # '.'
                last_sym_start, n_prev_rules = len(rule), 1
                rule.append(_el(CHAR_ANY))
                pos = self.space(pos + 1, nested)
            elif c in (42, 43, 63):  # '*' '+' '?'
                at = pos
                pos = self.space(pos + 1, nested)
                lo, hi = {42: (0, None), 43: (1, None), 63: (0, 1)}[c]
                n_prev_rules = self.repeat(rule, last_sym_start, n_prev_rules, lo, hi, at)
            elif c == 123:  # '{'
                at = pos
                pos = self.space(pos + 1, nested)
                if not 48 <= self.at(pos) <= 57:
                    raise self.fail("expecting an integer", pos)
                lo, end = self.integer(pos, (1 << 64) - 1, "the repetition count")
                pos = self.space(end, nested)
                hi: int | None = None
                if self.at(pos) == 125:  # '}'
                    hi = lo
                    pos = self.space(pos + 1, nested)
                elif self.at(pos) == 44:  # ','
                    pos = self.space(pos + 1, nested)
                    if 48 <= self.at(pos) <= 57:
                        hi, end = self.integer(pos, (1 << 64) - 1, "the repetition count")
                        pos = self.space(end, nested)
                    if self.at(pos) != 125:
                        raise self.fail("expecting '}'", pos)
                    pos = self.space(pos + 1, nested)
                else:
                    raise self.fail("expecting ','", pos)
                if lo > MAX_REPETITION:
                    raise self.fail(f"a repetition of at least {lo} (at most "
                                    f"{MAX_REPETITION})", at)
                if hi is not None and hi > MAX_REPETITION:
                    hi = None  # llama.cpp: no upper bound at all
                n_prev_rules = self.repeat(rule, last_sym_start, n_prev_rules, lo, hi, at)
            else:
                break
        return pos

    def repeat(self, rule: list[int | _Rep], last_sym_start: int, n_prev_rules: int,
               lo: int, hi: int | None, at: int) -> int:
        """llama.cpp's handle_repetitions; the new n_prev_rules."""
        if last_sym_start == len(rule):
            raise self.fail("a repetition with nothing before it", at)
        total = hi if hi is not None and hi > 0 else lo if lo > 0 else 1
        if n_prev_rules * total > MAX_REPETITION:
            raise self.fail(f"a repetition that makes {n_prev_rules * total} rules (a "
                            f"repeated item's rules times the count; at most "
                            f"{MAX_REPETITION})", at)
        if hi is not None and lo > hi:
            raise self.fail(f"a repetition {{{lo},{hi}}} with its minimum above its maximum",
                            at)
        chunk = tuple(rule[last_sym_start:])
        del rule[last_sym_start:]
        if lo > 0:
            rule.append(_Rep(chunk, lo, lo * _size(chunk)))
        count = 1 if hi is None else hi - lo
        if count > 0:
            first = self.generate(count)
            self.families.append(_Family(first, count, chunk, _size(chunk), hi is None))
            rule.append(_el(RULE_REF, first + count - 1))
        return n_prev_rules * total

    def validate(self, root: str) -> None:
        """llama.cpp's check: its rules are a vector up to the last defined id, so a name
        with an id below it and no rule is refused, and so is a reference, in the rules as
        they stand (a name defined twice keeps its last rule), to a name without one; a
        name only an overwritten rule used, with an id past every defined one, is not."""
        # only a name can lack a rule: a generated id (a group, a repetition's family) gets
        # its rule as it is made — so no id range is walked (a family may hold millions)
        size = max(max(self.rules, default=-1),
                   max((f.first + f.count - 1 for f in self.families), default=-1)) + 1
        chunks = [*self.rules.values(), *(f.chunk for f in self.families)]
        refs = {e >> 4 for items in chunks for e in _distinct(items) if e & 15 == RULE_REF}
        undefined = [i for i in self.symbols.values()
                     if i not in self.rules and (i < size or i in refs)]
        if undefined:
            first = min(undefined, key=lambda i: self.first_use[i])
            name = next(n for n, i in self.symbols.items() if i == first)
            raise self.fail(f"the rule {name[:_QUOTE_CHARS].decode()!r} is not defined",
                            self.first_use[first])
        if root.encode() not in self.symbols:
            raise GrammarRejected(f"the grammar has no {root!r} rule")

    def count_elements(self) -> int:
        total = sum(_size(r) for r in self.rules.values())
        for f in self.families:  # rule 1 of a bounded family has no ref
            total += f.count * (f.chunk_size + 3) - (0 if f.unbounded else 1)
        return total

    def expand(self) -> list[list[int]]:
        """The rules as llama.cpp holds them (call only once counted and small)."""
        rules: list[list[int]] = [[] for _ in range(self.n_symbols)]
        for rule_id, items in self.rules.items():
            rules[rule_id] = list(_flatten(items))
        for f in self.families:
            chunk = list(_flatten(f.chunk))
            for i in range(f.count):
                rule_id = f.first + i
                ref = [_el(RULE_REF, rule_id)] if f.unbounded else (
                    [_el(RULE_REF, rule_id - 1)] if i > 0 else [])
                rules[rule_id] = [*chunk, *ref, _el(ALT), _el(END)]
        return rules


def _flatten(items: tuple[int | _Rep, ...] | list[int | _Rep]) -> Iterator[int]:
    """The elements of ``items``, ``_Rep`` copies made (iteratively: chains of ``+`` nest)."""
    todo: list[Iterator[int | _Rep]] = [iter(items)]
    while todo:
        for item in todo[-1]:
            if isinstance(item, int):
                yield item
            else:
                todo.append(iter(item.chunk * item.times))
                break
        else:
            todo.pop()


def _distinct(items: tuple[int | _Rep, ...] | list[int | _Rep]) -> Iterator[int]:
    """The elements of ``items``, each ``_Rep``'s chunk read once (not its copies: what
    elements occur, at no cost of the repetition's size)."""
    todo: list[tuple[int | _Rep, ...] | list[int | _Rep]] = [items]
    while todo:
        for item in todo.pop():
            if isinstance(item, int):
                yield item
            else:
                todo.append(item.chunk)


def _where(src: bytes, pos: int) -> str:
    """line:column of byte ``pos`` and a quote of what follows, escaped (ASCII only)."""
    before = src[:pos].decode("utf-8", "replace")
    line = before.count("\n") + 1
    column = len(before) - (before.rfind("\n") + 1) + 1
    rest = src[pos:pos + 4 * _QUOTE_CHARS].decode("utf-8", "replace")
    if not rest:
        return f"line {line}, column {column} (the end of the grammar)"
    quote = ascii(rest[:_QUOTE_CHARS]) + ("..." if len(rest) > _QUOTE_CHARS else "")
    return f"line {line}, column {column}: {quote}"
