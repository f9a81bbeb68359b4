"""Token sampling for one generation: a seeded RNG and an optional grammar (``GrammarState``:
llama.cpp's matcher in this process, or in the grammar worker for a client's grammar).

The grammar's mask is asked once per grammar state (``GrammarState.allowed``) and serves
``sample`` (bitwise what applying the grammar to the real logits gives) and ``forced`` (the
one token the grammar admits, if it admits only one: jump-forward, known before the model
computes its logits).
"""

from __future__ import annotations

import numpy as np

from cachepolicy.engine.errors import EngineError
from cachepolicy.engine.grammar_state import CharTokens, GrammarState
from cachepolicy.engine.sampling import SamplingParams, choose_token, consume_choice

__all__ = ["CharTokens", "Sampler"]


class Sampler:
    """Stateful token chooser for one generation: seeded RNG plus an optional grammar
    (owned: ``close`` frees it)."""

    def __init__(self, params: SamplingParams, grammar: GrammarState | None = None) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._grammar = grammar

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
        """The tokens the grammar admits next (a bool mask)."""
        if self._grammar is None:
            raise EngineError("no grammar: every token is allowed")
        return self._grammar.allowed()

    def forced(self) -> int | None:
        """The only token the grammar admits next, or None (no grammar, or a choice)."""
        if self._grammar is None:
            return None
        ids = np.flatnonzero(self.allowed())
        return int(ids[0]) if len(ids) == 1 else None

    def forced_text(self, chars: CharTokens, limit: int) -> bytes:
        """The text (up to ``limit`` bytes) the grammar admits alone from here."""
        if self._grammar is None or limit <= 0:
            return b""
        return self._grammar.forced_text(chars, limit)

    def take_forced(self, token: int) -> None:
        """``token`` is certain (``forced``): advance the RNG as sampling it would have."""
        consume_choice(self.params, self._rng)

    def accept(self, token: int) -> None:
        if self._grammar is not None:
            self._grammar.accept(token)

    def close(self) -> None:
        if self._grammar is not None:
            self._grammar.close()
            self._grammar = None
