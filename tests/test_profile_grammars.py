"""Each profile's grammar driving a real (forged, random-weight) llama.cpp model: at
temperature 1 every constrained response ends by itself within the declared bound and parses.

A random model is the worst case for a grammar: it takes whatever the grammar allows, so long
thoughts, odd keys and far corners all come up.  The tiny vocabulary holds every printable
ASCII character and every byte as a token, so one token per character is the worst case and
``max_output_chars + 1`` tokens (with end-of-generation) always suffice.
"""

from __future__ import annotations

import pytest

from cachepolicy.engine import Engine
from cachepolicy.engine.sampling import SamplingParams
from runtime.profiles import get, names

SEQ = 2  # the conftest engines hold 3 sequences; 2 keeps away from other tests
SCREEN = (1280, 720)
SEEDS = 10
PROMPT = ("<|im_start|>system\nYou control a desktop.<|im_end|>\n"
          "<|im_start|>user\nOpen the terminal.<|im_end|>\n<|im_start|>assistant\n")


def _generate(e: Engine, grammar: str, budget: int, seed: int) -> tuple[str, int]:
    """One constrained response and the number of tokens it took (end-of-generation
    included); asserts it ended on end-of-generation within ``budget`` tokens."""
    e.clear(SEQ)
    try:
        logits = e.prefill_tokens(SEQ, e.tokenize(PROMPT))
        assert logits is not None
        out = e.generate(SEQ, logits, budget,
                         SamplingParams(temperature=1.0, seed=seed, grammar=grammar))
    finally:
        e.clear(SEQ)
    assert e.is_end_of_generation(out[-1]), (seed, e.detokenize(out))
    return e.detokenize(out[:-1]), len(out)


@pytest.mark.parametrize("name", names())
def test_constrained_responses_end_within_the_bound_and_parse(engines, name: str) -> None:
    e = engines("qwen35")
    profile = get(name)
    bound = profile.max_output_chars(SCREEN)
    kinds = set()
    for seed in range(SEEDS):
        text, n_tokens = _generate(e, profile.grammar(SCREEN), bound + 1, seed)
        assert len(text) <= bound and n_tokens <= bound + 1
        parsed = profile.parse(text, SCREEN, pointer=(640, 360))
        assert parsed.ok, (seed, text, parsed)
        allowed = {"qwen3vl": "starts at the pointer",  # a drag from the pointer
                   "kvagent": "clamped to",  # its grammar reaches 9999 px on any screen
                   "uitars": "call_user", "uitars-v1": "call_user"}[name]
        assert all(allowed in n for n in parsed.notes), (seed, text, parsed.notes)
        history = profile.history_text(parsed.action, text, SCREEN)
        assert len(history) <= profile.max_history_chars(SCREEN), (seed, history)
        kinds.add(parsed.action.kind)
    assert len(kinds) >= 3, kinds  # the grammar really offers a choice of actions
