"""The action layer: records, coordinate conventions, parsing, formatting, pyautogui code, and
the grammar driving real (forged, random-weight) llama.cpp models."""

from __future__ import annotations

import ast

import pytest

from cachepolicy.engine import Engine
from cachepolicy.engine.sampling import SamplingParams
from runtime.actions import (
    ACTION_GRAMMAR, MAX_ACTION_CHARS, ActionParseError, Click, CoordConvention, Done, DragTo,
    Fail, Hotkey, InvalidActionError, InvalidKeyError, MoveTo, NoOp, Press, Scroll, TypeText,
    Wait, action_grammar, format_action, from_screen, max_action_chars, normalize_key,
    parse_action, parse_action_detailed, parse_action_strict, to_pyautogui, to_screen,
)
from code_check import assert_pyautogui_calls_only
from runtime.actions.gbnf import int_upto
from vmenv.actions import CLAMP_MARGIN, Placed, place

S = (1280, 720)
ABS, R999, R1 = CoordConvention.ABSOLUTE, CoordConvention.RELATIVE_999, CoordConvention.RELATIVE_1


# ---------------------------------------------------------------- parsing each kind

@pytest.mark.parametrize(("text", "expected"), [
    ("click(512, 300)", Click(512, 300)),
    ("double_click(512, 300)", Click(512, 300, clicks=2)),
    ("right_click(5, 6)", Click(5, 6, button="right")),
    ("middle_click(5, 6)", Click(5, 6, button="middle")),
    ('click(x=5, y=6, button="right", clicks=2)', Click(5, 6, button="right", clicks=2)),
    ("move_to(10, 20)", MoveTo(10, 20)),
    ("drag(10, 20, 300, 400)", DragTo(10, 20, 300, 400)),
    ('type("hello world")', TypeText("hello world")),
    (r'type("say \"hi\"\n")', TypeText('say "hi"\n')),
    ('hotkey("ctrl", "c")', Hotkey(("ctrl", "c"))),
    ('hotkey("Control", "Shift", "T")', Hotkey(("ctrl", "shift", "t"))),
    ('press("enter")', Press("enter")),
    ('press("Esc")', Press("esc")),
    ("scroll(0, -5)", Scroll(0, -5)),
    ("scroll(3, 0, 100, 200)", Scroll(3, 0, 100, 200)),
    ("wait(2)", Wait(2.0)),
    ("wait()", Wait(1.0)),
    ("done()", Done()),
    ("fail()", Fail()),
    ("DONE", Done()),
    ("FAIL", Fail()),
    ("WAIT", Wait(1.0)),
])
def test_parses_each_action_kind(text: str, expected: object) -> None:
    assert parse_action(text, screen=S) == expected
    assert parse_action_strict(text, screen=S) == expected


@pytest.mark.parametrize("text", [
    "  click(512, 300)\n",
    "Action: click(512, 300)",
    "action:click(512, 300)",
    "```\nclick(512, 300)\n```",
    "```python\nclick(512, 300)\n```",
    "click(512, 300)<|im_end|>",
    "click(512, 300)</s>",
    "Thought: the OK button is at the centre.\nAction: click(512, 300)",
    "click(start_box='(512,300)')",
    "click(start_box='<|box_start|>(512,300)<|box_end|>')",
    "left_single(start_box='(500,290,524,310)')",
])
def test_tolerates_wrappers_and_ui_tars_forms(text: str) -> None:
    assert parse_action(text, screen=S) == Click(512, 300)


def test_ui_tars_drag_hotkey_type_scroll_finished() -> None:
    assert parse_action("drag(start_box='(1,2)', end_box='(3,4)')", screen=S) == DragTo(1, 2, 3, 4)
    assert parse_action("hotkey(key='ctrl c')", screen=S) == Hotkey(("ctrl", "c"))
    assert parse_action("type(content='abc\\n')", screen=S) == TypeText("abc\n")
    assert parse_action("scroll(start_box='(5,6)', direction='down')",
                        screen=S) == Scroll(0, -5, 5, 6)
    assert parse_action("scroll(direction='left')", screen=S) == Scroll(-5, 0)
    assert parse_action("finished(content='all good')", screen=S) == Done()


# ---------------------------------------------------------------- coordinate conventions

def test_relative_conventions_convert_and_clamp() -> None:
    assert parse_action("click(500, 500)", convention=R999, screen=S) == Click(640, 360)
    assert parse_action("click(0, 0)", convention=R999, screen=S) == Click(0, 0)
    assert parse_action("click(999, 999)", convention=R999, screen=S) == Click(1279, 719)
    assert parse_action("click(0.25, 0.5)", convention=R1, screen=S) == Click(320, 360)
    assert parse_action("click(1.0, 1)", convention=R1, screen=S) == Click(1279, 719)
    # off-screen coordinates are clamped onto the screen, and the parser says so
    assert parse_action("click(5000, 9999)", screen=S) == Click(1279, 719)
    assert parse_action("move_to(-3, 10)", screen=S) == MoveTo(0, 10)
    assert to_screen(640, 360, ABS, (640, 360)) == (639, 359)
    detailed = parse_action_detailed("move_to(-3, 10)", screen=S)
    assert detailed.action == MoveTo(0, 10) and "clamped to (0, 10)" in detailed.notes[0]
    assert parse_action_detailed("move_to(3, 10)", screen=S).notes == ()


def test_a_margin_rejects_points_far_off_the_screen() -> None:
    """With a margin (the profiles' choice) a point beyond it is an error, not the edge."""
    m = int(CLAMP_MARGIN * 1280)
    assert place(1279 + m, 5, ABS, S, margin=CLAMP_MARGIN) == Placed(1279, 5, clamped=True)
    assert place(-m, 5, ABS, S, margin=CLAMP_MARGIN) == Placed(0, 5, clamped=True)
    assert place(700, 5, ABS, S, margin=CLAMP_MARGIN) == Placed(700, 5, clamped=False)
    for x in (1280 + m, -m - 1):
        with pytest.raises(InvalidActionError, match="outside the screen"):
            place(x, 5, ABS, S, margin=CLAMP_MARGIN)
    with pytest.raises(InvalidActionError):
        place(500, 1200, R999, S, margin=CLAMP_MARGIN)
    # absolute pixels of a resized image the model saw are scaled to the screen
    assert place(966, 546, ABS, (1920, 1080), image=(1932, 1092)) == Placed(960, 540, False)
    assert from_screen(960, 540, ABS, (1920, 1080), image=(1932, 1092)) == (966, 546)


@pytest.mark.parametrize("convention", [R999, R1])
def test_from_screen_round_trips_within_a_grid_cell(convention: CoordConvention) -> None:
    for x, y in [(0, 0), (1, 719), (640, 360), (1279, 719), (333, 77)]:
        u, v = from_screen(x, y, convention, S)
        bx, by = to_screen(u, v, convention, S)
        assert abs(bx - x) <= 2 and abs(by - y) <= 1


def test_bad_screen_is_the_callers_error() -> None:
    with pytest.raises(InvalidActionError):
        parse_action("click(1, 2)", screen=(0, 720))


# ---------------------------------------------------------------- unparsable → NoOp

@pytest.mark.parametrize(("text", "reason"), [
    ("", "empty"),
    ("   \n ", "empty"),
    ("I would click the OK button", "not an action call"),
    ("click(1)", "missing argument"),
    ("click(1, 2, 3)", "unexpected arguments"),
    ("click(1, 2, colour='red')", "unexpected arguments"),
    ("click(x, 2)", "literals"),
    ("click(1e999, 2)", "finite"),
    ("click(True, 2)", "number"),
    ("click(1, 2, clicks=4)", "clicks"),
    ("click(1, 2, button='back')", "button"),
    ('press("foo")', "unknown key"),
    ('hotkey("ctrl", "hyper")', "unknown key"),
    ("hotkey()", "1..4 keys"),
    ("type(123)", "string"),
    ('type("")', "text length"),
    ("wait(-1)", "wait"),
    ("scroll(1.5, 0)", "whole number"),
    ("scroll(direction='sideways')", "direction"),
    ("explode(1, 2)", "unknown action"),
    ("os.system('rm -rf /')", "not an action call"),
    ("__import__('os').system('x')", "not an action call"),
    ("click(1, 2); import os", "not an action call"),
    ("click(1, 2)\nclick(3, 4)", "one line"),
    ("click(**{'x': 1, 'y': 2})", "kwargs"),
    ("click(" * 300, "not an action call"),
    ("x" * 9000, "exceeds"),
])
def test_unparsable_output_is_a_noop_with_a_reason(text: str, reason: str) -> None:
    action = parse_action(text, screen=S)
    assert isinstance(action, NoOp)
    assert reason in action.reason
    assert action.raw == text


def test_strict_parser_raises_typed_errors() -> None:
    with pytest.raises(InvalidKeyError):
        parse_action_strict('press("foo")', screen=S)
    with pytest.raises(ActionParseError):
        parse_action_strict("hello", screen=S)
    with pytest.raises(InvalidActionError):
        parse_action_strict("click(1, 2, clicks=5)", screen=S)


def test_records_validate_their_fields() -> None:
    with pytest.raises(InvalidActionError):
        Click(-1, 0)
    with pytest.raises(InvalidActionError):
        Click(1, 2, clicks=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        Hotkey(("ctrl", "nope"))
    with pytest.raises(InvalidActionError):
        Scroll(0, 1, x=5)
    with pytest.raises(InvalidActionError):
        Wait(float("nan"))
    assert normalize_key("PageDown") == "pagedown" and normalize_key("super") == "win"
    assert normalize_key("\n") == "\n"
    assert "raw=" in repr(NoOp("r", "z" * 500)) and len(repr(NoOp("r", "z" * 500))) < 120


# ---------------------------------------------------------------- formatting

ALL_ACTIONS = [
    Click(512, 300), Click(1, 2, clicks=2), Click(3, 4, button="right"),
    Click(3, 4, button="middle"), Click(3, 4, button="right", clicks=2), MoveTo(7, 8),
    DragTo(1, 2, 3, 4), TypeText('quote " back \\ nl \n tab \t ünï'), Hotkey(("ctrl", "c")),
    Hotkey(("ctrl", "shift", "'")), Press("enter"), Press('"'), Scroll(0, -5),
    Scroll(2, 3, 10, 20), Wait(2.0), Wait(0.5), Done(), Fail(),
]


@pytest.mark.parametrize("action", ALL_ACTIONS, ids=repr)
def test_format_then_parse_is_identity(action: object) -> None:
    assert parse_action(format_action(action), screen=S) == action  # type: ignore[arg-type]


def test_format_in_relative_conventions() -> None:
    assert format_action(Click(640, 360), convention=R999, screen=S) == "click(500, 500)"
    assert format_action(DragTo(0, 0, 1280, 720), convention=R1, screen=S) == "drag(0, 0, 1, 1)"
    assert parse_action(format_action(MoveTo(320, 180), convention=R999, screen=S),
                        convention=R999, screen=S) == MoveTo(320, 180)
    with pytest.raises(InvalidActionError):
        format_action(Click(1, 1), convention=R1)
    assert format_action(NoOp("x", "y")) == "noop()"


# ---------------------------------------------------------------- pyautogui code

INJECTIONS = [
    '"); import os; os.system("x',
    "'); import os; os.system('x",
    'a"b\'c\\d\ne\r\tf',
    '\\"); __import__("os").system("x"); ("',
    '"""\nimport os\n"""',
    "\x00\x1b[31m",
    "ünïcødé 字 🙂",
]


@pytest.mark.parametrize("text", INJECTIONS)
def test_typed_text_cannot_inject_code(text: str) -> None:
    code = to_pyautogui(TypeText(text))
    [call] = assert_pyautogui_calls_only(code)
    assert isinstance(call.func, ast.Attribute) and call.func.attr == "typewrite"
    assert ast.literal_eval(call.args[0]) == text  # the text arrives verbatim, as data


@pytest.mark.parametrize("text", INJECTIONS)
def test_injection_through_the_parser_stays_data(text: str) -> None:
    """The same payloads as model output: parsed into TypeText or NoOp, never into code."""
    for raw in (f"type({text!r})", f'type("{text}")', text):
        action = parse_action(raw, screen=S)
        code = to_pyautogui(action)
        if code != "WAIT":
            assert_pyautogui_calls_only(code)


@pytest.mark.parametrize("action", ALL_ACTIONS, ids=repr)
def test_every_action_maps_to_pyautogui_calls_or_a_special(action: object) -> None:
    code = to_pyautogui(action)  # type: ignore[arg-type]
    if code in {"WAIT", "DONE", "FAIL"}:
        return
    assert assert_pyautogui_calls_only(code)


def test_pyautogui_code_and_specials() -> None:
    assert to_pyautogui(Click(512, 300)) == "pyautogui.click(x=512, y=300, clicks=1, button='left')"
    assert to_pyautogui(Hotkey(("ctrl", "c"))) == "pyautogui.hotkey('ctrl', 'c')"
    assert to_pyautogui(Press("enter")) == "pyautogui.press('enter')"
    assert to_pyautogui(Scroll(0, -5)) == "pyautogui.scroll(-5)"
    assert to_pyautogui(Scroll(2, 0, 5, 6)) == "pyautogui.hscroll(2, x=5, y=6)"
    assert to_pyautogui(DragTo(1, 2, 3, 4)).splitlines()[0] == "pyautogui.moveTo(1, 2)"
    assert to_pyautogui(Done()) == "DONE"
    assert to_pyautogui(Fail()) == "FAIL"
    assert to_pyautogui(Wait(3.0)) == "WAIT"
    assert to_pyautogui(NoOp("garbage", "x")) == "WAIT"


# ---------------------------------------------------------------- grammar

WORST_CASES = [  # the longest sentence of each production (absolute coordinates)
    "double_click(9999, 9999)", "drag(9999, 9999, 9999, 9999)",
    'type("' + "x" * 24 + '")', 'type("' + '\\"' * 16 + '")',
    'hotkey("shift", "shift", "printscreen")', 'press("printscreen")', "scroll(-99, -99)",
]


@pytest.mark.parametrize("text", WORST_CASES)
def test_longest_sentences_fit_the_budget_and_parse(text: str) -> None:
    assert len(text) <= max_action_chars(ABS) <= MAX_ACTION_CHARS
    assert not isinstance(parse_action(text, screen=(10_000, 10_000)), NoOp)


def test_grammar_text_and_bounds() -> None:
    assert ACTION_GRAMMAR == action_grammar(ABS)
    assert ACTION_GRAMMAR.startswith("root ::= ")
    for convention in CoordConvention:
        assert max_action_chars(convention) <= MAX_ACTION_CHARS
    assert f"num ::= {int_upto(999).body}" in action_grammar(R999)
    assert '"1" ("." "0"{1,3})?' in action_grammar(R1)


PROMPT = ("<|im_start|>system\nYou control a desktop. Answer with one action.<|im_end|>\n"
          "<|im_start|>user\nOpen the terminal.<|im_end|>\n<|im_start|>assistant\n")
SEQ = 2  # the conftest engines hold 3 sequences; 2 keeps away from other tests


def _generate(e: Engine, grammar: str, seed: int) -> str:
    """Sample one grammar-constrained action; assert it completed (ended on end-of-generation)."""
    e.clear(SEQ)
    try:
        logits = e.prefill_tokens(SEQ, e.tokenize(PROMPT))
        assert logits is not None
        out = e.generate(SEQ, logits, MAX_ACTION_CHARS + 1,
                         SamplingParams(temperature=1.0, seed=seed, grammar=grammar))
    finally:
        e.clear(SEQ)
    # the grammar's longest sentence plus end-of-generation fits the budget, so every
    # generation finishes by itself instead of being cut at max_tokens
    assert e.is_end_of_generation(out[-1]), (seed, e.detokenize(out))
    return e.detokenize(out[:-1])


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_grammar_constrained_output_always_parses(engines, arch: str) -> None:
    """Random weights, temperature 1: every grammar-constrained output is a real action."""
    e = engines(arch)
    kinds = set()
    for seed in range(20):
        text = _generate(e, ACTION_GRAMMAR, seed)
        action = parse_action(text, screen=(10_000, 10_000))
        assert not isinstance(action, NoOp), (seed, text, action)
        assert len(text) <= MAX_ACTION_CHARS
        kinds.add(action.kind)
    assert len(kinds) >= 3, kinds  # the grammar really offers a choice of actions


@pytest.mark.parametrize("convention", [R999, R1])
def test_relative_grammars_also_always_parse(engines, convention: CoordConvention) -> None:
    e = engines("qwen35")
    for seed in range(8):
        text = _generate(e, action_grammar(convention), seed)
        action = parse_action(text, convention=convention, screen=S)
        assert not isinstance(action, NoOp), (seed, text, action)


def test_less_than_is_typed_through_shift_comma() -> None:
    """pyautogui types '<' as '>' on OSWorld's VMs; the generated code avoids typewrite('<')."""
    import ast

    from runtime.actions import TypeText, to_pyautogui

    code = to_pyautogui(TypeText("a<b<<"))
    assert "<" not in code
    calls = [ast.unparse(stmt.value.func) for stmt in ast.parse(code).body]
    assert calls == ["pyautogui.typewrite", "pyautogui.hotkey", "pyautogui.typewrite",
                     "pyautogui.hotkey", "pyautogui.hotkey"]
    assert code.count("hotkey('shift', ',')") == 3
