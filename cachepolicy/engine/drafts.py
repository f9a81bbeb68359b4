"""Prompt-lookup drafts: guesses of a generation's next tokens from n-grams of its own text.

No draft model: an agent's answer repeats what its prompt holds — the words it types come
from the instruction, the coordinates it clicks from the history of its steps — so the
tokens that followed the last occurrence of the generation's latest n-gram (longest n
first) are a cheap guess of what follows now.  Guesses are only ever checked against what
sampling would choose (``generation``), so a bad guess costs rows, never correctness.

The index maps each n-gram of the text (prompt, then the generated tokens as they come) to
the position after its latest occurrence *that has a continuation*: the text's own final
n-gram is indexed only once a token follows it, so a lookup of the current suffix finds an
earlier occurrence.  Images break the text (``BREAK``: no n-gram spans one).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

#: Stands for an image between text runs: never equal to a token id.
BREAK = -1


@attrs.frozen
class Drafting:
    """How a generation guesses ahead (speed only: outputs are the same either way).

    ``jump_forward``: feed tokens the grammar forces without sampling their predecessors'
    logits; ``lookup``: verify prompt-lookup drafts of up to ``max_draft`` tokens, found by
    an n-gram of ``min_ngram``..``max_ngram`` tokens."""

    jump_forward: bool = True
    lookup: bool = True
    max_draft: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    min_ngram: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    max_ngram: int = attrs.field(default=4, validator=attrs.validators.ge(1))

    @property
    def off(self) -> bool:
        return not (self.jump_forward or self.lookup)


#: Neither jump-forward nor drafts: every token chosen from its own call's logits.
PLAIN = Drafting(jump_forward=False, lookup=False)


class PromptLookup:
    def __init__(self, text: Iterable[int], *, min_ngram: int = 2, max_ngram: int = 4) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.tokens: list[int] = []
        self._index: dict[tuple[int, ...], int] = {}
        for t in text:
            self.push(t)

    def push(self, token: int) -> None:
        """The text grew by ``token``: the n-grams ending just before it now have one."""
        toks = self.tokens
        end = len(toks)
        for n in range(1, self.max_ngram + 1):  # 1-grams too: ``propose(min_ngram=1)``
            if end >= n:
                gram = tuple(toks[end - n:end])
                if BREAK not in gram:
                    self._index[gram] = end
        toks.append(token)

    def propose(self, limit: int, *, min_ngram: int | None = None) -> list[int]:
        """Up to ``limit`` tokens that followed the latest earlier occurrence of the longest
        matching suffix n-gram (at least ``min_ngram`` long); [] when none matches."""
        toks, lo = self.tokens, self.min_ngram if min_ngram is None else min_ngram
        if limit <= 0:
            return []
        for n in range(self.max_ngram, max(lo, 1) - 1, -1):
            if len(toks) < n:
                continue
            start = self._index.get(tuple(toks[-n:]))
            if start is not None:
                out = []
                for t in toks[start:start + limit]:
                    if t == BREAK:
                        break
                    out.append(t)
                return out
        return []
