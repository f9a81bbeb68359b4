"""Clients' grammars are matched in the grammar worker, within a time budget: the same tokens
as in-process matching, and a grammar whose cost explodes ends its generation (and only
its) within the budget instead of holding the engine for ever."""

from __future__ import annotations

import re
import time

import anyio
import pytest

from cachepolicy.errors import GrammarBudgetError
from cachepolicy.engine.sampling import GrammarBudget, SamplingParams
from test_generation import CLICK_GRAMMAR, _prompt_logits

#: Every parse of "a"×n stays alive: each "a" doubles llama.cpp's stacks (the two
#: alternatives return to different places), and no finite text ends it — short to read,
#: cheap for any static measure of its text, exponential to match.
EXPLODING_GRAMMAR = r'''
root ::= r
r ::= "a" r x | "a" r y
x ::= "b"
y ::= "b"
'''


@pytest.mark.parametrize("arch", ["qwen35", "llama"])
def test_a_client_grammar_in_the_worker_gives_the_same_tokens(engines, arch: str) -> None:
    e = engines(arch)
    for seed in range(3):
        local = SamplingParams(temperature=1.0, seed=seed, grammar=CLICK_GRAMMAR)
        isolated = SamplingParams(temperature=1.0, seed=seed, grammar=CLICK_GRAMMAR,
                                  grammar_budget=GrammarBudget())
        a = e.generate(0, _prompt_logits(e), 24, local)
        b = e.generate(0, _prompt_logits(e), 24, isolated)
        assert a == b
        assert re.fullmatch(r"click\(\d{1,3}, \d{1,3}\)", e.detokenize(b))


def test_an_invalid_client_grammar_is_a_clear_error(engines) -> None:
    e = engines("qwen35")
    with pytest.raises(ValueError, match="grammar"):
        e.generate(0, _prompt_logits(e), 4,
                   SamplingParams(grammar="root ::= (", grammar_budget=GrammarBudget()))


def test_an_exploding_grammar_ends_its_generation_within_the_budget(engines) -> None:
    e = engines("qwen35")
    budget = GrammarBudget(call_s=1.0, total_s=5.0)
    params = SamplingParams(grammar=EXPLODING_GRAMMAR, grammar_budget=budget)
    ended = e._grammars.ended
    started = time.monotonic()
    with pytest.raises(GrammarBudgetError, match="simplify the grammar"):
        e.generate(0, _prompt_logits(e), 200, params)
    took = time.monotonic() - started
    # ends at the first call past 1 s (or at 5 s of matching in all), plus the worker's
    # start and its kill: never the hours the grammar would take
    assert took < budget.total_s + 15.0, took
    assert e._grammars.ended == ended + 1
    # the engine goes on: the next client grammar gets a new worker and the right tokens
    params = SamplingParams(grammar=CLICK_GRAMMAR, grammar_budget=GrammarBudget())
    assert re.fullmatch(r"click\(\d{1,3}, \d{1,3}\)",
                        e.detokenize(e.generate(0, _prompt_logits(e), 24, params)))


async def test_the_other_generations_go_on_beside_an_exploding_one(engines) -> None:
    """Generations beside the exploding one (each grammar in a worker of its own) end with
    the tokens they have alone; only the exploding one fails."""
    e = engines("qwen35")
    slow = SamplingParams(grammar=EXPLODING_GRAMMAR,
                          grammar_budget=GrammarBudget(call_s=1.0, total_s=5.0))
    seeds = range(4)
    alone = {}
    for seed in seeds:
        params = SamplingParams(temperature=1.0, seed=seed, grammar=CLICK_GRAMMAR,
                                grammar_budget=GrammarBudget())
        alone[seed] = e.generate(1, _prompt_logits(e, 1), 24, params)
    beside: dict[int, list[int]] = {}
    failures: list[BaseException] = []
    logits_slow, logits = _prompt_logits(e, 0), _prompt_logits(e, 1)

    def explode() -> None:
        try:
            e.generate(0, logits_slow, 200, slow)
        except GrammarBudgetError as exc:
            failures.append(exc)

    def steady() -> None:
        for seed in seeds:
            params = SamplingParams(temperature=1.0, seed=seed, grammar=CLICK_GRAMMAR,
                                    grammar_budget=GrammarBudget())
            beside[seed] = e.generate(1, logits, 24, params)
            time.sleep(0.3)  # spread over the exploding one's life

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, explode)
        tg.start_soon(anyio.to_thread.run_sync, steady)
    assert len(failures) == 1
    assert beside == alone
    e.clear(0)
    e.clear(1)


def test_a_grammar_llama_cpp_refuses_leaves_its_worker_healthy(engines) -> None:
    """The worker of a refused grammar goes back to the idle pool (nothing was opened in
    it): it is neither killed nor counted as a grammar over its budget."""
    e = engines("qwen35")
    workers = e._grammars
    ended = workers.ended
    for _ in range(3):
        with pytest.raises(ValueError, match="grammar"):
            e.generate(0, _prompt_logits(e), 4,
                       SamplingParams(grammar="root ::= (", grammar_budget=GrammarBudget()))
    assert workers.ended == ended
    params = SamplingParams(grammar=CLICK_GRAMMAR, grammar_budget=GrammarBudget())
    assert re.fullmatch(r"click\(\d{1,3}, \d{1,3}\)",
                        e.detokenize(e.generate(0, _prompt_logits(e), 24, params)))


def test_closing_the_engine_under_a_grammar_is_the_servers_error(forged) -> None:
    """The engine closes while a client grammar's generation runs: that generation ends
    with GrammarWorkerError (the server's fault, answered 503), never with the grammar's
    budget error (the client's, 400); nothing of the worker is left."""
    import threading

    from cachepolicy.engine import Engine, EngineConfig
    from cachepolicy.errors import GrammarWorkerError

    m = forged("qwen35")
    e = Engine(m.model_path, m.mmproj_path,
               EngineConfig(n_ctx_per_seq=2048, n_seq_max=2, n_batch=32, n_threads=1))
    params = SamplingParams(grammar=EXPLODING_GRAMMAR,
                            grammar_budget=GrammarBudget(call_s=30.0, total_s=60.0))
    logits = _prompt_logits(e)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            e.generate(0, logits, 200, params)
        except BaseException as exc:  # noqa: BLE001  asserted below
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(2.0)  # the exploding grammar is deep in a call by now
    e._grammars.close()
    worker.join(timeout=60)
    assert not worker.is_alive() and len(raised) == 1
    assert isinstance(raised[0], GrammarWorkerError), raised[0]
    e.close()
