"""Token sampling for one generation, with an optional GBNF grammar applied by llama.cpp.

The grammar's verdict on a token does not depend on the logits (llama.cpp's grammar sampler
sets the rejected ones to -inf and leaves the rest untouched), so the sampler asks it once
per grammar state, on a row of zeros, and keeps the answer as a mask until the next
``accept``: the same mask serves ``sample`` (bitwise what applying the grammar to the real
logits gives) and ``forced`` — the one token the grammar admits, if it admits only one
(jump-forward: such a token is known before the model computes its logits).

Most vocabularies spell a character several ways (a byte token, a one-character piece, the
first character of longer pieces), so a grammar rarely admits one *token* even where it
admits one *character*.  ``forced_text`` finds the characters the grammar admits alone, one
after another, by asking a clone of the grammar about one single-character token per byte
(``CharTokens``: a few hundred candidates instead of the vocabulary) — text the model must
write, whose likely tokens make good drafts.
"""

from __future__ import annotations

import ctypes
from typing import Any

import attrs
import llama_cpp
import numpy as np

from cachepolicy.engine.errors import EngineError
from cachepolicy.engine.sampling import SamplingParams, choose_token, consume_choice

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


@attrs.frozen(eq=False)
class CharTokens:
    """One token per byte that a token spells alone (``ids[i]`` spells ``chars[i]``), and
    the end-of-generation tokens: the candidates ``Sampler.forced_text`` asks about."""

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


class Sampler:
    """Stateful token chooser for one generation: seeded RNG plus an optional GBNF grammar."""

    def __init__(self, vocab: Any, n_vocab: int, params: SamplingParams) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._grammar: Any = None
        self._allowed: np.ndarray | None = None  # the grammar's mask in its current state
        if params.grammar is not None:
            self._grammar = llama_cpp.llama_sampler_init_grammar(
                vocab, params.grammar.encode(), params.grammar_root.encode())
            if not self._grammar:
                raise ValueError("invalid GBNF grammar")
            self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._data["id"] = np.arange(n_vocab, dtype=np.int32)

    @property
    def constrained(self) -> bool:
        return self._grammar is not None

    def sample(self, logits: np.ndarray) -> int:
        """Choose the next token from ``logits`` (draws from the RNG when sampling)."""
        if self._grammar is not None:
            allowed = self.allowed()
            if not allowed.any():
                raise EngineError("the grammar allows no token here")
            logits = np.where(allowed, logits, np.float32(-np.inf))
        return choose_token(logits, self.params, self._rng)

    def allowed(self) -> np.ndarray:
        """The tokens the grammar admits next (a bool mask; all True without a grammar)."""
        if self._grammar is None:
            raise EngineError("no grammar: every token is allowed")
        if self._allowed is None:
            self._data["logit"] = 0.0
            self._data["p"] = 0.0
            arr = llama_cpp.llama_token_data_array(
                data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p),
                size=len(self._data), selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
            self._allowed = np.isfinite(self._data["logit"])
        return self._allowed

    def forced(self) -> int | None:
        """The only token the grammar admits next, or None (no grammar, or a choice)."""
        if self._grammar is None:
            return None
        ids = np.flatnonzero(self.allowed()[:])
        return int(ids[0]) if len(ids) == 1 else None

    def forced_text(self, chars: CharTokens, limit: int) -> bytes:
        """The text (up to ``limit`` bytes) the grammar admits alone from here: stops where
        it admits two characters, or the end of the generation, or one no token spells."""
        if self._grammar is None or limit <= 0:
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

    def take_forced(self, token: int) -> None:
        """``token`` is certain (``forced``): advance the RNG as sampling it would have."""
        consume_choice(self.params, self._rng)

    def accept(self, token: int) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_accept(self._grammar, token)
            self._allowed = None

    def close(self) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
