"""A chat completion request as the serve domain reads it: messages of text and image parts
(images already decoded and converted to PNG), the sampling the request asks for, the
output constraint and the mode.  Plain values: the HTTP layer (``runtime/serve/http/chat_requests.py``) makes them from
OpenAI-shaped bodies."""

from __future__ import annotations

import attrs


@attrs.frozen
class TextPart:
    text: str


@attrs.frozen
class ImagePart:
    png: bytes = attrs.field(repr=False)
    size: tuple[int, int]


Part = TextPart | ImagePart


@attrs.frozen
class Message:
    role: str  # system | user | assistant
    parts: tuple[Part, ...]

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.parts if isinstance(p, TextPart))

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(p for p in self.parts if isinstance(p, ImagePart))


@attrs.frozen
class Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]


@attrs.frozen
class Constraint:
    """What every answer token must keep matching: a GBNF grammar (llama.cpp's dialect).

    ``kind``: where it came from — ``grammar`` (the request's GBNF), ``json_schema`` /
    ``json_object`` (``response_format``, converted by ``json_schema.py``), or
    ``action_grammar`` (a profile's action format: ``gbnf`` is None, the profile's grammar
    is taken for the request's screenshot size when it is answered)."""

    kind: str
    gbnf: str | None = attrs.field(default=None, repr=False)
    profile: str | None = None

    @property
    def written_by_client(self) -> bool:
        """The grammar's text is the client's (its GBNF, or its schema's bounds and shape):
        matched within the server's grammar budget, apart from the engine's process."""
        return self.kind in ("grammar", "json_schema")


@attrs.frozen
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    sampling: Sampling
    stream: bool
    user: str | None
    mode: str | None  # faithful | terminal (kvagent extension), None: the server's default
    #: the request's output constraint (None: the server's ``--chat-action-grammar``, if any)
    constraint: Constraint | None = None

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(i for m in self.messages for i in m.images)
