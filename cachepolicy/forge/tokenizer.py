"""A SentencePiece-style ("llama") vocabulary with a ChatML chat template.

Layout (ids are fixed so tests and the runtime can rely on them):
  0 <unk>, 1 <s> (bos), 2 </s> (eos), 3.. control tokens (<|im_start|>, <|im_end|>, the Qwen
  vision markers), then 256 byte-fallback tokens <0x00>..<0xFF> (so any text tokenizes), the
  single characters, GUI/English word pieces, letter n-grams, and fillers up to the vocab size.

The Qwen-VL text models (``VL_ARCHES``) take the released tokenizers' added tokens too —
``<|endoftext|>``, the box / quad / object-ref markers, ``<|video_pad|>`` (control, as Qwen's
``special: true``), ``<tool_call>`` / ``<tool_response>`` / ``<think>`` pairs (user-defined:
Qwen's ``special: false``, so they tokenize whole and print) — in the vocabulary's last ids,
where Qwen keeps them (every other id is the same as the other archs'), ``<|im_end|>`` as eos
as the instruct models have it, and the released chat templates (``QWEN2VL_CHAT_TEMPLATE``:
Qwen2-VL / Qwen2.5-VL / UI-TARS-1.5; ``QWEN3VL_CHAT_TEMPLATE``: Qwen3-VL with tools).

llama.cpp's SPM tokenizer only merges a bigram if the merged string is itself a token, so
every word piece is added together with all of its prefixes: that guarantees a merge path
"▁" + "c" -> "▁c" -> "▁cl" -> ... -> "▁click".
"""

from __future__ import annotations

import itertools

import attrs
import gguf

# token types as llama.cpp reads them (gguf.TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>"
# Always present (also in text-only models) so a model file does not depend on `vision`:
# mtmd wraps Qwen-VL images in <|vision_start|> ... <|vision_end|> and tokenizes them as text.
CONTROL_TOKENS = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD)

ENDOFTEXT = "<|endoftext|>"
BOX_START, BOX_END = "<|box_start|>", "<|box_end|>"
#: Qwen2-VL's added tokens beyond the ones every forged vocabulary has, with their types
VL_TOKENS: tuple[tuple[str, int], ...] = (
    (ENDOFTEXT, CONTROL),
    ("<|object_ref_start|>", CONTROL), ("<|object_ref_end|>", CONTROL),
    (BOX_START, CONTROL), (BOX_END, CONTROL),
    ("<|quad_start|>", CONTROL), ("<|quad_end|>", CONTROL),
    ("<|vision_pad|>", CONTROL), ("<|video_pad|>", CONTROL),
    ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED),
    ("<tool_response>", USER_DEFINED), ("</tool_response>", USER_DEFINED),
    ("<think>", USER_DEFINED), ("</think>", USER_DEFINED),
)

#: mtmd's default media marker; the chat template emits it for image content parts.
MEDIA_MARKER = "<__media__>"

SPACE = "\u2581"  # SentencePiece's word-boundary marker "▁"

_WORDS = (
    "the a an to and of in is on at it you for with this that be are was not or as by "
    "from your can will click double right left button type text enter press key scroll "
    "up down screen window page user assistant system image screenshot open close save "
    "file menu search field submit cancel ok yes no next back login password email name "
    "select drag drop tab icon link done action task move mouse cursor input form settings "
    "browser address bar new edit view help home start stop wait check box item list "
    "dialog error message found see now then first second last top bottom center"
).split()
_ROLES = ("user", "assistant", "system", "tool")
_LETTERS_BY_FREQ = "etaoinshrdlcumwfgypbvkjxqz"

CHAT_TEMPLATE = (
    # No whitespace-control dashes: the "\n" after the role must survive, and llama-cpp-python
    # renders with trim_blocks, which only eats newlines that directly follow a {% %} tag.
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' or part['type'] == 'image_url' %}" + MEDIA_MARKER +
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML: `<|im_start|>role\\n...<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`
when add_generation_prompt is true. Content may be a string or a list of OpenAI-style parts;
image parts become mtmd's media marker `<__media__>`."""


QWEN2VL_CHAT_TEMPLATE = (
    # Qwen2-VL-7B-Instruct's chat_template.json (also Qwen2.5-VL's and UI-TARS-1.5's): a
    # default system turn when the conversation has none; images as the vision markers
    # around one <|image_pad|>, which mtmd expands
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture "
    "{{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video "
    "{{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

QWEN3VL_CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
"""Qwen3-VL-8B-Instruct's chat template: the system turn declares ``tools`` (one JSON object
per line inside <tools></tools>); an assistant's ``tool_calls`` become <tool_call> blocks;
``tool`` messages are <tool_response> blocks in a user turn."""


def chat_template(arch: str) -> str:
    """The chat template a forged ``arch`` model carries (ChatML unless a Qwen-VL arch)."""
    if arch == "qwen2vl":
        return QWEN2VL_CHAT_TEMPLATE
    if arch in ("qwen3vl", "qwen3vlmoe"):
        return QWEN3VL_CHAT_TEMPLATE
    return CHAT_TEMPLATE


@attrs.frozen
class Vocab:
    """Parallel arrays as stored under tokenizer.ggml.*."""

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


def _pieces(extra: tuple[str, ...] = ()) -> list[str]:
    """Normal pieces in priority order; every piece comes after all of its prefixes.

    build_vocab keeps a prefix of this list, so whatever fits stays merge-reachable.
    ``extra`` pieces (already in SentencePiece spelling) come right after the single
    characters, before the built-in words.
    """
    chars = [chr(c) for c in range(0x21, 0x7F)] + [SPACE]
    # extra pieces, then roles (they follow <|im_start|>), then each word with and without "▁"
    words = list(extra) + list(_ROLES) + [form for w in _WORDS for form in (SPACE + w, w)]
    prefixed = [p for word in words for p in _prefixes(word)]
    freq = _LETTERS_BY_FREQ
    bigrams = ["".join(p) for p in itertools.product(freq, repeat=2)]
    bigrams.sort(key=lambda s: freq.index(s[0]) + freq.index(s[1]))
    trigrams = ["".join(p) for p in itertools.product(freq[:16], repeat=3)]
    trigrams.sort(key=lambda s: sum(freq.index(c) for c in s))
    ngrams = [SPACE + b for b in bigrams] + bigrams + [SPACE + t for t in trigrams]
    return list(dict.fromkeys(chars + prefixed + ngrams))  # de-duplicate, keep first


def _prefixes(piece: str) -> list[str]:
    """The multi-character prefixes of ``piece``, shortest first, ending with itself."""
    return [piece[:k] for k in range(2, len(piece) + 1)]


def vl_vocab(vocab: Vocab) -> Vocab:
    """``vocab`` with ``VL_TOKENS`` in its last ids (in place of fillers or the least likely
    pieces: a Qwen vocabulary keeps its added tokens at the end too)."""
    n = len(VL_TOKENS)
    tokens = list(vocab.tokens[:-n]) + [t for t, _ in VL_TOKENS]
    types = list(vocab.types[:-n]) + [k for _, k in VL_TOKENS]
    scores = list(vocab.scores[:-n]) + [0.0] * n
    return Vocab(tuple(tokens), tuple(scores), tuple(types))


def build_vocab(n_vocab: int, extra_pieces: tuple[str, ...] = ()) -> Vocab:
    """A vocabulary of exactly n_vocab tokens (n_vocab >= 512).

    ``extra_pieces`` adds word pieces that shorten a trained model's prompts (e.g. frequent
    action words: ``"click"``, ``" pyautogui"``); a space is written as SentencePiece's "▁".
    Each comes with all of its prefixes, ahead of the built-in pieces, so it is
    merge-reachable and kept whatever the vocabulary size.  Without extra pieces the
    vocabulary is exactly the forge's.  ValueError if the pieces leave no room or are empty.
    """
    if any(not piece for piece in extra_pieces):
        raise ValueError("extra pieces must be non-empty strings")
    extra = tuple(piece.replace(" ", SPACE) for piece in extra_pieces)
    tokens = [UNK, BOS, EOS, *CONTROL_TOKENS]
    types = [UNKNOWN, CONTROL, CONTROL] + [CONTROL] * len(CONTROL_TOKENS)
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    room = n_vocab - len(tokens)
    if room < 128:
        raise ValueError(f"vocab of {n_vocab} leaves no room for word pieces")
    pieces = _pieces(extra)
    # the single characters come first, then the extra pieces with their prefixes: all of
    # them must fit, or a piece would silently be cut from the vocabulary
    at = {piece: i for i, piece in enumerate(pieces)}
    n_extra = max((at[piece] + 1 for piece in extra), default=0)
    if n_extra > room:
        raise ValueError(f"{n_extra} single characters and extra pieces (with prefixes) do not "
                         f"fit the {room} normal tokens of a {n_vocab}-token vocabulary")
    pieces = pieces[:room]
    tokens += pieces
    types += [NORMAL] * len(pieces)
    tokens += [f"<unused{i}>" for i in range(n_vocab - len(tokens))]
    types += [NORMAL] * (n_vocab - len(types))
    # SPM merges the highest-scoring bigram first: prefer longer pieces, then earlier ones.
    scores = [0.0] * n_vocab
    for i, (tok, kind) in enumerate(zip(tokens, types)):
        if kind == NORMAL:
            scores[i] = -1000.0 if tok.startswith("<unused") else len(tok) - i * 1e-4
    return Vocab(tuple(tokens), tuple(scores), tuple(types))


def add_tokenizer(writer: gguf.GGUFWriter, vocab: Vocab, template: str = CHAT_TEMPLATE) -> None:
    """Add the tokenizer.ggml.* keys and the chat template (a vocabulary holding
    ``VL_TOKENS`` gets Qwen's special ids: eos <|im_end|>, bos and padding <|endoftext|>)."""
    qwen = ENDOFTEXT in vocab.tokens
    writer.add_string("tokenizer.ggml.model", "llama")
    writer.add_string("tokenizer.ggml.pre", "default")
    writer.add_array("tokenizer.ggml.tokens", list(vocab.tokens))
    writer.add_array("tokenizer.ggml.scores", list(vocab.scores))
    writer.add_array("tokenizer.ggml.token_type", list(vocab.types))
    writer.add_uint32("tokenizer.ggml.unknown_token_id", vocab.id_of(UNK))
    writer.add_uint32("tokenizer.ggml.bos_token_id", vocab.id_of(ENDOFTEXT if qwen else BOS))
    writer.add_uint32("tokenizer.ggml.eos_token_id", vocab.id_of(IM_END if qwen else EOS))
    # <|im_end|> ends an assistant turn, so generation must stop on it.
    writer.add_uint32("tokenizer.ggml.eot_token_id", vocab.id_of(IM_END))
    writer.add_uint32("tokenizer.ggml.padding_token_id",
                      vocab.id_of(ENDOFTEXT if qwen else EOS))
    # ChatML prompts start with <|im_start|>, like Qwen: no implicit BOS/EOS.
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_bool("tokenizer.ggml.add_eos_token", False)
    # SPM would otherwise insert "▁" at the start and after every special token, turning
    # "<|im_start|>user" into <|im_start|> ▁ user (Qwen's BPE does not do that).
    writer.add_bool("tokenizer.ggml.add_space_prefix", False)
    writer.add_string("tokenizer.chat_template", template)
