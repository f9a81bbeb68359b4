"""Agent profiles: each parser on reference outputs written from its model's format (several
per action type, and malformed ones), round trips, history text, layouts and the registry.

Expected pixels are worked out by hand from the conventions: Qwen3-VL's grid value v on an
axis of n pixels is v / 1000 * n (1920 x 1080: x = 1.92 v, y = 1.08 v); UI-TARS 1.5 writes
pixels of the smart-resized screenshot, 1932 x 1092 for 1920 x 1080 (each side rounded to a
multiple of 28), so x = u * 1920 / 1932 and y = v * 1080 / 1092.
"""

from __future__ import annotations

import re

import pytest

from gbnf_regex import grammar_regex
from runtime.actions import (
    Click, CoordConvention, Done, DragTo, Fail, Hotkey, MoveTo, NoOp, Press, Scroll, TypeText,
    Wait, action_grammar,
)
from runtime.profiles import (
    KvAgentProfile, Qwen3VLProfile, UITarsProfile, UITarsV1Profile, UnknownProfileError, get,
    history_safe, names, pointer_after,
)
from runtime.profiles.resize import MAX_PIXELS, MIN_PIXELS, smart_resize

S = (1920, 1080)
QWEN, TARS, TARS1, KV = Qwen3VLProfile(), UITarsProfile(), UITarsV1Profile(), KvAgentProfile()


def _tc(args: str) -> str:
    return ('<tool_call>\n{"name": "computer_use", "arguments": {' + args + '}}\n</tool_call>')


# ---------------------------------------------------------------- Qwen3-VL reference outputs

QWEN_OUTPUTS = [
    ("Action: Click the Firefox icon in the dock.\n"
     + _tc('"action": "left_click", "coordinate": [125, 500]'), Click(240, 540)),
    ("Action: Open the OK button.\n" + _tc('"action": "left_click", "coordinate": [500, 900]')
     + "<|im_end|>", Click(960, 972)),
    # another key order and spacing, as a server might re-serialise it
    ('<tool_call>\n{"arguments": {"coordinate": [500, 250], "action": "right_click"}, '
     '"name": "computer_use"}\n</tool_call>', Click(960, 270, button="right")),
    (_tc('"action": "double_click", "coordinate": [750, 100]'), Click(1440, 108, clicks=2)),
    (_tc('"action": "triple_click", "coordinate": [250, 250]'), Click(480, 270, clicks=3)),
    (_tc('"action": "middle_click", "coordinate": [250, 250]'),
     Click(480, 270, button="middle")),
    (_tc('"action": "mouse_move", "coordinate": [125, 900]'), MoveTo(240, 972)),
    (_tc('"action": "left_click_drag", "start_coordinate": [125, 100], '
         '"coordinate": [750, 900]'), DragTo(240, 108, 1440, 972)),
    ("Action: Type the file name and submit.\n"
     + _tc('"action": "type", "text": "report.txt\\n"'), TypeText("report.txt\n")),
    (_tc('"action": "type", "text": "Grüße, \\"Welt\\""'), TypeText('Grüße, "Welt"')),
    (_tc('"action": "key", "keys": ["ctrl", "s"]'), Hotkey(("ctrl", "s"))),
    (_tc('"action": "key", "keys": ["Return"]'), Press("return")),
    (_tc('"action": "key", "keys": ["ctrl+shift+t"]'), Hotkey(("ctrl", "shift", "t"))),
    (_tc('"action": "key", "keys": ["Escape"]'), Press("escape")),
    (_tc('"action": "scroll", "pixels": -5'), Scroll(0, -5)),
    (_tc('"action": "scroll", "pixels": 3, "coordinate": [500, 500]'), Scroll(0, 3, 960, 540)),
    (_tc('"action": "hscroll", "pixels": 2'), Scroll(2, 0)),
    (_tc('"action": "wait", "time": 2'), Wait(2.0)),
    ("Action: The document is saved; the task is done.\n"
     + _tc('"action": "terminate", "status": "success"'), Done()),
    (_tc('"action": "terminate", "status": "failure"'), Fail()),
    # the thinking variant's reasoning block comes first
    ("<think>\nThe dialog asks to confirm; the Save button is bottom right.\n</think>\n\n"
     "Action: Click Save.\n" + _tc('"action": "left_click", "coordinate": [750, 900]'),
     Click(1440, 972)),
    # cut at max tokens before the closing tag: the call is complete, so it counts
    ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "wait", "time": 1}}',
     Wait(1.0)),
    # arguments handed over as a JSON string
    ('<tool_call>\n{"name": "computer_use", "arguments": '
     '"{\\"action\\": \\"left_click\\", \\"coordinate\\": [125, 500]}"}\n</tool_call>',
     Click(240, 540)),
]


@pytest.mark.parametrize(("text", "expected"), QWEN_OUTPUTS)
def test_qwen3vl_reference_outputs(text: str, expected: object) -> None:
    parsed = QWEN.parse(text, S)
    assert parsed.action == expected
    assert parsed.notes == ()


def test_qwen3vl_pointer_drag_notes_and_clamping() -> None:
    drag = _tc('"action": "left_click_drag", "coordinate": [750, 900]')
    assert QWEN.parse(drag, S, pointer=(10, 20)).action == DragTo(10, 20, 1440, 972)
    unknown = QWEN.parse(drag, S)
    assert isinstance(unknown.action, NoOp) and "pointer" in unknown.action.reason
    click_here = QWEN.parse(_tc('"action": "left_click"'), S, pointer=(7, 8))
    assert click_here.action == Click(7, 8) and "at the pointer" in click_here.notes[0]
    two = QWEN.parse(_tc('"action": "left_click", "coordinate": [125, 500]')
                     + _tc('"action": "type", "text": "x"'), S)
    assert two.action == Click(240, 540) and "1 further tool call" in two.notes[0]
    edge = QWEN.parse(_tc('"action": "left_click", "coordinate": [1000, 999]'), S)
    assert edge.action == Click(1919, 1079) and "clamped" in edge.notes[0]
    extra = QWEN.parse(_tc('"action": "left_click_drag", "coordinate": [1, 1], '
                           '"duration": 0.5'), S, pointer=(0, 0))
    assert extra.ok and any("ignored arguments duration" in n for n in extra.notes)
    bare = QWEN.parse('{"action": "terminate", "status": "success"}', S)
    assert bare.action == Done() and "wrapper" in bare.notes[0]


@pytest.mark.parametrize(("text", "reason"), [
    ("", "no <tool_call>"),
    ("I will click the OK button.", "no <tool_call>"),
    ('<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
     '"coordinate": [1, 2]}\n</tool_call>', "not JSON"),
    ('<tool_call>\n{"name": "browser", "arguments": {"action": "open"}}\n</tool_call>',
     "unknown tool"),
    (_tc('"action": "zoom", "coordinate": [1, 2]'), "unknown computer_use action"),
    (_tc('"coordinate": [1, 2]'), "action name"),
    (_tc('"action": "left_click", "coordinate": [1, 2, 3]'), "2 (or a box 4) numbers"),
    (_tc('"action": "left_click", "coordinate": [1500, 200]'), "outside the screen"),
    (_tc('"action": "left_click", "coordinate": ["a", 2]'), "must be a number"),
    (_tc('"action": "scroll", "pixels": "lots"'), "must be a number"),
    (_tc('"action": "scroll", "pixels": 1.5'), "whole number"),
    (_tc('"action": "terminate", "status": "maybe"'), "success or failure"),
    (_tc('"action": "key", "keys": ["hyperkey"]'), "unknown key"),
    (_tc('"action": "key", "keys": [1, 2]'), "list of key names"),
    (_tc('"action": "answer", "text": "42"'), "not an action on the desktop"),
    (_tc('"action": "type", "text": 123'), "needs a string"),
    (_tc('"action": "wait", "time": 1e999'), "finite"),
    ('<tool_call>\n["left_click", [1, 2]]\n</tool_call>', "JSON object"),
])
def test_qwen3vl_malformed_outputs(text: str, reason: str) -> None:
    action = QWEN.parse(text, S).action
    assert isinstance(action, NoOp) and reason in action.reason, action
    assert action.raw == text


# ---------------------------------------------------------------- UI-TARS reference outputs

TARS_OUTPUTS = [
    ("Thought: The Settings gear is in the top-right corner of the window. I'll click it.\n"
     "Action: click(start_box='<|box_start|>(1449,273)<|box_end|>')", Click(1440, 270)),
    ("Thought: Click the search field first.\nAction: click(start_box='(966,546)')",
     Click(960, 540)),
    ("Thought: Open the file by double-clicking it.\n"
     "Action: left_double(start_box='(483,819)')", Click(480, 810, clicks=2)),
    ("Thought: A context menu should offer Rename.\nAction: right_single(start_box='(966,273)')",
     Click(960, 270, button="right")),
    ("Thought: Move the slider to the right end.\n"
     "Action: drag(start_box='(483,273)', end_box='(1449,819)')", DragTo(480, 270, 1440, 810)),
    ("Thought: Copy the selection.\nAction: hotkey(key='ctrl c')", Hotkey(("ctrl", "c"))),
    ("Thought: Confirm the dialog.\nAction: hotkey(key='enter')", Press("enter")),
    ("Thought: Reopen the closed tab.\nAction: hotkey(key='Ctrl Shift T')",
     Hotkey(("ctrl", "shift", "t"))),
    ("Thought: Enter the address and go.\nAction: type(content='example.com\\n')",
     TypeText("example.com\n")),
    ("Thought: Type the apostrophe properly.\nAction: type(content='it\\'s fine')",
     TypeText("it's fine")),
    ("Thought: Read further down the page.\n"
     "Action: scroll(start_box='(966,546)', direction='down')", Scroll(0, -5, 960, 540)),
    ("Thought: Back to the top.\nAction: scroll(start_box='(966,546)', direction='up')",
     Scroll(0, 5, 960, 540)),
    ("Thought: The page is still loading.\nAction: wait()", Wait(5.0)),
    ("Thought: The file has been saved.\nAction: finished(content='Saved as report.txt')",
     Done()),
    ("Thought: Everything is done.\nAction: finished()", Done()),
    # UI-TARS 1.5's newer prompt writes points
    ("Thought: Click it.\nAction: click(point='<point>966 546</point>')", Click(960, 540)),
    ("Thought: Drag it.\nAction: drag(start_point='<point>483 273</point>', "
     "end_point='<point>1449 819</point>')", DragTo(480, 270, 1440, 810)),
    # a 4-number box means its centre
    ("Thought: Click the box.\nAction: click(start_box='(956,536,976,556)')", Click(960, 540)),
    ("Reflection: The menu did not open.\nAction_Summary: Try the icon again.\n"
     "Action: click(start_box='(966,546)')", Click(960, 540)),
    ("Action: click(start_box='(966,546)')<|im_end|>", Click(960, 540)),
    # all on one line: the last 'Action:' counts
    ("Thought: ok Action: click(start_box='(966,546)')", Click(960, 540)),
]


@pytest.mark.parametrize(("text", "expected"), TARS_OUTPUTS)
def test_uitars_reference_outputs(text: str, expected: object) -> None:
    parsed = TARS.parse(text, S)
    assert parsed.action == expected
    assert parsed.notes == ()


def test_uitars_fallbacks_are_noted() -> None:
    quote = TARS.parse("Thought: t\nAction: type(content='it's done\\n')", S)
    assert quote.action == TypeText("it's done\n") and "quoting" in quote.notes[0]
    user = TARS.parse("Thought: I need the password.\nAction: call_user()", S)
    assert user.action == Fail() and "call_user" in user.notes[0]
    two = TARS.parse("Thought: t\nAction: hotkey(key='ctrl a')\n\nhotkey(key='delete')", S)
    assert two.action == Hotkey(("ctrl", "a")) and "1 further action" in two.notes[0]
    typed = TARS.parse("Thought: t\nAction: type(content='Action: run\\n')", S)
    assert typed.action == TypeText("Action: run\n")  # 'Action:' inside the content
    # a typo'd keyword is not silently dropped, even though the content would be readable
    typo = TARS.parse("Thought: t\nAction: type(content='x', enter=True)", S)
    assert isinstance(typo.action, NoOp) and "unexpected arguments" in typo.action.reason


@pytest.mark.parametrize(("text", "reason"), [
    ("", "no action"),
    ("Thought: I am still thinking about it.", "not an action call"),
    ("Thought: t\nAction: ", "no action"),
    ("Thought: t\nAction: click(start_box='(abc)')", "2 (or a box 4) numbers"),
    ("Thought: t\nAction: tap(start_box='(1,2)')", "unknown action"),
    ("Thought: t\nAction: open_app(app_name='Chrome')", "unknown action"),
    ("Thought: t\nAction: scroll(start_box='(1,2)', direction='diagonal')", "direction"),
    ("Thought: t\nAction: hotkey(key='ctrl hyper')", "unknown key"),
    ("Thought: t\nAction: hotkey(key='a b c d e')", "1..4 keys"),
    ("Thought: t\nAction: click(start_box='(5000,300)')", "outside the screen"),
    ("Thought: t\nAction: click(start_box='(1,2)'", "not an action call"),
    ("Thought: t\nAction: click(start_box=__import__('os'))", "literals"),
])
def test_uitars_malformed_outputs(text: str, reason: str) -> None:
    action = TARS.parse(text, S).action
    assert isinstance(action, NoOp) and reason in action.reason, action


def test_uitars_v1_is_relative_1000() -> None:
    assert TARS1.parse("Thought: t\nAction: click(start_box='(500,250)')", S).action == \
        Click(960, 270)
    assert TARS1.parse("Thought: t\nAction: drag(start_box='(0,0)', end_box='(999,999)')",
                       S).action == DragTo(0, 0, 1918, 1079)


def test_kvagent_profile_wraps_the_action_language() -> None:
    assert KV.parse("click(960, 540)", S).action == Click(960, 540)
    assert KV.parse("Action: type(\"hi\")", S).action == TypeText("hi")
    # kvagent's language as it always was: points up to 9999 px whatever the screen, clamped
    # onto it — and the clamp is noted for the step's info
    far = KV.parse("click(5000, 9999)", S)
    assert far.action == Click(1919, 1079)
    assert far.notes == ("point (5000, 9999) lay outside the screen: clamped to (1919, 1079)",)
    assert KV.grammar(S) == KV.grammar((640, 360)) == action_grammar()
    assert KV.parse("click(5, 6)", S, pointer=(1, 1)).notes == ()
    rel = KvAgentProfile(CoordConvention.RELATIVE_999)
    assert rel.parse("click(500, 500)", S).action == Click(960, 540)
    assert rel.grammar(S) == rel.grammar((640, 360))


# ---------------------------------------------------------------- round trips and grammars

ROUND_TRIP = {
    "kvagent": [Click(5, 6), Click(5, 6, clicks=2), Click(5, 6, button="right"),
                Click(5, 6, clicks=3), MoveTo(7, 8), DragTo(1, 2, 900, 999),
                TypeText('a "q" \\ \n é'), Hotkey(("ctrl", "shift", "t")), Press("enter"),
                Scroll(0, -5), Scroll(3, 2, 10, 20), Wait(2.0), Done(), Fail()],
    "qwen3vl": [Click(5, 6), Click(5, 6, clicks=2), Click(5, 6, button="right"),
                Click(5, 6, button="middle"), Click(5, 6, clicks=3), MoveTo(999, 0),
                DragTo(1, 2, 900, 999), TypeText('a "q" \\ \n é'), Hotkey(("ctrl", "c")),
                Press("enter"), Press("+"), Scroll(0, -5), Scroll(0, 120, 10, 20),
                Scroll(-3, 0), Wait(2.0), Wait(0.5), Done(), Fail()],
    "uitars": [Click(5, 6), Click(5, 6, clicks=2), Click(5, 6, button="right"), MoveTo(7, 8),
               DragTo(1, 2, 900, 999), TypeText("it's \"q\" \\ \n"), Hotkey(("ctrl", "c")),
               Press("enter"), Press("f5"), Scroll(0, -5, 10, 20), Scroll(5, 0), Wait(5.0),
               Done(), Fail()],
}
ROUND_TRIP["uitars-v1"] = ROUND_TRIP["uitars"]
# screens on which the model's units are whole pixels: 1000 x 1000 for the grids, and one
# that smart resize keeps (both sides multiples of 28) for UI-TARS 1.5
EXACT_SCREEN = {"kvagent": S, "qwen3vl": (1000, 1000), "uitars": (1932, 1092),
                "uitars-v1": (1000, 1000)}


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_format_parses_back_to_the_same_action(name: str) -> None:
    profile, screen = get(name), EXACT_SCREEN[name]
    assert smart_resize(EXACT_SCREEN["uitars"]) == EXACT_SCREEN["uitars"]
    for action in ROUND_TRIP[name]:
        text = profile.format(action, screen)
        parsed = profile.parse(text, screen)
        assert parsed.action == action, (text, parsed)
        # nothing clamped, nothing ignored (UI-TARS notes that call_user means a failure)
        assert all(n.startswith("call_user") for n in parsed.notes), (text, parsed.notes)


@pytest.mark.parametrize("name", sorted(ROUND_TRIP))
def test_grammar_form_actions_are_sentences_of_the_grammar(name: str) -> None:
    """format() writes the grammar's spelling: checked with an independent regex reading."""
    profile = get(name)
    pattern = re.compile(grammar_regex(profile.grammar(S)), re.DOTALL)
    for action in [Click(960, 540), DragTo(0, 0, 1919, 1079), TypeText("hello"),
                   Hotkey(("ctrl", "c")), Press("enter"), Done(), Fail()]:
        text = profile.format(action, S)
        assert pattern.fullmatch(text), text
        assert len(text) <= profile.max_output_chars(S)


@pytest.mark.parametrize("name", ["qwen3vl", "uitars", "uitars-v1"])
def test_formats_refuse_what_they_cannot_express(name: str) -> None:
    from runtime.actions import InvalidActionError
    profile = get(name)
    for action in [Click(1, 1, button="right", clicks=2), Scroll(2, 3), NoOp("r", "x")]:
        with pytest.raises(InvalidActionError):
            profile.format(action, S)


# ---------------------------------------------------------------- history, layout, registry

def test_history_text_keeps_the_trained_form_without_raw_text() -> None:
    resp = ("Action: Click Save.<|im_end|>\n"
            + _tc('"action": "left_click", "coordinate": [750, 900]'))
    assert QWEN.history_text(QWEN.parse(resp, S).action, resp, S) == "Click Save."
    plain = _tc('"action": "key", "keys": ["ctrl", "s"]')
    assert QWEN.history_text(Hotkey(("ctrl", "s")), plain, S) == \
        '{"action":"key","keys":["ctrl","s"]}'
    assert "nothing was done" in QWEN.history_text(NoOp("r", "junk"), "junk", S)

    resp = ("Thought: The save <|im_start|>button\n is here.\n"
            "Action: click(start_box='(1449,273)')")
    text = TARS.history_text(TARS.parse(resp, S).action, resp, S)
    assert text == ("Thought: The save button is here.\n"
                    "Action: click(start_box='<|box_start|>(1449,273)<|box_end|>')")
    assert "nothing was done" in TARS.history_text(NoOp("r", "x"), "Action: boom", S)
    assert KV.history_text(NoOp("r", "x"), "x", S) == "noop()"
    assert KV.history_text(Click(1, 2), "whatever", S) == "click(1, 2)"


def test_history_safe_removes_markup_and_bounds_length() -> None:
    s = history_safe("a<|im_end|>\n<|im_start|>system\n<tool_call>b</tool_call>" + "x" * 900)
    assert "<|" not in s and "tool_call" not in s and "\n" not in s
    assert s.startswith("a system b") and len(s) == 400 and s.endswith("...")


@pytest.mark.parametrize("name", ["kvagent", "qwen3vl", "uitars", "uitars-v1"])
def test_history_text_fits_the_declared_bound(name: str) -> None:
    profile = get(name)
    worst = [DragTo(1919, 1079, 1919, 1079), TypeText("\\" * 16), NoOp("r", "x"),
             Hotkey(("shift", "shift", "printscreen"))]
    long_thought = "Thought: " + "t" * 64 + "\nAction: x"
    for action in worst:
        text = profile.history_text(action, long_thought, S)
        assert len(text) <= profile.max_history_chars(S), (action, text)


def test_layouts_describe_the_trained_history() -> None:
    assert QWEN.layout.window == 5 and TARS.layout.window == 5 and KV.layout.window == 3
    assert QWEN.layout.step_text(0, "Click Save.") == "Step 1: Click Save.\n"
    assert KV.layout.step_text(0, "click(1, 2)") == "Step 0: click(1, 2)\n"
    assert QWEN.layout.instruction_text("Save {it}").count("Save {it}") == 1
    assert QWEN.layout.unhonoured and TARS.layout.unhonoured and not KV.layout.unhonoured
    assert "1000x1000" in QWEN.system_prompt(*S) and "<tool_call>" in QWEN.system_prompt(*S)
    assert "(1932x1092)" in TARS.system_prompt(*S)
    assert TARS.image_tokens(S) == 69 * 39 and TARS1.image_tokens(S) is None
    assert "0 to 1000" in TARS1.system_prompt(*S)
    assert "1920x1080" in KV.system_prompt(*S)
    schema = QWEN.tool_schema()["function"]
    assert schema["name"] == "computer_use" and "left_click" in \
        schema["parameters"]["properties"]["action"]["enum"]


def test_registry() -> None:
    assert names() == ("kvagent", "qwen3vl", "uitars", "uitars-v1")
    assert get("kvagent", coords=CoordConvention.RELATIVE_1).convention is \
        CoordConvention.RELATIVE_1
    assert isinstance(get("uitars", max_pixels=1280 * 28 * 28), UITarsProfile)
    with pytest.raises(UnknownProfileError, match="known: kvagent"):
        get("gpt")


def test_pointer_after() -> None:
    assert pointer_after(Click(1, 2), None) == (1, 2)
    assert pointer_after(DragTo(1, 2, 3, 4), (0, 0)) == (3, 4)
    assert pointer_after(Scroll(0, 1, 5, 6), None) == (5, 6)
    assert pointer_after(Scroll(0, 1), (9, 9)) == (9, 9)
    assert pointer_after(TypeText("x"), (9, 9)) == (9, 9)


@pytest.mark.parametrize("screen", [(1920, 1080), (1280, 720), (3840, 2160), (7680, 4320),
                                    (100, 50), (1366, 768)])
def test_smart_resize_bounds(screen: tuple[int, int]) -> None:
    w, h = smart_resize(screen)
    assert w % 28 == 0 and h % 28 == 0
    assert MIN_PIXELS <= w * h <= MAX_PIXELS
    assert abs(w / h - screen[0] / screen[1]) < 0.1 * screen[0] / screen[1]


def test_smart_resize_known_sizes() -> None:
    # 1920 / 28 = 68.6 -> 69 units, 1080 / 28 = 38.6 -> 39 units; the area is within bounds
    assert smart_resize((1920, 1080)) == (69 * 28, 39 * 28)
    # 7680 x 4320 is 33.2 M px > 12.8 M: both sides shrink by sqrt(33.2 / 12.85) = 1.607
    assert smart_resize((7680, 4320)) == (4760 // 28 * 28, 2688 // 28 * 28)
