"""The UI-TARS profiles: ``Thought:`` / ``Action:`` responses (see ``uitars_format``).

* ``uitars`` — UI-TARS 1.5 (on Qwen2.5-VL): absolute coordinates in the pixels of the image
  the model saw, which its processor smart-resized (``resize.smart_resize``); the parser
  scales them onto the screen.
* ``uitars-v1`` — the first UI-TARS (on Qwen2-VL): coordinates relative, 0–1000 per axis.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from runtime.actions.calls import Reader
from runtime.actions.parsed import Parsed
from runtime.actions.parser import strip_end_of_turn
from runtime.profiles import uitars_format as fmt
from runtime.profiles.base import (
    HISTORY_TEXT_MAX_CHARS, HistoryLayout, Point, Profile, history_safe,
)
from runtime.profiles.resize import MAX_PIXELS, MIN_PIXELS, UNIT, smart_resize
from vmenv.actions.coords import CLAMP_MARGIN, CoordConvention, Screen, from_screen
from vmenv.actions.errors import InvalidActionError
from vmenv.actions.format import format_action
from vmenv.actions.types import Action, NoOp

NOT_PERFORMED = "none (the output was not a valid action: nothing was done)"

_PROMPT = """\
You are a GUI agent. You get a task, the steps you took so far and screenshots of the \
computer; you decide the next action.

## Output Format
```
Thought: ...
Action: ...
```

## Action Space
click(start_box='(x1,y1)')
left_double(start_box='(x1,y1)')
right_single(start_box='(x1,y1)')
drag(start_box='(x1,y1)', end_box='(x2,y2)')
hotkey(key='')  # keys separated by spaces, lower case, e.g. 'ctrl c'; one key is a key press
type(content='')  # escape \\', \\" and \\n inside content; end it with \\n to submit
scroll(start_box='(x1,y1)', direction='down or up or right or left')
wait()  # pause 5 s, then look at the new screenshot
finished()  # the task is done
call_user()  # the task cannot be done without the user

## Note
- {coords}
- In `Thought`, reason briefly, then state the next action and the element it targets in \
one sentence.
"""

_COORDS_ABS = ("Coordinates are pixels of the screenshot as you see it ({width}x{height}); "
               "(0,0) is its top-left corner.")
_COORDS_REL = ("Coordinates are relative: 0 to 1000 across the screenshot's width and "
               "height; (0,0) is its top-left corner.")

_TRAINED = (
    "OSWorld's UI-TARS agents: the task prompt (format, action space, instruction) in the "
    "first user turn; then every previous response, thought and action, as its own "
    "assistant turn, with box markers around its points; the screenshots of the last 5 steps "
    "(the current one included) as user turns placed just before their steps' responses.")

_LAYOUT = HistoryLayout(
    window=5,
    instruction="## User Instruction\n{instruction}\n\n## Previous steps\n",
    step="Step {n}:\n{text}\n",
    first_step=1,
    trained=_TRAINED,
    unhonoured=(
        "past responses are history text in the first user turn, not assistant turns",
        "screenshots are not interleaved with the responses of their steps: all history text "
        "comes first, then the last 5 screenshots",
        "the format and action space sit in the system turn (the trained prompt has them in "
        "the first user turn after a generic system turn)",
        "a past response re-enters as its thought (cleaned, cut to "
        f"{HISTORY_TEXT_MAX_CHARS} characters) and its parsed action, not as raw text",
    ),
)


@attrs.frozen
class UITarsProfile(Profile):
    """UI-TARS 1.5: absolute coordinates in the smart-resized image.

    ``min_pixels`` / ``max_pixels``: the processor's bounds; they must match what the vision
    encoder kvagent runs actually does to the screenshot, or the points land off target.
    """

    name: ClassVar[str] = "uitars"
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    @property
    def convention(self) -> CoordConvention:
        return CoordConvention.ABSOLUTE

    @property
    def layout(self) -> HistoryLayout:
        return _LAYOUT

    def image_size(self, screen: Screen) -> Screen | None:
        """The pixel space of the model's coordinates for ``screen`` (None: relative)."""
        return smart_resize(screen, min_pixels=self.min_pixels, max_pixels=self.max_pixels)

    def image_tokens(self, screen: Screen) -> int | None:
        """Image tokens a Qwen2.5-VL projector makes of ``image_size(screen)`` (one per 28 x 28
        merged patch).  The session should compare it with the engine's ``EncodedImage.n_tokens``
        once: a difference means the projector resizes otherwise and the model's pixels are
        not the ones this profile maps back (set ``min_pixels`` / ``max_pixels`` to match)."""
        image = self.image_size(screen)
        return None if image is None else (image[0] // UNIT) * (image[1] // UNIT)

    def system_prompt(self, screen_w: int, screen_h: int) -> str:
        image = self.image_size((screen_w, screen_h))
        coords = (_COORDS_REL if image is None
                  else _COORDS_ABS.format(width=image[0], height=image[1]))
        return _PROMPT.replace("{coords}", coords)

    def grammar(self, screen: Screen) -> str:
        return fmt.build_grammar(self.image_size(screen))[0]

    def max_output_chars(self, screen: Screen) -> int:
        return fmt.build_grammar(self.image_size(screen))[1]

    def _reader(self, screen: Screen, pointer: Point | None) -> Reader:
        return Reader(self.convention, screen, image=self.image_size(screen), pointer=pointer,
                      margin=CLAMP_MARGIN, wait_default_s=fmt.WAIT_S,
                      direction_clicks=fmt.SCROLL_CLICKS)

    def parse_strict(self, text: str, screen: Screen, *, pointer: Point | None = None) -> Parsed:
        reader = self._reader(screen, pointer)
        return Parsed(fmt.read_response(text, reader), tuple(reader.notes))

    def _call(self, action: Action, screen: Screen, *, markers: bool) -> str:
        image = self.image_size(screen)

        def point(x: int, y: int) -> tuple[int, int]:
            return from_screen(x, y, self.convention, screen, image=image)  # type: ignore

        return fmt.write_call(action, point, markers=markers)

    def format(self, action: Action, screen: Screen) -> str:
        """The grammar's form: a one-line thought naming the action kind, then the call."""
        call = self._call(action, screen, markers=False)
        return f"Thought: I will {action.kind.replace('_', ' ')}.\nAction: {call}"

    def history_text(self, action: Action, response: str, screen: Screen) -> str:
        """'Thought: <the response's thought, cleaned>' and 'Action: <the parsed action>',
        its points in box markers as the trained history has them."""
        thought, _ = fmt.split_response(strip_end_of_turn(response))
        thought = history_safe(thought)
        if isinstance(action, NoOp):
            act = NOT_PERFORMED
        else:
            try:
                act = self._call(action, screen, markers=True)
            except InvalidActionError:  # an action UI-TARS never produces: kvagent's words
                act = format_action(action)
        return f"Thought: {thought}\nAction: {act}" if thought else f"Action: {act}"

    def max_history_chars(self, screen: Screen) -> int:
        # the grammar's thought and call, plus the box markers (2 per box, 2 boxes at most)
        return self.max_output_chars(screen) + 4 * len("<|box_start|>") + len(NOT_PERFORMED)


@attrs.frozen
class UITarsV1Profile(UITarsProfile):
    """The first UI-TARS: coordinates relative, 0–1000 per axis (read as kvagent's 0–999
    grid: value / 1000 × size)."""

    name: ClassVar[str] = "uitars-v1"

    @property
    def convention(self) -> CoordConvention:
        return CoordConvention.RELATIVE_999

    def image_size(self, screen: Screen) -> Screen | None:
        return None
