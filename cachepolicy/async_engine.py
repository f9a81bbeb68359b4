"""Run the synchronous engine from an event loop without blocking it.

Every call goes through ``anyio.to_thread.run_sync`` with one ``CapacityLimiter`` per engine
(one llama context executes one thing at a time).  Cancellation is not swallowed: a cancelled
caller waits for the running llama.cpp call to finish (it cannot be interrupted safely), then
sees the cancellation, and the engine's state is whatever that finished call left.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import anyio
import numpy as np

from cachepolicy.checkpoint import Checkpoint, CheckpointKind
from cachepolicy.engine import Engine
from cachepolicy.images import DecodedImage, EncodedImage
from cachepolicy.sampling import SamplingParams

T = TypeVar("T")


class AsyncEngine:
    """Async facade over one ``Engine``; the sync engine stays usable on its own."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.limiter = anyio.CapacityLimiter(1)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run any engine method (or function of it) in the engine's worker thread."""
        return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs),
                                              limiter=self.limiter)

    async def prefill_tokens(self, seq: int, tokens: Sequence[int], *,
                             logits: bool = True) -> np.ndarray | None:
        return await self.call(self.engine.prefill_tokens, seq, tokens, logits=logits)

    async def prefill_image(self, seq: int, image: EncodedImage, *,
                            logits: bool = False) -> np.ndarray | None:
        return await self.call(self.engine.prefill_image, seq, image, logits=logits)

    async def encode_image(self, png: bytes | DecodedImage) -> EncodedImage:
        return await self.call(self.engine.encode_image, png)

    async def generate(self, seq: int, logits: np.ndarray, max_tokens: int,
                       sampling: SamplingParams | None = None) -> list[int]:
        return await self.call(self.engine.generate, seq, logits, max_tokens, sampling)

    async def checkpoint(self, seq: int,
                         kind: CheckpointKind = CheckpointKind.FULL) -> Checkpoint:
        return await self.call(self.engine.checkpoint, seq, kind)

    async def restore(self, seq: int, ckpt: Checkpoint) -> None:
        await self.call(self.engine.restore, seq, ckpt)

    async def truncate(self, seq: int, pos: int, *, via: Checkpoint | None = None) -> None:
        await self.call(self.engine.truncate, seq, pos, via=via)

    async def clear(self, seq: int) -> None:
        await self.call(self.engine.clear, seq)
