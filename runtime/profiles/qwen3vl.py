"""The Qwen3-VL profile: computer-use tool calls on a 0–999 grid (see ``qwen3vl_format``)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import attrs

from runtime.actions.calls import Reader
from runtime.actions.parsed import Parsed
from runtime.profiles import qwen3vl_format as fmt
from runtime.profiles.base import HistoryLayout, Point, Profile, history_safe
from vmenv.actions.coords import CLAMP_MARGIN, CoordConvention, Screen
from vmenv.actions.errors import InvalidActionError
from vmenv.actions.format import format_action
from vmenv.actions.types import Action, NoOp

NOT_PERFORMED = "(no valid tool call: nothing was done)"

_TOOL_DESCRIPTION = """\
Drive the computer's mouse and keyboard; after every call you are shown a new screenshot.
* The screen is addressed on a 1000x1000 grid whatever its real size: x runs from 0 at the \
left edge to 999 at the right edge, y from 0 at the top to 999 at the bottom.
* Aim at the middle of the element you want to act on, never at its border.
* Programs can take a while to react: wait and look at the next screenshot before trying an \
action again."""

_ACTION_DESCRIPTION = """\
* `left_click`, `right_click`, `middle_click`, `double_click`, `triple_click`: click that \
button (that many times) at `coordinate`.
* `mouse_move`: move the pointer to `coordinate`.
* `left_click_drag`: hold the left button, move from the pointer to `coordinate`, release.
* `type`: type `text` with the keyboard.
* `key`: press the keys in `keys` in order, then release them in reverse order (a shortcut \
such as ["ctrl", "s"], or one key such as ["enter"]).
* `scroll` / `hscroll`: turn the wheel `pixels` clicks (positive: up / right, negative: down \
/ left), at `coordinate` if given.
* `wait`: do nothing for `time` seconds.
* `terminate`: end the task with `status` success (done) or failure (impossible)."""

_RULES = """\
# How to answer

Every turn, write exactly two things:
1. one line `Action: ` followed by a short description of this step;
2. one <tool_call></tool_call> block holding the JSON call.
Write nothing else. When the task is complete, or cannot be done, call `terminate`."""

_TRAINED = (
    "OSWorld's Qwen3-VL agent: a system turn declaring the computer_use tool; the first user "
    "turn holds the oldest visible screenshot, the instruction and 'Previous actions:' with one "
    "'Step i: <summary>' line for every step whose screenshot has left the window; then, for "
    "each of the last 4 steps, its screenshot (user turn) and its full response (assistant "
    "turn); then the current screenshot: 5 screenshots in all.")

_LAYOUT = HistoryLayout(
    window=5,
    instruction=("Decide the next step from the screenshot, the instruction and the actions "
                 "taken so far.\n\nInstruction: {instruction}\n\nPrevious actions:\n"),
    step="Step {n}: {text}\n",
    first_step=1,
    trained=_TRAINED,
    unhonoured=(
        "the last 4 steps' responses are not assistant turns between their screenshots: the "
        "terminal layout keeps all text before all screenshots, so every step, recent ones "
        "included, is a 'Step i: <summary>' line and the screenshots follow the text",
        "the instruction and 'Previous actions' open the first user turn before any image, "
        "not after the oldest screenshot",
        "the tool declaration is kvagent's own wording of the computer_use schema unless the "
        "session renders tool_schema() with the model's chat template",
    ),
)


def _tool_schema() -> dict[str, Any]:
    props = {
        "action": {"description": _ACTION_DESCRIPTION, "type": "string",
                   "enum": [*fmt.ACTIONS.keys() - {"answer"}]},
        "coordinate": {"description": "[x, y] on the 0-999 grid.", "type": "array"},
        "start_coordinate": {"description": "left_click_drag only: [x, y] to start from "
                                            "instead of the pointer.", "type": "array"},
        "text": {"description": "type only.", "type": "string"},
        "keys": {"description": "key only.", "type": "array"},
        "pixels": {"description": "scroll / hscroll only: wheel clicks.", "type": "number"},
        "time": {"description": "wait only: seconds.", "type": "number"},
        "status": {"description": "terminate only.", "type": "string",
                   "enum": ["success", "failure"]},
    }
    props["action"]["enum"].sort()
    return {"type": "function", "function": {
        "name": fmt.TOOL_NAME, "description": _TOOL_DESCRIPTION,
        "parameters": {"type": "object", "properties": props, "required": ["action"]}}}


@attrs.frozen
class Qwen3VLProfile(Profile):
    """Qwen3-VL (and Qwen2.5-VL-style computer_use) tool calls."""

    name: ClassVar[str] = "qwen3vl"

    @property
    def convention(self) -> CoordConvention:
        return fmt.CONVENTION

    @property
    def layout(self) -> HistoryLayout:
        return _LAYOUT

    def tool_schema(self) -> dict[str, Any]:
        """The ``computer_use`` function declaration (OpenAI ``tools`` entry), for rendering
        with the model's own chat template instead of ``system_prompt``'s wording."""
        return _tool_schema()

    def system_prompt(self, screen_w: int, screen_h: int) -> str:
        # the grid is the same for every screen size: the model never sees pixels
        return ("# Tools\n\nYou can call the function declared inside <tools></tools> to act "
                "on the user's computer:\n<tools>\n" + json.dumps(_tool_schema()) +
                "\n</tools>\n\nWrite each call as a JSON object with the function name and "
                "its arguments, inside <tool_call></tool_call> tags:\n<tool_call>\n"
                '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
                + _RULES)

    def grammar(self, screen: Screen) -> str:
        return fmt.build_grammar()[0]

    def max_output_chars(self, screen: Screen) -> int:
        return fmt.build_grammar()[1]

    def parse_strict(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        reader = Reader(fmt.CONVENTION, screen, pointer=pointer, margin=CLAMP_MARGIN)
        return Parsed(fmt.read_tool_call(text, reader), tuple(reader.notes))

    def format(self, action: Action, screen: Screen) -> str:
        return fmt.write_tool_call(action, screen)

    def history_text(self, action: Action, response: str, screen: Screen) -> str:
        """The response's own summary line (what OSWorld's agent lists), else the call's
        arguments as compact JSON."""
        said = history_safe(fmt.summary(response))
        if isinstance(action, NoOp):
            return f"{said} {NOT_PERFORMED}" if said else NOT_PERFORMED
        if said:
            return said
        try:
            args = fmt.arguments(action, screen)
        except InvalidActionError:  # an action this format never produces: kvagent's words
            return format_action(action)
        return json.dumps(args, ensure_ascii=False, separators=(",", ":"))

    def max_history_chars(self, screen: Screen) -> int:
        # a summary or the arguments are each part of one grammar sentence
        return self.max_output_chars(screen) + len(NOT_PERFORMED) + 1
