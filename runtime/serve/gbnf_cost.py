"""A GBNF grammar's cost, read before llama.cpp ever sees it (pure Python: no libllama).

llama.cpp (0.3.36, ``src/llama-grammar.cpp``) parses a grammar by expanding every bounded
repetition: ``S{m,n}`` becomes ``m`` inline copies of ``S`` and ``n - m`` nested optional rules,
each holding another copy of ``S`` — so 19 KB of ``"a"{0,2000}`` is millions of rules, and the
parse alone takes gigabytes and seconds.  Matching then keeps one *stack* per way the text so
far can be parsed: a grammar's per-token cost follows its ambiguity, not its length.

This module reads the same dialect with the same rules (every branch of ``parse_sequence``,
``handle_repetitions`` and ``detect_left_recursion`` has its counterpart below, in the same
order) and measures, without expanding anything it has not first counted:

* ``elements`` / ``rules`` — exactly what llama.cpp's parser allocates (arithmetic over the
  parse: a repetition's copies are counted, not made);
* ``branching`` — an upper bound on the stacks one advance of llama.cpp's matcher
  (``llama_grammar_advance_stack``) makes from one stack.

What llama.cpp would refuse, this refuses (``GrammarRejected``, message safe to show and log:
what, where, and at most ~40 characters of the source, escaped).  It also refuses three
grammars llama.cpp accepts and then never finishes with: ``{m,n}`` with ``m > n`` (llama.cpp
loops making rules until memory runs out), left recursion hidden behind a rule that matches
the empty string without having an empty alternative (llama.cpp's check misses it and the
matcher's stack grows until the process aborts), and groups nested deeper than
``MAX_NESTING`` (the reader recurses per group).  Token references by text (``<name>``)
are refused as llama.cpp refuses them without a vocabulary (the server's check); by id
(``<[42]>``) they are read.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

#: llama.cpp's MAX_REPETITION_THRESHOLD: ``{m,n}`` with m above it is refused, n above it
#: becomes unbounded (``{m,}``), and a repetition of a repetition may not multiply past it.
MAX_REPETITION = 2000

#: Elements (the 8-byte ``llama_grammar_element``, rules' ENDs included) a client grammar may
#: expand to (``Limits.max_grammar_elements``).  Measured on llama.cpp 0.3.36
#: (``llama_sampler_init_grammar(None, text, "root")`` in a fresh process, peak RSS and CPU
#: time of the call, 2-core machine): one rule of 1M elements (``"a"×500{2000}``) +24 MB,
#: 0.03 s — ~24 bytes an element; 100K rules of 4 elements (``"a"{0,2000}`` × 50) +23 MB,
#: 0.05 s — ~230 bytes a rule with its elements.  A rule holds at least 2 elements, so the
#: worst grammar accepted here (25K rules) costs llama.cpp < 10 MB and < 0.02 s; what bounds
#: the limit is this reader's own expansion and analysis, ~8 µs an element in CPython
#: (< 0.5 s).  JSON schemas' grammars: a ``maxLength`` / ``maxItems`` of 2000 is ~8K.
DEFAULT_MAX_ELEMENTS = 50_000

#: Stacks one advance of the matcher may make from one stack (see ``_Branching``).  JSON
#: (``json_object``) is ~10, a schema's object of 64 optional properties ~70, the shipped
#: agents' action grammars are under 40; the reported attack (1600 × ``"a"{0,2000}``) is 1601.
DEFAULT_MAX_BRANCHING = 256

#: Groups nested in groups: deeper is refused (the reader recurses once per group).
MAX_NESTING = 200

#: Where path counts saturate (a count this large is "unbounded").
SATURATED = 1 << 40

# llama.cpp's ``llama_gretype`` (llama.h), in its order
END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY, TOKEN, TOKEN_NOT = range(10)
_TERMINALS = frozenset({CHAR, CHAR_NOT, CHAR_ANY, TOKEN, TOKEN_NOT})
_QUOTE_CHARS = 40


class GrammarRejected(ValueError):
    """The grammar does not parse as llama.cpp's GBNF, or is refused; the message is safe to
    show and log (no raw newline, control or escape character; at most ~40 characters of the
    source)."""

    code = "invalid_grammar"


class GrammarTooCostly(GrammarRejected):
    """The grammar parses but would cost llama.cpp too much to expand or to match."""

    code = "grammar_too_costly"


@attrs.frozen
class GrammarCost:
    """What a grammar costs llama.cpp: ``rules`` and ``elements`` its parser allocates,
    ``branching`` the most stacks one advance of its matcher makes from one stack (an upper
    bound, ``SATURATED`` when unbounded)."""

    rules: int
    elements: int
    branching: int


def check(text: str, *, max_elements: int = DEFAULT_MAX_ELEMENTS,
          max_branching: int = DEFAULT_MAX_BRANCHING, root: str = "root") -> GrammarCost:
    """``measure`` and refuse (``GrammarTooCostly``) a grammar over either limit."""
    cost = measure(text, max_elements=max_elements, root=root)
    if cost.branching > max_branching:
        shown = "unbounded" if cost.branching >= SATURATED else str(cost.branching)
        raise GrammarTooCostly(
            f"the grammar is too ambiguous: one step of the matcher can follow {shown} "
            f"parses at once; the limit is {max_branching} (many optional or repeated items "
            "in a row that can each match the same text)")
    return cost


def measure(text: str, *, max_elements: int = DEFAULT_MAX_ELEMENTS,
            root: str = "root") -> GrammarCost:
    """The cost of ``text`` (``GrammarRejected`` if llama.cpp would refuse it, or it is one of
    the grammars it accepts but cannot finish with; ``GrammarTooCostly`` if it expands to
    more than ``max_elements`` — then nothing is expanded and ``branching`` is not read)."""
    if "\x00" in text:
        raise GrammarRejected("the grammar contains a NUL character")
    try:
        src = text.encode("utf-8")
    except UnicodeEncodeError:
        raise GrammarRejected("the grammar is not valid Unicode text (a lone surrogate)") \
            from None
    parsed = _Parser(src)
    parsed.parse()
    parsed.validate(root)
    n_rules = parsed.n_symbols
    elements = parsed.count_elements()
    if elements > max_elements:
        raise GrammarTooCostly(
            f"the grammar expands to {elements} elements in {n_rules} rules (llama.cpp "
            f"copies S for each repetition S{{m,n}}); the limit is {max_elements}")
    rules = parsed.expand()
    assert sum(len(r) for r in rules) == elements and len(rules) == n_rules
    analysis = _Analysis(rules)
    why = analysis.left_recursion()
    if why is not None:
        raise GrammarRejected(why)
    branching = analysis.branching(parsed.symbols[root.encode()])
    return GrammarCost(rules=n_rules, elements=elements, branching=branching)


# -- the reader ---------------------------------------------------------------------------

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


class _Parser:
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
        undefined = [i for i in self.symbols.values() if i not in self.rules]
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


# -- what llama.cpp checks after parsing, and the matcher's branching -----------------------

class _Analysis:
    """The expanded rules' left recursion (llama.cpp's check, and the one it misses) and
    branching, each in one pass over the elements."""

    def __init__(self, rules: list[list[int]]) -> None:
        self.rules = rules
        # (start, end) of each alternative: elements rule[start:end], rule[end] its ALT/END
        self.alts: list[list[tuple[int, int]]] = []
        for rule in rules:
            ends = [i for i, el in enumerate(rule) if el & 15 <= ALT]
            self.alts.append(list(zip([0] + [i + 1 for i in ends[:-1]], ends)))
        # llama.cpp's rules_may_be_empty: an empty alternative
        self.empty = [any(a == b for a, b in alts) for alts in self.alts]
        self.nullable = self._nullable()

    def _nullable(self) -> list[bool]:
        """Rules that can match the empty string: an alternative of only such rules (a
        worklist: each alternative counts its references not yet known nullable)."""
        rules = self.rules
        can = [False] * len(rules)
        missing: dict[tuple[int, int], int] = {}
        watchers: list[list[tuple[int, int]]] = [[] for _ in rules]
        todo: list[int] = []
        for r, rule in enumerate(rules):
            for k, (a, b) in enumerate(self.alts[r]):
                body = rule[a:b]
                if any(el & 15 != RULE_REF for el in body):
                    continue
                missing[(r, k)] = len(body)
                for el in body:
                    watchers[el >> 4].append((r, k))
                if not body and not can[r]:
                    can[r] = True
                    todo.append(r)
        while todo:
            for key in watchers[todo.pop()]:
                missing[key] -= 1
                if missing[key] == 0 and not can[key[0]]:
                    can[key[0]] = True
                    todo.append(key[0])
        return can

    def left_edges(self, passes_over: list[bool]) -> list[list[int]]:
        """r -> the rules r can start with: references at an alternative's start, and after
        references to rules in ``passes_over`` (llama.cpp's detect_left_recursion walk)."""
        edges: list[list[int]] = []
        for r, rule in enumerate(self.rules):
            out: list[int] = []
            for a, b in self.alts[r]:
                for el in rule[a:b]:
                    if el & 15 != RULE_REF:
                        break
                    out.append(el >> 4)
                    if not passes_over[el >> 4]:
                        break
            edges.append(out)
        return edges

    def left_recursion(self) -> str | None:
        """Why the grammar is left-recursive, or None.  llama.cpp's check passes over rules
        with an empty alternative (a cycle there: it refuses); a cycle passing over rules
        that can match nothing without one, it misses (and its matcher never finishes)."""
        if _postorder(self.left_edges(self.empty)) is None:
            return "the grammar is left-recursive (a rule can start with itself)"
        order = _postorder(self.left_edges(self.nullable))
        if order is None:
            return ("the grammar is left-recursive through a rule that can match the empty "
                    "string (llama.cpp would not finish matching it)")
        self.order = order
        return None

    def branching(self, root: int) -> int:
        """An upper bound on the stacks ``llama_grammar_advance_stack`` makes from one stack.

        From a stack whose top is position p of rule r, the advance follows every ε-path: a
        rule reference branches into the referenced rule's alternatives (p+1 pushed below,
        unless p+1 ends the alternative: a tail call); an empty alternative, or the end of
        one, pops to what lies below.  Each path ends at a terminal (one stack) or empties
        the stack (one more).  Counted with multiplicity, saturating at ``SATURATED``:

        * ``T[s]``, ``E[s]``: paths from s's start to a terminal inside s, and out of s (in
          ``self.order``: the rules a rule's nullable prefix names come first — acyclic, left
          recursion being refused);
        * ``t(p)``, ``e(p)``: the same from position p (right to left: a reference to s gives
          ``T[s] + E[s]·t(p+1)``, ``E[s]·e(p+1)``; a terminal 1, 0; an alternative's end 0, 1);
        * ``up(r)``: the most stacks leaving r's frame makes — over r's call sites (p in q
          referencing r: ``t(p+1) + e(p+1)·up(q)``), 1 for the root (the empty stack);
          recursion through call sites with a gain saturates;
        * the bound: the largest ``t(p) + e(p)·up(r)`` over positions of rules the root
          reaches, and the start's stacks (``T[root] + E[root]``).
        """
        rules = self.rules
        n = len(rules)
        T = [0] * n
        E = [0] * n
        for s in self.order:
            rule = rules[s]
            t_sum = e_sum = 0
            for a, b in self.alts[s]:
                t, m = 0, 1
                for i in range(a, b):
                    el = rule[i]
                    if el & 15 == RULE_REF:
                        x = el >> 4
                        t, m = _sat(t + m * T[x]), _sat(m * E[x])
                        if m == 0:
                            break
                    else:  # a terminal (a character class's first element)
                        t, m = _sat(t + m), 0
                        break
                t_sum, e_sum = _sat(t_sum + t), _sat(e_sum + m)
            T[s], E[s] = t_sum, e_sum
        reach = [False] * n
        reach[root] = True
        todo = [root]
        while todo:
            for el in rules[todo.pop()]:
                if el & 15 == RULE_REF and not reach[el >> 4]:
                    reach[el >> 4] = True
                    todo.append(el >> 4)
        # at each reference: (t, e) of the position after it; each rule's best t(p), e(p)
        base = [0] * n
        base[root] = 1
        passes: list[list[tuple[int, int, int]]] = [[] for _ in range(n)]
        best_plain = 1  # positions whose paths all stay in the frame (e = 0)
        frame: list[list[tuple[int, int]]] = [[] for _ in range(n)]  # (t, e) with e > 0
        for r in range(n):
            if not reach[r]:
                continue
            rule = rules[r]
            for a, b in self.alts[r]:
                nt, ne = 0, 1  # the alternative's end: leave the frame
                frame[r].append((nt, ne))
                for i in range(b - 1, a - 1, -1):
                    el = rule[i]
                    kind = el & 15
                    if kind == RULE_REF:
                        s = el >> 4
                        if ne or nt:
                            if ne == 0:
                                base[s] = max(base[s], nt)
                            else:
                                passes[r].append((s, nt, ne))
                        nt, ne = _sat(T[s] + E[s] * nt), _sat(E[s] * ne)
                        if ne:
                            frame[r].append((nt, ne))
                        else:
                            best_plain = max(best_plain, nt)
                    elif kind in _TERMINALS:
                        nt, ne = 1, 0
        up = [0] * n
        for comp in _sccs(n, [[s for s, _, _ in out] for out in passes]):
            members = set(comp)
            value = max(base[c] for c in comp)
            gain = any(t > 0 or e > 1 for c in comp for s, t, e in passes[c] if s in members)
            if gain and value > 0:
                value = SATURATED
            for c in comp:
                up[c] = value
                for s, t, e in passes[c]:
                    if s not in members:
                        base[s] = max(base[s], _sat(t + e * value))
        # the start: llama.cpp advances each of the root's alternatives into one stack set
        best = max(best_plain, _sat(T[root] + E[root]))
        for r in range(n):
            for t, e in frame[r]:
                best = max(best, _sat(t + e * up[r]))
        return best


def _postorder(edges: list[list[int]]) -> list[int] | None:
    """The nodes, each after every node it leads to; None if there is a cycle (an iterative
    depth-first search: 0 new, 1 on the path, 2 done)."""
    state = [0] * len(edges)
    order: list[int] = []
    for start in range(len(edges)):
        if state[start]:
            continue
        state[start] = 1
        path = [(start, iter(edges[start]))]
        while path:
            node, it = path[-1]
            for nxt in it:
                if state[nxt] == 1:
                    return None
                if state[nxt] == 0:
                    state[nxt] = 1
                    path.append((nxt, iter(edges[nxt])))
                    break
            else:
                state[node] = 2
                order.append(node)
                path.pop()
    return order


def _sat(x: int) -> int:
    return x if x < SATURATED else SATURATED


def _sccs(n: int, edges: list[list[int]]) -> list[list[int]]:
    """Strongly connected components, callers before callees (Tarjan's, iterative; Tarjan's
    yields them callees first, so reversed)."""
    index = [-1] * n
    low = [0] * n
    on = [False] * n
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for v0 in range(n):
        if index[v0] != -1:
            continue
        work = [(v0, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on[v] = True
            recurse = False
            for j in range(i, len(edges[v])):
                w = edges[v][j]
                if index[w] == -1:
                    work.append((v, j + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if on[w]:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on[w] = False
                    comp.append(w)
                    if w == v:
                        break
                out.append(comp)
            if work:
                u = work[-1][0]
                low[u] = min(low[u], low[v])
        # (the parent's low is updated when its frame resumes, just above)
    out.reverse()
    return out
