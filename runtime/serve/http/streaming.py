"""Chat completion responses: one JSON body, or ``stream: true`` as server-sent events.

The stream is an ASGI app with one task group: the step (its tokens come from the engine's
worker thread through a memory stream), the writer (text deltas as OpenAI's
``chat.completion.chunk`` events, then ``data: [DONE]``) and a watcher of the client: when
it disconnects, the group is cancelled — the step's transaction rolls back, nothing leaks.
The status line waits for the first token (or the outcome), so a request that fails before
answering (a full host, a prompt over the context) still gets its HTTP error; a failure
after that is an ``error`` event.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import anyio
import anyio.from_thread
import structlog
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from runtime.serve.chat import ChatOutcome, completion_body, kvagent_fields
from runtime.serve.http.errors import ApiError
from runtime.serve.host import ModelHost
from runtime.serve.messages import ChatRequest

log = structlog.get_logger("kvagent.serve")

_HOLD = "\ufffd"  # an incomplete UTF-8 sequence so far: wait for the next token


async def chat_response(host: ModelHost, req: ChatRequest, key: str | None) -> Response:
    created = int(time.time())
    if not req.stream:
        out = await host.chat.complete(req, key)
        return JSONResponse(completion_body(host, out, created))
    return ChatStream(host, req, key, created)  # type: ignore[return-value]


class _Text:
    """Tokens → text deltas that are safe to send: nothing that a later token could still
    change (a split UTF-8 sequence) or that may turn out to start a stop string."""

    def __init__(self, host: ModelHost, stops: tuple[str, ...]) -> None:
        self._host, self._stops = host, stops
        self.tokens: list[int] = []
        self.sent = 0

    def delta(self, final: str | None = None) -> str:
        if final is not None:  # the step's own text (cut at a stop string): the truth
            out, self.sent = final[self.sent:], len(final)
            return out
        text = self._host.engine.detokenize(self.tokens)
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
    def __init__(self, host: ModelHost, req: ChatRequest, key: str | None,
                 created: int) -> None:
        self.host, self.req, self.key, self.created = host, req, key, created
        self.route = "chat"

    def _chunk(self, cid: str, delta: dict[str, Any], finish: str | None,
               extra: dict[str, Any] | None = None) -> bytes:
        body: dict[str, Any] = {
            "id": cid, "object": "chat.completion.chunk", "created": self.created,
            "model": self.host.model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if extra:
            body.update(extra)
        return f"data: {json.dumps(body)}\n\n".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tokens_in, tokens_out = anyio.create_memory_object_stream[int](math.inf)
        outcome: dict[str, Any] = {}
        text = _Text(self.host, self.req.sampling.stop)
        cid = f"chatcmpl-stream-{self.host.new_id('s')[1]}"

        def on_token(tok: int) -> None:  # in the engine's worker thread
            anyio.from_thread.run_sync(tokens_in.send_nowait, tok)

        async def produce() -> None:
            try:
                outcome["out"] = await self.host.chat.complete(self.req, self.key,
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
            await send({"type": "http.response.body", "more_body": True,
                        "body": self._chunk(cid, {"role": "assistant", "content": ""}, None)})
            if first is not None:
                text.tokens.append(first)
                async for tok in tokens_out:  # the rest of the tokens
                    text.tokens.append(tok)
                    piece = text.delta()
                    if piece:
                        await send({"type": "http.response.body", "more_body": True,
                                    "body": self._chunk(cid, {"content": piece}, None)})
            if "error" in outcome:
                error = _as_api_error(outcome["error"])
                await send({"type": "http.response.body", "more_body": True,
                            "body": f"data: {json.dumps(error.body())}\n\n".encode()})
            else:
                out: ChatOutcome = outcome["out"]
                rest = text.delta(out.text)
                if rest:
                    await send({"type": "http.response.body", "more_body": True,
                                "body": self._chunk(cid, {"content": rest}, None)})
                m = out.step.metrics
                await send({"type": "http.response.body", "more_body": True,
                            "body": self._chunk(cid, {}, out.finish_reason, {
                                "usage": {"prompt_tokens": m.context_tokens,
                                          "completion_tokens": m.decode_tokens,
                                          "total_tokens": m.context_tokens + m.decode_tokens},
                                "kvagent": kvagent_fields(out)})})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
            self.host.metrics.response("chat_stream", 200)
            tg.cancel_scope.cancel()  # the watcher

    async def _error_response(self, send: Send, exc: BaseException) -> None:
        error = _as_api_error(exc)
        response = JSONResponse(error.body(), status_code=error.status)
        self.host.metrics.response("chat_stream", error.status)
        await response({"type": "http"}, _no_receive, send)


async def _no_receive() -> dict[str, Any]:  # pragma: no cover - JSONResponse never reads
    await anyio.sleep_forever()
    return {}


def _as_api_error(exc: BaseException) -> ApiError:
    from runtime.serve.http.app import api_error

    return api_error(exc)
