"""An episode's context as an immutable, append-only log of segments.

Segments carry their content identity (token ids for text, the pixel hash for screenshots) and
their token cost.  Appending returns a new log with a higher generation; the transaction layer
fences publication on that generation.
"""

from __future__ import annotations

import enum

import attrs


class SegmentKind(enum.Enum):
    PREAMBLE = "preamble"  # system prompt (+ the user-turn opener)
    INSTRUCTION = "instruction"  # the task instruction
    SCREENSHOT = "screenshot"
    ACTION = "action"  # the model's action text of a previous step (teacher-forced or parsed)
    SEPARATOR = "separator"  # fixed text between regions, e.g. "Screenshots:"
    GENERATION_PROMPT = "generation_prompt"
    TEXT = "text"  # verbatim text of a chat message (faithful layouts); step = its place


@attrs.frozen
class Segment:
    """One piece of an episode's context.

    Text segments: ``tokens`` is the segment's own text, tokenized on its own (so a rendered
    prompt is the concatenation of fixed token runs: byte-stable across steps and policies).
    Screenshots: ``intro`` / ``outro`` are the fixed text around the image (label and the
    projector's markers), ``image_id`` the pixel hash, ``png`` the bytes to re-encode from on
    an embedding-cache miss, ``n_image_tokens`` / ``n_image_pos`` its cost.
    """

    kind: SegmentKind
    step: int  # the agent step that produced it (-1 for the preamble / instruction)
    tokens: tuple[int, ...] = ()
    image_id: str | None = None
    png: bytes | None = attrs.field(default=None, repr=False, eq=False)
    intro: tuple[int, ...] = ()
    outro: tuple[int, ...] = ()
    n_image_tokens: int = 0
    n_image_pos: int = 0

    @property
    def n_tokens(self) -> int:
        """Every token (KV cell) this segment costs when visible."""
        return len(self.tokens) + len(self.intro) + len(self.outro) + self.n_image_tokens

    @property
    def key(self) -> str:
        """A stable name for the segment within its episode (e.g. ``screenshot@4``)."""
        return f"{self.kind.value}@{self.step}"


@attrs.frozen
class ContextLog:
    """Immutable log; ``generation`` counts appends (0 = empty)."""

    segments: tuple[Segment, ...] = ()
    generation: int = 0

    def append(self, *segments: Segment) -> ContextLog:
        if not segments:
            raise ValueError("append needs at least one segment")
        keys = {s.key for s in self.segments}
        for seg in segments:
            if seg.key in keys:
                raise ValueError(f"segment {seg.key} is already in the log")
            keys.add(seg.key)
        return ContextLog(self.segments + tuple(segments), self.generation + 1)

    def replace(self, *segments: Segment) -> ContextLog:
        """A new generation holding only ``segments`` (a client that sends its whole prompt
        every request: the request is the log)."""
        if not segments:
            raise ValueError("replace needs at least one segment")
        keys = [s.key for s in segments]
        if len(set(keys)) != len(keys):
            raise ValueError("segment keys repeat")
        return ContextLog(tuple(segments), self.generation + 1)

    def of_kind(self, kind: SegmentKind) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.kind is kind)

    @property
    def screenshots(self) -> tuple[Segment, ...]:
        return self.of_kind(SegmentKind.SCREENSHOT)

    @property
    def actions(self) -> tuple[Segment, ...]:
        return self.of_kind(SegmentKind.ACTION)

    @property
    def head(self) -> tuple[Segment, ...]:
        """Preamble, instruction and separators: the part every layout starts with."""
        return tuple(s for s in self.segments
                     if s.kind in (SegmentKind.PREAMBLE, SegmentKind.INSTRUCTION))

    def new_since(self, parent: ContextLog) -> tuple[Segment, ...]:
        """The segments this log holds that ``parent`` did not (for an appended log: the
        appended ones; for a replaced one: the content the parent lacked)."""
        n = len(parent.segments)
        if self.segments[:n] == parent.segments:
            return self.segments[n:]
        old = set(parent.segments)
        return tuple(s for s in self.segments if s not in old)

    def step_count(self) -> int:
        return len(self.screenshots)
