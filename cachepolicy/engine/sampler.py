"""Token sampling for one generation, with an optional GBNF grammar applied by llama.cpp."""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp
import numpy as np

from cachepolicy.engine.errors import EngineError
from cachepolicy.engine.sampling import SamplingParams, choose_token

_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")], align=True)


class Sampler:
    """Stateful token chooser for one generation: seeded RNG plus an optional GBNF grammar."""

    def __init__(self, vocab: Any, n_vocab: int, params: SamplingParams) -> None:
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._grammar: Any = None
        if params.grammar is not None:
            self._grammar = llama_cpp.llama_sampler_init_grammar(
                vocab, params.grammar.encode(), params.grammar_root.encode())
            if not self._grammar:
                raise ValueError("invalid GBNF grammar")
            self._data = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._data["id"] = np.arange(n_vocab, dtype=np.int32)

    def sample(self, logits: np.ndarray) -> int:
        if self._grammar is not None:
            logits = self._mask(logits)
        return choose_token(logits, self.params, self._rng)

    def _mask(self, logits: np.ndarray) -> np.ndarray:
        self._data["logit"] = logits
        self._data["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=self._data.ctypes.data_as(llama_cpp.llama_token_data_p),
            size=len(self._data), selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(arr))
        masked = self._data["logit"].copy()
        if not np.isfinite(masked).any():
            raise EngineError("the grammar allows no token here")
        return masked

    def accept(self, token: int) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_accept(self._grammar, token)

    def close(self) -> None:
        if self._grammar is not None:
            llama_cpp.llama_sampler_free(self._grammar)
            self._grammar = None
