"""Fuzzing every action parser with hypothesis: arbitrary text, text built from the grammars'
own pieces plus adversarial ones, and grammar sentences with random edits.

Contracts checked: the strict parsers raise nothing but ``ActionError`` (its subclasses
``ActionParseError`` / ``InvalidActionError``); the lenient ones never raise and never hit
their last-resort "parser error" branch; the pyautogui code of any parsed action is only
``pyautogui.<function>(<literals>)`` calls, or one of WAIT / DONE / FAIL (checked with
``ast``); and every sentence of a profile's grammar parses, within the declared bound.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from code_check import assert_safe_code
from gbnf_regex import grammar_regex
from runtime.actions import (
    Action, ActionError, CoordConvention, NoOp, action_grammar, parse_action,
    parse_action_strict, to_pyautogui,
)
from runtime.profiles import get, names

S = (1280, 720)
POINTER = (640, 360)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))

Strict = Callable[[str], Action]
STRICT: dict[str, Strict] = {
    **{f"parse_action-{c.value}": (lambda c: lambda t: parse_action_strict(
        t, convention=c, screen=S))(c) for c in CoordConvention},
    **{f"profile-{n}": (lambda n: lambda t: get(n).parse_strict(
        t, S, pointer=POINTER).action)(n) for n in names()},
    **{f"profile-{n}-no-pointer": (lambda n: lambda t: get(n).parse_strict(t, S).action)(n)
       for n in names()},
}
LENIENT: dict[str, Strict] = {
    **{f"parse_action-{c.value}": (lambda c: lambda t: parse_action(
        t, convention=c, screen=S))(c) for c in CoordConvention},
    **{f"profile-{n}": (lambda n: lambda t: get(n).parse(t, S, pointer=POINTER).action)(n)
       for n in names()},
}
GRAMMARS = {**{f"profile-{n}": get(n).grammar(S) for n in names()},
            **{f"kvagent-{c.value}": action_grammar(c) for c in CoordConvention}}

_LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
ADVERSARIAL = [
    "9" * 309, "1" + "0" * 400, "1" + "0" * 308, "-" + "9" * 309, "1e999", "-1e999", "1e308",
    "nan", "NaN", "inf", "Infinity", "-0", "0x10", "1_000", "1j", "True", "None", "...", "[" * 60, "(" * 60,
    "{" * 60, "]" * 10, "'", '"', "\\", "\\'", '\\"', "\\n", "\n", "\n\n", "\t", " " * 40,
    "\x00", "\x1b", "é", "字", "🙂", "\ud7ff", "Action:", "Thought:", "action:", "<tool_call>",
    "</tool_call>", "<|box_start|>", "<|box_end|>", "<point>", "</point>", "<|im_end|>",
    "```", "```python\n", "**{}", "*", "lambda: 0", "__import__('os')", "os.system('x')",
    ", ", ",", ":", "=", "start_box=", "coordinate", '"action": ', '"keys": [', "x=", "y=",
    "button='right'", "clicks=3", "direction='down'", "content='", "key='", "DONE", "WAIT",
]


def _grammar_pieces() -> list[str]:
    """Every literal of every grammar, unescaped: the vocabulary of near misses."""
    pieces = set()
    for g in GRAMMARS.values():
        for m in _LITERAL.finditer(g):
            pieces.add(re.sub(r"\\(.)", lambda e: {"n": "\n"}.get(e.group(1), e.group(1)),
                              m.group(1)))
    return sorted(pieces)


PIECES = _grammar_pieces() + ADVERSARIAL
near_miss = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3),
                               st.integers(-10**6, 10**6).map(str)),
                     max_size=24).map("".join)


def _sentences(name: str) -> st.SearchStrategy[str]:
    return st.from_regex(re.compile(grammar_regex(GRAMMARS[name]), re.DOTALL), fullmatch=True)


@st.composite
def edited_sentence(draw: st.DrawFn) -> str:
    """A grammar sentence with a few spans replaced by pieces, random text or nothing."""
    text = draw(st.one_of(*(_sentences(n) for n in GRAMMARS)))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 6)))
        text = text[:i] + draw(st.one_of(st.sampled_from(PIECES), st.text(max_size=4))) + text[j:]
    return text


def _check_strict(parse: Strict, text: str) -> None:
    try:
        action = parse(text)
    except ActionError:
        return
    assert_safe_code(to_pyautogui(action))


def _check_lenient(parse: Strict, text: str) -> None:
    action = parse(text)
    if isinstance(action, NoOp):
        assert action.raw == text
        assert not action.reason.startswith("parser error"), action.reason
    assert_safe_code(to_pyautogui(action))


@pytest.mark.parametrize("name", sorted(STRICT))
@FUZZ
@given(text=st.one_of(st.text(max_size=200), near_miss, edited_sentence()))
def test_strict_parsers_raise_only_action_errors(name: str, text: str) -> None:
    _check_strict(STRICT[name], text)


@pytest.mark.parametrize("name", sorted(LENIENT))
@FUZZ
@given(text=st.one_of(st.text(max_size=200), near_miss, edited_sentence()))
def test_lenient_parsers_never_raise(name: str, text: str) -> None:
    _check_lenient(LENIENT[name], text)


@pytest.mark.parametrize("name", names())
@FUZZ
@given(data=st.data())
def test_every_grammar_sentence_parses(name: str, data: st.DataObject) -> None:
    profile = get(name)
    text = data.draw(_sentences(f"profile-{name}"))
    assert len(text) <= profile.max_output_chars(S)
    parsed = profile.parse(text, S, pointer=POINTER)
    assert parsed.ok, (text, parsed)
    assert_safe_code(to_pyautogui(parsed.action))


@pytest.mark.parametrize("convention", list(CoordConvention))
@FUZZ
@given(data=st.data())
def test_every_action_language_sentence_parses(convention: CoordConvention,
                                               data: st.DataObject) -> None:
    text = data.draw(_sentences(f"kvagent-{convention.value}"))
    assert not isinstance(parse_action(text, convention=convention, screen=S), NoOp), text


# ---------------------------------------------------------------- what the fuzzer found

HUGE = "9" * 309  # 309 digits, past the largest float (1.8e308): float() of it overflows


@pytest.mark.parametrize("text", [
    f"click({HUGE}, 5)", f"scroll({HUGE}, 0)", f"wait({HUGE})", f"click(-{HUGE}, 5)",
    f"click(start_box='({HUGE},5)')", f"click(x={HUGE}, y=1)",
])
def test_huge_integer_coordinates_are_a_noop_not_an_overflow(text: str) -> None:
    action = parse_action(text, screen=S)
    assert isinstance(action, NoOp) and not action.reason.startswith("parser error"), action
    with pytest.raises(ActionError):
        parse_action_strict(text, screen=S)


def test_huge_numbers_in_profile_formats() -> None:
    qwen = ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
            f'"coordinate": [{HUGE}, 5]}}}}\n</tool_call>')
    deep = "<tool_call>\n" + "[" * 5000 + "\n</tool_call>"
    long_int = ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "wait", '
                f'"time": {"9" * 5000}}}}}\n</tool_call>')
    for text in (qwen, deep, long_int):
        action = get("qwen3vl").parse(text, S).action
        assert isinstance(action, NoOp) and not action.reason.startswith("parser error")
    tars = f"Thought: t\nAction: click(start_box='({HUGE},5)')"
    assert isinstance(get("uitars").parse(tars, S).action, NoOp)


def test_a_coordinate_that_overflows_when_scaled_is_an_action_error() -> None:
    """1e308 is finite, but a relative coordinate times the screen's width is not (found by
    the fuzz above: an OverflowError escaped the strict parser)."""
    from runtime.actions import CoordConvention
    from runtime.actions.parser import parse_action_strict
    from vmenv.actions.errors import InvalidActionError

    with pytest.raises(InvalidActionError, match="too large"):
        parse_action_strict("right_click(1e308, 5)", convention=CoordConvention.RELATIVE_1,
                            screen=(1280, 720))
    # where it stays finite it is clamped to the screen's edge, as any far point is
    edge = parse_action_strict("right_click(1e308, 5)", convention=CoordConvention.ABSOLUTE,
                               screen=(1280, 720))
    assert (edge.x, edge.y) == (1279, 5)
