"""``stream: true`` chat completions as server-sent events.

The stream is an ASGI app with one task group: the step (its tokens come from the engine's
worker thread through a memory stream), the writer (text deltas as OpenAI's
``chat.completion.chunk`` events, then ``data: [DONE]``) and a watcher of the client: when
it disconnects, the group is cancelled — the step's transaction rolls back, nothing leaks.
The status line waits for the first token (or the outcome), so a request that fails before
answering (a full host, a prompt over the context) still gets its HTTP error — with
``Retry-After`` on a 429 / 503, as the non-streamed answer has; a failure after that is an
``error`` event.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import anyio.from_thread
import structlog
from starlette.types import Receive, Scope, Send

from runtime.serve.chat import ChatOutcome
from runtime.serve.host import ModelHost
from runtime.serve.http.chat_bodies import chunk, event, last_chunk
from runtime.serve.http.errors import api_error, error_response
from runtime.serve.ids import new_id
from runtime.serve.messages import ChatRequest
from runtime.serve.owners import Owner

log = structlog.get_logger("kvagent.serve")

_HOLD = "\ufffd"  # an incomplete UTF-8 sequence so far: wait for the next token


class _Text:
    """Tokens → text deltas that are safe to send: nothing that a later token could still
    change (a split UTF-8 sequence) or that may turn out to start a stop string."""

    def __init__(self, detokenize: Callable[[list[int]], str], stops: tuple[str, ...]) -> None:
        self._detokenize, self._stops = detokenize, stops
        self.tokens: list[int] = []
        self.sent = 0

    def delta(self, final: str | None = None) -> str:
        if final is not None:  # the step's own text (cut at a stop string): the truth
            out, self.sent = final[self.sent:], len(final)
            return out
        text = self._detokenize(self.tokens)
        for stop in self._stops:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
            else:  # hold back a tail that could be the start of this stop string
                for k in range(min(len(stop) - 1, len(text)), 0, -1):
                    if text.endswith(stop[:k]):
                        text = text[:-k]
                        break
        text = text.rstrip(_HOLD)
        out = text[self.sent:] if len(text) > self.sent else ""
        self.sent = max(self.sent, len(text))
        return out


class ChatStream:
    """The ASGI app answering one streamed request (see the module docstring)."""

    route = "chat"

    def __init__(self, host: ModelHost, req: ChatRequest, key: str | None, owner: Owner,
                 created: int) -> None:
        self.host, self.req, self.key, self.created = host, req, key, created
        self.owner = owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host, created = self.host, self.created
        tokens_in, tokens_out = anyio.create_memory_object_stream[int](math.inf)
        outcome: dict[str, Any] = {}
        text = _Text(host.engine.detokenize, self.req.sampling.stop)
        cid = f"chatcmpl-{new_id('s')}"

        def on_token(tok: int) -> None:  # in the engine's worker thread
            anyio.from_thread.run_sync(tokens_in.send_nowait, tok)

        async def produce() -> None:
            try:
                outcome["out"] = await host.chat.complete(self.req, self.key, self.owner,
                                                          on_token=on_token)
            except Exception as exc:  # noqa: BLE001  reported to the client below;
                outcome["error"] = exc  # cancellation (a disconnect) passes through
            finally:
                tokens_in.close()

        async def watch(tg: anyio.abc.TaskGroup) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            log.info("chat_client_disconnected", route=self.route)
            tg.cancel_scope.cancel()  # the step rolls back; nothing is published

        async def body(data: bytes, more: bool = True) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": more})

        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            tg.start_soon(watch, tg)
            first = None
            async for tok in tokens_out:  # wait for the first token (or the outcome)
                first = tok
                break
            if first is None and "error" in outcome:
                await self._error_response(send, outcome["error"])
                tg.cancel_scope.cancel()
                return
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
            await body(chunk(cid, created, host.model_name,
                             {"role": "assistant", "content": ""}, None))
            if first is not None:
                text.tokens.append(first)
                async for tok in tokens_out:  # the rest of the tokens
                    text.tokens.append(tok)
                    piece = text.delta()
                    if piece:
                        await body(chunk(cid, created, host.model_name, {"content": piece},
                                         None))
            if "error" in outcome:
                await body(event(api_error(outcome["error"]).body()))
            else:
                out: ChatOutcome = outcome["out"]
                rest = text.delta(out.text)
                if rest:
                    await body(chunk(cid, created, host.model_name, {"content": rest}, None))
                await body(last_chunk(cid, created, host.model_name, out))
            await body(b"data: [DONE]\n\n", more=False)
            host.metrics.response("chat_stream", 200)
            tg.cancel_scope.cancel()  # the watcher

    async def _error_response(self, send: Send, exc: BaseException) -> None:
        error = api_error(exc)
        self.host.metrics.response("chat_stream", error.status)
        await error_response(error)({"type": "http"}, _no_receive, send)


async def _no_receive() -> dict[str, Any]:  # pragma: no cover - JSONResponse never reads
    await anyio.sleep_forever()
    return {}
