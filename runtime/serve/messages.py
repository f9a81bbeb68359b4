"""A chat completion request as the serve domain reads it: messages of text and image parts
(images already decoded and converted to PNG), the sampling the request asks for, and the
mode.  Plain values: the HTTP layer (``runtime/serve/http/chat_requests.py``) makes them from
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
class ChatRequest:
    model: str
    messages: tuple[Message, ...]
    sampling: Sampling
    stream: bool
    user: str | None
    mode: str | None  # faithful | terminal (kvagent extension), None: the server's default

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(i for m in self.messages for i in m.images)
