"""Chat completion answers in OpenAI's shape: the whole ``chat.completion`` and the
``chat.completion.chunk`` events of a stream, each with kvagent's measurements in an
extension field (``kvagent``) that clients ignore."""

from __future__ import annotations

import json
from typing import Any

from runtime.metrics import StepMetrics
from runtime.serve.chat import ChatOutcome


def completion_body(model: str, out: ChatOutcome, created: int) -> dict[str, Any]:
    m = out.step.metrics
    return {
        "id": f"chatcmpl-{out.conversation_id}-{m.step}", "object": "chat.completion",
        "created": created, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": out.text},
                     "finish_reason": out.finish_reason}],
        "usage": usage(m),
        "kvagent": kvagent_fields(out),
    }


def usage(m: StepMetrics) -> dict[str, int]:
    return {"prompt_tokens": m.context_tokens, "completion_tokens": m.decode_tokens,
            "total_tokens": m.context_tokens + m.decode_tokens}


def kvagent_fields(out: ChatOutcome) -> dict[str, Any]:
    """kvagent's per-request measurements (an extension field clients ignore); the cache
    policy that answered and ``approximate``: whether the answer was decoded from an
    approximate state (``kvagent serve --policy``: an approximate policy's edit, this step's
    or one the conversation still carries)."""
    m = out.step.metrics
    return {"conversation_id": out.conversation_id, "mode": out.mode, "step": out.step.act.index,
            "policy": m.policy, "approximate": m.approximate,
            "prefill_tokens": m.prefill_tokens, "reused_tokens": m.reused_tokens,
            "critical_path_prefill_tokens": m.critical_path_prefill_tokens,
            "prefetch_prefill_tokens": m.prefetch_prefill_tokens,
            "new_content_tokens": m.new_content_tokens, "encode_s": m.encode_s,
            "prefill_s": m.prefill_s, "decode_s": m.decode_s,
            "critical_path_s": m.critical_path_s}


def event(body: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``body``."""
    return f"data: {json.dumps(body)}\n\n".encode()


def chunk(cid: str, created: int, model: str, delta: dict[str, Any], finish: str | None,
          extra: dict[str, Any] | None = None) -> bytes:
    """A ``chat.completion.chunk`` event: ``delta`` (role or content), the finish reason on
    the last one, ``extra`` fields (usage, kvagent's) merged in."""
    body: dict[str, Any] = {
        "id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if extra:
        body.update(extra)
    return event(body)


def last_chunk(cid: str, created: int, model: str, out: ChatOutcome) -> bytes:
    """The stream's closing chunk: the finish reason, usage and kvagent's measurements."""
    return chunk(cid, created, model, {}, out.finish_reason,
                 {"usage": usage(out.step.metrics), "kvagent": kvagent_fields(out)})
