"""Agent profiles: the prompt, history layout, output grammar and parser of one model family.

Real GUI models answer in the format they were trained on; a profile lets kvagent speak it.
Registered: ``kvagent`` (kvagent's own action language, any instruction model), ``qwen3vl``
(Qwen3-VL computer_use tool calls on a 0–999 grid), ``uitars`` (UI-TARS 1.5: Thought/Action,
absolute pixels of the smart-resized screenshot) and ``uitars-v1`` (relative 0–1000).

How a session uses a profile ``p = get(name)`` for a screen ``s = (w, h)``:

* prompt: the preamble is ``p.system_prompt(w, h)``; the first user turn opens with
  ``p.layout.instruction_text(task)``; past step ``i`` (0-based) is the line
  ``p.layout.step_text(i, text)``; keep ``p.layout.window`` screenshots (the current one
  included) unless the user chose another K;
* decoding: ``SamplingParams(grammar=p.grammar(s))`` and ``p.max_output_chars(s) + 1`` tokens
  — every constrained response then ends on end-of-generation and parses;
* parsing: ``parsed = p.parse(response, s, pointer=pointer)`` never raises for model text;
  ``parsed.action`` is an ``Action`` in screen pixels (a ``NoOp`` with its reason when the
  text was not an action) and ``parsed.notes`` says what was changed (clamped points, ignored
  extra calls): report both in the step's info;
* history: after the step, ``text = p.history_text(parsed.action, response, s)`` is what
  enters the history — never the raw response; ``p.max_history_chars(s)`` bounds it for
  context sizing;
* pointer: keep ``pointer = pointer_after(parsed.action, pointer)`` (formats whose drags start
  at the pointer need it; None until the first pointing action).

``p.layout.unhonoured`` lists what of the model's trained layout the terminal layout cannot
reproduce (log it once per run).
"""

from runtime.profiles.base import (
    HistoryLayout, Point, Profile, history_safe, pointer_after,
)
from runtime.profiles.kvagent import KvAgentProfile
from runtime.profiles.qwen3vl import Qwen3VLProfile
from runtime.profiles.registry import UnknownProfileError, get, names
from runtime.profiles.uitars import UITarsProfile, UITarsV1Profile

__all__ = [
    "HistoryLayout", "KvAgentProfile", "Point", "Profile", "Qwen3VLProfile", "UITarsProfile",
    "UITarsV1Profile", "UnknownProfileError", "get", "history_safe", "names", "pointer_after",
]
