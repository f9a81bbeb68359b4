"""Turn agent content (system prompt, instruction, screenshots, action texts) into segments.

The only place that decides the chat template's text around content (turn markers, the
screenshot's caption); the words around the instruction and each past step belong to the
agent's profile, which renders them before they get here (``runtime.session.PromptText``).
Each piece of text is tokenized on its own, once, so every layout reuses the same token runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cachepolicy.chat_format import ChatFormat
from cachepolicy.context_log import Segment, SegmentKind
from cachepolicy.layouts import PromptKit
from cachepolicy.plan import ModelInfo

if TYPE_CHECKING:  # the engine's type only: building segments needs no libllama import
    from cachepolicy.engine import Engine


class SegmentFactory:
    """Builds segments for one engine (its tokenizer, chat template and vision projector)."""

    def __init__(self, engine: Engine, chat: ChatFormat | None = None) -> None:
        self.engine = engine
        self.chat = chat or ChatFormat.from_template(engine.chat_template)
        tok = engine.tokenize
        self.kit = PromptKit(
            generation_prompt=tok(self.chat.generation_prompt),
            turn_break=tok(self.chat.assistant_suffix + self.chat.user_prefix),
            older_header=tok("Earlier steps:\n"))

    def preamble(self, system: str) -> Segment:
        return Segment(SegmentKind.PREAMBLE, -1,
                       tokens=self.engine.tokenize(self.chat.system_prefix + system))

    def instruction(self, text: str) -> Segment:
        """The first user turn opening with ``text`` (the instruction as rendered)."""
        text = self.chat.system_suffix + self.chat.user_prefix + text
        return Segment(SegmentKind.INSTRUCTION, -1, tokens=self.engine.tokenize(text))

    def action(self, step: int, line: str) -> Segment:
        """Past step ``step`` as its history ``line`` (rendered, line break included)."""
        return Segment(SegmentKind.ACTION, step, tokens=self.engine.tokenize(line))

    def screenshot(self, step: int, png: bytes) -> Segment:
        image = self.engine.encode_image(png)
        return Segment(SegmentKind.SCREENSHOT, step, image_id=image.image_id, png=png,
                       intro=self.engine.tokenize(f"Screenshot {step}:") + image.prefix_tokens,
                       outro=image.suffix_tokens + self.engine.tokenize("\n"),
                       n_image_tokens=image.n_tokens, n_image_pos=image.n_pos)


    def text(self, place: int, text: str) -> Segment:
        """Verbatim text (a chat message's, as the chat format renders it) at ``place``."""
        return Segment(SegmentKind.TEXT, place, tokens=self.engine.tokenize(text))

    def image(self, place: int, png: bytes) -> Segment:
        """An image as a chat message holds it: only the projector's own markers around it."""
        image = self.engine.encode_image(png)
        return Segment(SegmentKind.SCREENSHOT, place, image_id=image.image_id, png=png,
                       intro=image.prefix_tokens, outro=image.suffix_tokens,
                       n_image_tokens=image.n_tokens, n_image_pos=image.n_pos)


def model_info(engine: Engine) -> ModelInfo:
    """What policies may know about the engine's model."""
    return ModelInfo(kind=engine.kind, kv_bytes_per_token=engine.kv_bytes_per_token,
                     recurrent_bytes_per_seq=engine.recurrent_bytes_per_seq,
                     state_overhead_bytes=engine.state_overhead_bytes,
                     n_embd=engine.n_embd, n_vocab=engine.n_vocab,
                     kv_edit_problem=engine.kv_edit_problem,
                     shift_problem=engine.shift_problem,
                     window_problem=engine.window_problem)
