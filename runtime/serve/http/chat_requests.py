"""A chat completions body → a validated ``ChatRequest`` (or an ``ApiError`` saying what is
wrong, with the parameter), and the conversation the request names.

Chat completions follow OpenAI's request shape: ``messages`` with string or list content,
text parts and ``image_url`` parts carrying ``data:`` URLs (or bare base64); ``max_tokens``
(or ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``, ``stream``,
``user``.  ``max_tokens`` is a cap: a completion decodes at most ``Limits.max_tokens`` (and
half the context); only absurd values are refused.  Images are bounded by their header
(``images.py``: pixels per image and per request) before they are decoded and converted to
PNG; nothing is fetched from the network.

An answer can be constrained, as llama-server allows: ``grammar`` (GBNF text, measured —
``runtime/serve/gbnf_cost.py``: what llama.cpp's parser would expand it to and how ambiguous
it is, within ``Limits`` — and checked to parse before anything runs), ``response_format``
(``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {"schema":
{...}}}``, converted by
``runtime/serve/json_schema.py``), or kvagent's extension ``"kvagent": {"action_grammar":
PROFILE}`` — a profile's action format (``qwen3vl``: Qwen3-VL's computer_use tool calls), so
an agent that parses that format always gets an action.  At most one of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import anyio.to_thread

from runtime.profiles import names as profile_names
from runtime.serve.config import Limits
from runtime.serve.gbnf_cost import GrammarRejected
from runtime.serve.gbnf_cost import check as check_grammar
from runtime.serve.http.errors import bad_request, not_found, too_large
from runtime.serve.http.images import PixelBudget, decode_base64, read_image
from runtime.serve.json_schema import SchemaError, json_object_gbnf, schema_gbnf
from runtime.serve.messages import (ChatRequest, Constraint, ImagePart, Message, Part,
                                    Sampling, TextPart)

ROLES = ("system", "user", "assistant")
#: The header naming a request's conversation (else its ``user`` field; else none: the
#: host matches the request by content).
CONVERSATION_HEADER = "x-kvagent-conversation"


async def read_chat(body: Mapping[str, Any], limits: Limits, model: str) -> ChatRequest:
    """``parse_chat`` off the event loop (it decodes images and measures grammars), for the
    model ``model`` — a request for another model is refused before any of that work."""
    name = body.get("model")  # (a malformed name: parse_chat's 400)
    if isinstance(name, str) and 0 < len(name) <= limits.max_name_chars and name != model:
        raise not_found(f"the model {name[:100]!r} does not exist; this server serves "
                        f"{model!r}", param="model", code="model_not_found")
    return await anyio.to_thread.run_sync(parse_chat, body, limits)


def conversation_key(headers: Mapping[str, str], req: ChatRequest,
                     limits: Limits = Limits()) -> str | None:
    """The conversation the client names: the header, else ``user``, else None (a name is
    the client's own: scoped to its API key by the serve domain)."""
    key = headers.get(CONVERSATION_HEADER) or req.user
    if key is not None and len(key) > limits.max_name_chars:
        raise bad_request(f"a conversation name of at most {limits.max_name_chars} "
                          "characters", param="user")
    return key


def parse_chat(data: Mapping[str, Any], limits: Limits) -> ChatRequest:
    """Validate a chat completions body (blocking: decodes images — run it off the loop)."""
    model = data.get("model")
    if not isinstance(model, str) or not model or len(model) > limits.max_name_chars:
        raise bad_request("'model' must be a non-empty string", param="model")
    if data.get("n", 1) != 1:
        raise bad_request("only n=1 is supported", param="n")
    if data.get("tools") or data.get("functions"):
        raise bad_request("tool definitions are not supported; describe the tool in the "
                          "system prompt", param="tools")
    raw = data.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    if len(raw) > limits.max_messages:
        raise too_large(f"{len(raw)} messages; the limit is {limits.max_messages}",
                        param="messages")
    messages: list[Message] = []
    n_images = 0
    n_chars = 0
    budget = PixelBudget(limits)
    for i, m in enumerate(raw):
        msg = _message(m, i, limits, budget)
        n_images += len(msg.images)
        n_chars += len(msg.text)
        if n_images > limits.max_images:
            raise bad_request(f"more than {limits.max_images} images in one request",
                              param=f"messages[{i}]", code="too_many_images")
        messages.append(msg)
    if n_chars > limits.max_text_chars:
        raise too_large(f"{n_chars} characters of text; the limit is {limits.max_text_chars}",
                        param="messages")
    if messages[-1].role == "assistant":
        raise bad_request("the last message must not be the assistant's (continuing an "
                          "assistant message is not supported)", param="messages")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    user = data.get("user")
    if user is not None and (not isinstance(user, str) or len(user) > limits.max_name_chars):
        raise bad_request(f"'user' must be a string of at most {limits.max_name_chars} "
                          "characters", param="user")
    mode = data.get("kvagent_mode")
    if mode is not None and mode not in ("faithful", "terminal"):
        raise bad_request("'kvagent_mode' must be 'faithful' or 'terminal'",
                          param="kvagent_mode")
    return ChatRequest(model, tuple(messages), _sampling(data, limits), stream, user, mode,
                       _constraint(data, limits))


def _constraint(data: Mapping[str, Any], limits: Limits) -> Constraint | None:
    """The request's output constraint (see the module docstring); at most one."""
    given = [k for k in ("grammar", "response_format", "kvagent") if data.get(k) is not None]
    found: list[Constraint] = []
    if "grammar" in given:
        grammar = data["grammar"]
        if not isinstance(grammar, str) or not grammar.strip():
            raise bad_request("'grammar' must be GBNF text", param="grammar")
        if len(grammar) > limits.max_grammar_chars:
            raise too_large(f"the grammar has {len(grammar)} characters; the limit is "
                            f"{limits.max_grammar_chars}", param="grammar")
        found.append(Constraint("grammar", _parsed(grammar, "grammar", limits)))
    if "response_format" in given:
        rf = data["response_format"]
        kind = rf.get("type") if isinstance(rf, Mapping) else None
        if kind == "json_object":
            found.append(Constraint("json_object", _parsed(json_object_gbnf(),
                                                           "response_format", limits)))
        elif kind == "json_schema":
            spec = rf.get("json_schema")
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            if schema is None:
                raise bad_request("response_format.json_schema.schema: the JSON schema",
                                  param="response_format")
            try:
                found.append(Constraint("json_schema", _parsed(schema_gbnf(schema),
                                                               "response_format", limits)))
            except SchemaError as exc:
                raise bad_request(f"response_format: {exc}", param="response_format") from None
        elif kind != "text":
            raise bad_request("response_format.type must be text, json_object or json_schema",
                              param="response_format")
    if "kvagent" in given:
        ext = data["kvagent"]
        if not isinstance(ext, Mapping) or set(ext) - {"action_grammar"}:
            raise bad_request("'kvagent' takes {\"action_grammar\": PROFILE}", param="kvagent")
        profile = ext.get("action_grammar")
        if profile is not None:
            if profile not in profile_names():
                raise bad_request(f"kvagent.action_grammar: one of "
                                  f"{', '.join(profile_names())}", param="kvagent")
            found.append(Constraint("action_grammar", None, profile))
    if len(found) > 1:
        raise bad_request("give at most one of grammar, response_format (json) and "
                          "kvagent.action_grammar", param=given[-1])
    return found[0] if found else None


def _parsed(gbnf: str, param: str, limits: Limits) -> str:
    """``gbnf`` once its cost is measured and llama.cpp parsed it (400 with why, else).

    The cost gate (pure Python, ``gbnf_cost``) comes first: llama.cpp's parser expands
    repetitions before it can refuse anything, and writes a grammar it cannot parse, whole,
    to the log; what reaches it here is known to parse, within ``Limits``."""
    try:
        check_grammar(gbnf, max_elements=limits.max_grammar_elements,
                      max_branching=limits.max_grammar_branching)
    except GrammarRejected as exc:
        raise bad_request(f"{param}: {exc}", param=param, code=exc.code) from None
    # imported here: the check loads libllama, which a cluster's front door (a client of
    # this parser) does not need
    from cachepolicy.engine.grammar_check import gbnf_problem

    problem = gbnf_problem(gbnf)
    if problem is not None:
        raise bad_request(f"{param}: {problem}", param=param, code="invalid_grammar")
    return gbnf


def _message(m: Any, i: int, limits: Limits, budget: PixelBudget) -> Message:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"{where} must be an object", param=where)
    role = m.get("role")
    if role == "developer":  # OpenAI's newer name for system instructions
        role = "system"
    if role not in ROLES:
        raise bad_request(f"{where}.role {str(role)[:40]!r} is not supported (use one of "
                          f"{', '.join(ROLES)})", param=f"{where}.role")
    content = m.get("content")
    if isinstance(content, str):
        return Message(role, (TextPart(content),))
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of parts",
                          param=f"{where}.content")
    parts: list[Part] = []
    for j, part in enumerate(content):
        parts.append(_part(part, f"{where}.content[{j}]", role, limits, budget))
    return Message(role, tuple(parts))


def _part(part: Any, where: str, role: str, limits: Limits, budget: PixelBudget) -> Part:
    if not isinstance(part, dict):
        raise bad_request(f"{where} must be an object", param=where)
    kind = part.get("type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"{where}.text must be a string", param=f"{where}.text")
        return TextPart(text)
    if kind in ("image_url", "image"):
        if role != "user":
            raise bad_request(f"{where}: images are only supported in user messages",
                              param=where)
        url = part.get("image_url", part.get("image"))
        if isinstance(url, dict):
            url = url.get("url")
        if not isinstance(url, str):
            raise bad_request(f"{where}.image_url.url must be a string", param=where)
        return _image(url, where, limits, budget)
    raise bad_request(f"{where}.type {str(kind)[:40]!r} is not supported (text, image_url)",
                      param=f"{where}.type")


def _image(url: str, where: str, limits: Limits, budget: PixelBudget) -> ImagePart:
    if url.startswith("data:"):
        header, sep, payload = url.partition(",")
        if not sep:
            raise bad_request(f"{where}: a data: URL without a comma", param=where)
        media = header[5:].split(";")[0].strip().lower()
        if not media.startswith("image/"):
            raise bad_request(f"{where}: a data: URL of type {media or 'unknown'!r}, not "
                              "an image", param=where, code="invalid_image")
        if ";base64" not in header.lower():
            raise bad_request(f"{where}: only base64 data: URLs are supported", param=where)
    elif url.startswith(("http://", "https://", "file:")):
        raise bad_request(f"{where}: images must be inline (data: URLs or base64); kvagent "
                          "fetches nothing", param=where, code="invalid_image")
    else:
        payload = url  # bare base64
    png, size = read_image(decode_base64(payload, where, where, limits), budget, where, where)
    return ImagePart(png, size)


def _number(data: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = data.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise bad_request(f"'{key}' must be a number", param=key)
    if not lo <= value <= hi:
        raise bad_request(f"'{key}' must be in [{lo:g}, {hi:g}], got {value:g}", param=key)
    return float(value)


def _sampling(data: Mapping[str, Any], limits: Limits) -> Sampling:
    key = "max_completion_tokens" if "max_completion_tokens" in data else "max_tokens"
    max_tokens = data.get(key, 256)
    if max_tokens is None:
        max_tokens = 256
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad_request(f"'{key}' must be a positive integer", param=key)
    if max_tokens > limits.max_tokens_refused_over:
        raise bad_request(f"'{key}' is {max_tokens}; this server refuses more than "
                          f"{limits.max_tokens_refused_over} (and decodes at most "
                          f"{limits.max_tokens})", param=key, code="max_tokens_too_large")
    max_tokens = min(max_tokens, limits.max_tokens)
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise bad_request("'top_p' must be > 0", param="top_p")
    seed = data.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not -(2**63) <= seed < 2**63):
        raise bad_request("'seed' must be a 64-bit integer", param="seed")
    stop = data.get("stop")
    stops: tuple[str, ...]
    if stop is None:
        stops = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise bad_request("'stop' must be a string or a list of strings", param="stop")
    if len(stops) > limits.max_stop or any(not s or len(s) > limits.max_stop_chars
                                           for s in stops):
        raise bad_request(f"'stop': at most {limits.max_stop} non-empty strings of at most "
                          f"{limits.max_stop_chars} characters", param="stop")
    return Sampling(max_tokens, temperature, top_p, seed, stops)

