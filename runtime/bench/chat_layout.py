"""The request an OSWorld-style chat agent sends each step, in the layout of OSWorld's
Qwen3-VL agent (``mm_agents/qwen3vl_agent.py``): the system prompt; a user turn holding the
oldest kept screenshot and the instruction; then, for each kept past step, the assistant's
answer and the next screenshot as a user turn.  Once ``kept_answers`` answers are kept, the
oldest answer and screenshot fall out of every later request (the window of K =
``kept_answers + 1`` screenshots slides: the "evict" layout that breaks prefix reuse).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any


def image_part(png: bytes) -> dict[str, Any]:
    return {"type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(png).decode()}}


def sliding_window_messages(system: str, instruction: str, screenshots: Sequence[bytes],
                            answers: Sequence[str], *, kept_answers: int) -> list[dict[str, Any]]:
    """The messages of step ``len(answers)`` (``screenshots`` holds one more than
    ``answers``: the current one is last)."""
    t = len(answers)
    if len(screenshots) != t + 1:
        raise ValueError(f"step {t} needs {t + 1} screenshots, got {len(screenshots)}")
    if kept_answers < 0:
        raise ValueError("kept_answers must be >= 0")
    first = max(0, t - kept_answers)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": system},
        {"role": "user", "content": [image_part(screenshots[first]),
                                     {"type": "text", "text": instruction}]}]
    for j in range(first, t):
        messages += [{"role": "assistant", "content": answers[j]},
                     {"role": "user", "content": [image_part(screenshots[j + 1])]}]
    return messages
