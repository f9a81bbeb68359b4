"""The request an OSWorld-style chat agent sends each step, in the layout of OSWorld's
Qwen3-VL agent (``mm_agents/qwen3vl_agent.py``): the system prompt; a user turn holding the
oldest kept screenshot and the instruction; then, for each kept past step, the assistant's
answer and the next screenshot as a user turn.  Once ``kept_answers`` answers are kept, the
oldest answer and screenshot fall out of every later request (the window of K =
``kept_answers + 1`` screenshots slides: the "evict" layout that breaks prefix reuse).
``bounded_messages`` is the other layout ``kvagent bench-peer`` sends: the best a
prefix-caching server with checkpoints at message boundaries (llama-server) can reuse.
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


def history_line(step: int, answer: str) -> str:
    """A past step as one line of text (the bounded layout's history)."""
    return f"Step {step}: {answer.strip()}"


def bounded_messages(system: str, instruction: str, screenshots: Sequence[bytes],
                     answers: Sequence[str], *, window: int) -> list[dict[str, Any]]:
    """The messages of step ``len(answers)`` in the bounded layout a prefix-caching server
    reuses best: the system prompt, the instruction, ONE user message per past step's line
    (an append-only history) and one user message holding the last ``window`` screenshots.
    llama-server checkpoints its state at the start of every user message (with
    ``--ctx-checkpoints`` and ``-cms 0``), so the next request — one more history line, the
    window moved — reuses everything up to the window, which it re-prefills: exactly what
    kvagent's terminal-slot reuses."""
    t = len(answers)
    if len(screenshots) != t + 1:
        raise ValueError(f"step {t} needs {t + 1} screenshots, got {len(screenshots)}")
    if window < 1:
        raise ValueError("window must be >= 1")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": instruction}]
    messages += [{"role": "user", "content": history_line(j, answers[j])} for j in range(t)]
    messages.append({"role": "user",
                     "content": [image_part(s) for s in screenshots[max(0, t + 1 - window):]]})
    return messages
