"""A GBNF grammar's cost, read before llama.cpp ever sees it (pure Python: no libllama).

llama.cpp (0.3.36, ``src/llama-grammar.cpp``) parses a grammar by expanding every bounded
repetition: ``S{m,n}`` becomes ``m`` inline copies of ``S`` and ``n - m`` nested optional rules,
each holding another copy of ``S`` — so 19 KB of ``"a"{0,2000}`` is millions of rules, and the
parse alone takes gigabytes and seconds.  Matching then keeps one *stack* per way the text so
far can be parsed: a grammar's per-token cost follows its ambiguity, not its length.

``gbnf_parse`` reads the same dialect with the same rules; this module measures the parse
(``detect_left_recursion`` has its counterpart below), without expanding anything it has not
first counted:

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

import attrs

from runtime.serve.gbnf_parse import (ALT, MAX_REPETITION, RULE_REF, TERMINALS,
                                      GrammarParser, GrammarRejected, GrammarTooCostly)

__all__ = ["DEFAULT_MAX_BRANCHING", "DEFAULT_MAX_ELEMENTS", "MAX_REPETITION", "SATURATED",
           "GrammarCost", "GrammarRejected", "GrammarTooCostly", "check", "measure"]

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

#: Where path counts saturate (a count this large is "unbounded").
SATURATED = 1 << 40

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
    parsed = GrammarParser(src)
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
                    elif kind in TERMINALS:
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
