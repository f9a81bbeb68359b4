"""Tokenizer, chat template, greedy / seeded sampling and GBNF-constrained generation."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cachepolicy.engine.sampling import SamplingParams, choose_token

CLICK_GRAMMAR = r'''
root ::= "click(" num ", " num ")"
num ::= [0-9] | [1-9] [0-9] | [1-9] [0-9] [0-9]
'''


def _prompt_logits(e, seq: int = 0) -> np.ndarray:
    e.clear(seq)
    logits = e.prefill_tokens(seq, e.tokenize("<|im_start|>user\nclick the ok button<|im_end|>\n"
                                              "<|im_start|>assistant\n"))
    assert logits is not None
    return logits


def test_tokenize_round_trip_and_special_tokens(engines) -> None:
    e = engines("qwen35")
    text = "type('héllo wörld') → done"
    assert e.detokenize(e.tokenize(text)) == text
    assert len(e.tokenize("<|im_start|>")) == 1
    assert e.chat_template is not None and "<|im_start|>" in e.chat_template


@pytest.mark.parametrize("arch", ["llama", "qwen35"])
def test_greedy_generation_is_deterministic(engines, arch: str) -> None:
    e = engines(arch)
    first = e.generate(0, _prompt_logits(e), 10)
    second = e.generate(0, _prompt_logits(e), 10)
    assert first == second and len(first) >= 1


def test_grammar_constrains_every_token(engines) -> None:
    e = engines("qwen35")
    for seed in range(3):
        params = SamplingParams(temperature=1.0, seed=seed, grammar=CLICK_GRAMMAR)
        out = e.generate(0, _prompt_logits(e), 24, params)
        text = e.detokenize(out)
        assert re.fullmatch(r"click\(\d{1,3}, \d{1,3}\)", text), text


def test_invalid_grammar_is_a_clear_error(engines) -> None:
    e = engines("qwen35")
    with pytest.raises(ValueError, match="grammar"):
        e.generate(0, _prompt_logits(e), 4, SamplingParams(grammar="root ::= ("))


def test_seeded_sampling_repeats_and_seeds_differ() -> None:
    rng_logits = np.random.default_rng(0).normal(size=500).astype(np.float32)

    def draw(seed: int) -> list[int]:
        rng = np.random.default_rng(seed)
        params = SamplingParams(temperature=1.0, top_p=0.9, seed=seed)
        return [choose_token(rng_logits, params, rng) for _ in range(20)]

    assert draw(1) == draw(1)
    assert draw(1) != draw(2)
    assert choose_token(rng_logits, SamplingParams(), np.random.default_rng()) == int(
        np.argmax(rng_logits))


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = np.array([10.0, 9.0, -5.0, -6.0], dtype=np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.5, seed=0)
    rng = np.random.default_rng(0)
    assert {choose_token(logits, params, rng) for _ in range(50)} == {0}


def test_bad_sampling_params_are_rejected() -> None:
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1.0)
    with pytest.raises(ValueError):
        SamplingParams(top_p=0.0)
