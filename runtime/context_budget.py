"""How many positions one episode's sequence needs, and the check that a context holds them.

A screenshot is expensive: a 1920x1080 one costs ~2040 tokens through a Qwen3-VL projector,
so a window of 3 needs > 6K positions for the images alone.  ``context_need`` adds up what a
step's prompt can hold at the most — the head (system prompt, chat template, instruction),
one history line per past step, the window's screenshots and the decoded response — for an
agent configuration, a screenshot size and a step count; ``ContextNeed.check`` refuses a
context that is too small with a message naming the knobs (n_ctx, window, screenshot size,
steps).  ``kvagent run`` sizes its engine from it and ``KvAgent`` checks (or derives) its
``n_ctx`` with it before loading the model, then again with the projector's real count.

Text is bounded in characters (the profiles bound their history text and grammar sentences
in characters, and a token holds at least one character), images in tokens.
"""

from __future__ import annotations

import io
from pathlib import Path

import attrs

from runtime.actions import Screen
from cachepolicy.engine.gguf_meta import metadata
from cachepolicy.policies import POLICIES
from runtime.config import AgentConfig, system_prompt

#: The chat template's turn markers around the system prompt and the instruction, plus room
#: for the instruction itself (OSWorld's are a few hundred characters).
HEAD_SLACK_TOKENS = 512
#: Per history line beyond the profile's bound: a teacher's recorded text may be longer.
STEP_SLACK_TOKENS = 16
#: Per screenshot beyond its image tokens: "Screenshot i:", the projector's markers, wrappers.
SHOT_SLACK_TOKENS = 64
#: Contexts are sized in multiples of this.
ROUND_TOKENS = 256


class ContextBudgetError(ValueError):
    """The context cannot hold what the agent's configuration needs."""


@attrs.frozen
class ContextNeed:
    """What one episode's prompt can hold at the most, in positions."""

    screen: Screen
    image_tokens: int  # one screenshot's
    shots: int  # screenshots in the prompt at once
    steps: int  # steps the history is sized for
    head: int
    history: int
    images: int
    decode: int

    @property
    def tokens(self) -> int:
        """The total, rounded up to a multiple of ``ROUND_TOKENS``."""
        need = self.head + self.history + self.images + self.decode
        return -(-need // ROUND_TOKENS) * ROUND_TOKENS

    def check(self, n_ctx: int) -> None:
        """Raise ``ContextBudgetError`` if ``n_ctx`` positions cannot hold it; the message
        says what takes the room and which knob to turn."""
        if self.tokens <= n_ctx:
            return
        w, h = self.screen
        raise ContextBudgetError(
            f"the context is too small: n_ctx={n_ctx} positions, but {self.shots} "
            f"screenshot(s) of {w}x{h} at {self.image_tokens} image tokens each take "
            f"{self.images}, the system prompt and instruction ~{self.head}, the history of "
            f"{self.steps} steps up to {self.history} and a response up to {self.decode} "
            f"(total {self.tokens}).  Raise n_ctx to at least {self.tokens}, lower the window "
            f"(screenshots kept, now {self.shots}), send smaller screenshots (screen size) "
            f"or lower max_steps.")


def context_need(agent: AgentConfig, screen: Screen, image_tokens: int, *,
                 steps: int) -> ContextNeed:
    """What ``agent`` needs on ``screen``-sized screenshots of ``image_tokens`` tokens each,
    for episodes of up to ``steps`` steps (a policy that keeps every screenshot — not
    ``manifest.bounded`` — shows all of them)."""
    profile = agent.make_profile()
    layout = profile.layout
    bounded = POLICIES[agent.policy].manifest.bounded
    shots = min(agent.window, steps) if bounded else steps
    head = (len(system_prompt(agent, screen)) + len(layout.instruction_text(""))
            + HEAD_SLACK_TOKENS)
    per_step = (profile.max_history_chars(screen) + len(layout.step_text(steps, ""))
                + STEP_SLACK_TOKENS)
    return ContextNeed(screen=screen, image_tokens=image_tokens, shots=shots, steps=steps,
                       head=head, history=steps * per_step,
                       images=shots * (image_tokens + SHOT_SLACK_TOKENS),
                       decode=agent.max_tokens(screen))


def estimate_image_tokens(mmproj: Path, screen: Screen) -> int:
    """A screenshot's tokens from the projector's GGUF metadata, before the model loads
    (patch size x spatial merge cells; fixed-size projectors: their one size).  Checked
    against the loaded projector's real count afterwards (``blank_png``)."""
    w, h = screen
    try:
        fields = metadata(mmproj)
        patch = int(fields.get("clip.vision.patch_size") or 14)
        merge = fields.get("clip.vision.spatial_merge_size")
        if merge is None and "qwen" not in str(fields.get("clip.projector_type") or ""):
            size = int(fields.get("clip.vision.image_size") or 336)  # fixed-size projector
            return (size // patch) ** 2
        cell = patch * int(merge or 2)
        return -(-w // cell) * -(-h // cell)
    except Exception:  # noqa: BLE001  unreadable metadata: 14 px patches, no merging
        return -(-w // 14) * -(-h // 14)


def blank_png(screen: Screen) -> bytes:
    """A ``screen``-sized PNG (for asking a projector what a screenshot costs)."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", screen).save(out, format="PNG")
    return out.getvalue()
