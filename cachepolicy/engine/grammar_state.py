"""One GBNF grammar's matching state in llama.cpp: which tokens it admits next, what it
accepts, and the text it forces — the one implementation, used in the engine's process for
the grammars kvagent writes itself and inside the grammar worker (``grammar_worker``) for the
grammars a server's clients send.

The grammar's verdict on a token does not depend on the logits (llama.cpp's grammar sampler
sets the rejected ones to -inf and leaves the rest untouched), so it is asked once per
grammar state, on a row of zeros, and the answer is kept as a mask until the next
``accept``: the same mask serves sampling (bitwise what applying the grammar to the real
logits gives) and jump-forward (the one token the grammar admits, if it admits only one).

Most vocabularies spell a character several ways (a byte token, a one-character piece, the
first character of longer pieces), so a grammar rarely admits one *token* even where it
admits one *character*.  ``forced_text`` finds the characters the grammar admits alone, one
after another, by asking a clone of the grammar about one single-character token per byte
(``CharTokens``: a few hundred candidates instead of the vocabulary).
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import attrs
import llama_cpp
import numpy as np

from cachepolicy.engine.errors import EngineError

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


@attrs.frozen(eq=False)
class CharTokens:
    """One token per byte that a token spells alone (``ids[i]`` spells ``chars[i]``), and
    the end-of-generation tokens: the candidates ``forced_text`` asks about."""

    ids: np.ndarray
    chars: bytes
    eog: np.ndarray

    @classmethod
    def of(cls, vocab: Any, n_vocab: int) -> CharTokens:
        buf = ctypes.create_string_buffer(64)
        by_char: dict[int, int] = {}
        eog = []
        for t in range(n_vocab):
            if llama_cpp.llama_vocab_is_eog(vocab, t):
                eog.append(t)
                continue
            n = llama_cpp.llama_token_to_piece(vocab, t, buf, len(buf), 0, True)
            if n == 1:
                by_char.setdefault(buf.raw[0], t)
        chars = bytes(sorted(by_char))
        return cls(np.asarray([by_char[c] for c in chars], dtype=np.int32), chars,
                   np.asarray(eog, dtype=np.int32))


class GrammarState(Protocol):
    """What a generation asks of its grammar (``Sampler``).  ``allowed`` does not change
    the state; ``accept`` advances it; ``close`` frees it (idempotent)."""

    def allowed(self) -> np.ndarray: ...

    def accept(self, token: int) -> None: ...

    def forced_text(self, chars: CharTokens, limit: int) -> bytes: ...

    def close(self) -> None: ...


class GrammarParseError(EngineError, ValueError):
    """llama.cpp did not parse the grammar (its reason goes to its own stderr): the client's
    input (a ``KvagentCacheError``, so a server answers 400) and a ``ValueError``."""


class LocalGrammar:
    """A grammar matched by llama.cpp in this process (``GrammarState``)."""

    def __init__(self, vocab: Any, n_vocab: int, text: str, root: str = "root") -> None:
        self._grammar: Any = llama_cpp.llama_sampler_init_grammar(vocab, text.encode(),
                                                                  root.encode())
        if not self._grammar:
            raise GrammarParseError("invalid GBNF grammar")
        self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
        self._data["id"] = np.arange(n_vocab, dtype=np.int32)
        self._allowed: np.ndarray | None = None  # the mask in the current state

    def allowed(self) -> np.ndarray:
        """The tokens the grammar admits next (a bool mask over the vocabulary)."""
        if self._allowed is None:
            self._data["logit"] = 0.0
            self._data["p"] = 0.0
            arr = llama_cpp.llama_token_data_array(
                data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p),
                size=len(self._data), selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
            self._allowed = np.isfinite(self._data["logit"])
        return self._allowed

    def accept(self, token: int) -> None:
        llama_cpp.llama_sampler_accept(self._grammar, token)
        self._allowed = None

    def forced_text(self, chars: CharTokens, limit: int) -> bytes:
        """The text (up to ``limit`` bytes) the grammar admits alone from here: stops where
        it admits two characters, or the end of the generation, or one no token spells."""
        if limit <= 0:
            return b""
        clone = llama_cpp.llama_sampler_clone(self._grammar)
        cand = np.concatenate([chars.ids, chars.eog])
        data = np.zeros(len(cand), dtype=_TOKEN_DATA)
        out = bytearray()
        try:
            while len(out) < limit:
                data["id"], data["logit"], data["p"] = cand, 0.0, 0.0
                arr = llama_cpp.llama_token_data_array(
                    data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
                    size=len(data), selected=-1, sorted=False)
                llama_cpp.llama_sampler_apply(clone, ctypes.byref(arr))
                ok = np.isfinite(data["logit"])
                if ok[len(chars.ids):].any() or np.count_nonzero(ok) != 1:
                    break
                i = int(np.flatnonzero(ok)[0])
                out.append(chars.chars[i])
                llama_cpp.llama_sampler_accept(clone, int(chars.ids[i]))
        finally:
            llama_cpp.llama_sampler_free(clone)
        return bytes(out)

    def close(self) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
