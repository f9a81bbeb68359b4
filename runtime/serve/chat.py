"""Chat completions for agents that bring their own prompts: the serve domain's side of
OpenAI's API (the HTTP side — parsing, bodies, streaming — is ``runtime/serve/http``).

Every request is mapped to a conversation — an episode of the pool, on its own sequence —
and answered through that episode's ``EpisodeDriver``, so chat clients get the scheduler,
the memory budget and the overlap kvagent's own agent gets.  Two strategies answer:

- **terminal** (``terminal.py``, the default): the conversation re-laid into kvagent's
  terminal layout, so terminal-slot and overlap apply.  A request maps to steps when it has
  one assistant answer per image but the last and ends with a user message holding an image;
  anything else is answered faithfully;
- **faithful** (``faithful.py``): the prompt is exactly the client's messages through the
  model's chat format.

Mapping a request to its conversation: an explicit key (the client's conversation header or
``user`` field, read by the HTTP layer) names one of the caller's (names are per API key);
otherwise the strategy looks for a live conversation of the caller's that the request
continues.  An answer keeps to the request's constraint (a GBNF grammar, a JSON schema, a
profile's action grammar) or the server's ``--chat-action-grammar``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from cachepolicy.engine.sampling import GrammarBudget, SamplingParams
from cachepolicy.segments import SegmentFactory
from runtime.actions import Screen
from runtime.driver import DriverStep
from runtime.pool import EpisodePool
from runtime.serve.config import ServeConfig
from runtime.serve.conversation import terminal_turns
from runtime.serve.conversations import Conversations
from runtime.serve.faithful import FaithfulChat
from runtime.profiles import get as get_profile
from runtime.serve.messages import ChatRequest, Constraint, Sampling
from runtime.serve.owners import Owner
from runtime.serve.prometheus import ServeMetrics
from runtime.serve.terminal import TerminalChat
from scheduler.transaction import StepOptions


@attrs.frozen
class ChatOutcome:
    conversation_id: str
    mode: str  # the strategy that answered: terminal | faithful
    step: DriverStep
    text: str
    finish_reason: str  # stop | length


class ChatService:
    """``complete`` answers one request; ``is_end_of_generation(token)`` is the model's
    (a completion that ended on it stopped, one that ran out of tokens did not)."""

    def __init__(self, pool: EpisodePool, factory: SegmentFactory,
                 conversations: Conversations, config: ServeConfig, *,
                 metrics: ServeMetrics, is_end_of_generation: Callable[[int], bool]) -> None:
        self._conversations, self._metrics = conversations, metrics
        self._mode, self._n_ctx = config.mode, config.engine.n_ctx_per_seq
        self._screen, self._action_grammar = config.screen, config.chat_action_grammar
        self._is_end_of_generation = is_end_of_generation
        self._grammar_budget = GrammarBudget(call_s=config.limits.grammar_call_s,
                                             total_s=config.limits.grammar_total_s)
        self.terminal = TerminalChat(pool, conversations, config.agent,
                                     policy=config.chat_policy)
        self.faithful = FaithfulChat(pool, factory, conversations, config.agent)

    async def complete(self, req: ChatRequest, key: str | None, owner: Owner, *,
                       on_token: Callable[[int], None] | None = None) -> ChatOutcome:
        """Answer ``req`` in ``owner``'s conversation ``key`` (None: matched by content
        among ``owner``'s); ``on_token`` sees each decoded token (in the engine's worker
        thread)."""
        arrived = time.perf_counter()  # the request's bytes (its screenshot) are in hand
        self._conversations.prune()
        mode = req.mode or self._mode
        turns = terminal_turns(req.messages) if mode == "terminal" else None
        images = req.images
        grammar = self.grammar(req.constraint, images[-1].size if images else self._screen)
        client_grammar = req.constraint is not None and req.constraint.written_by_client
        options = self.decode_options(req.sampling, on_token, grammar,
                                      self._grammar_budget if client_grammar else None)
        if turns is None:
            mode = "faithful"
            cid, step = await self.faithful.complete(req.messages, key, owner, options,
                                                     arrived_at=arrived)
        else:
            cid, step = await self.terminal.complete(turns, key, owner, options,
                                                     arrived_at=arrived)
        self._metrics.step("chat", step.metrics)
        return ChatOutcome(cid, mode, step, step.act.record.output_text,
                           self.finish_reason(step, options))

    def grammar(self, constraint: Constraint | None, screen: Screen) -> str | None:
        """The GBNF the answer keeps to: the request's constraint, else the server's
        ``--chat-action-grammar`` profile's, else None (free text).  A profile's action
        grammar is taken for the request's (last) screenshot size."""
        if constraint is None:
            if self._action_grammar is None:
                return None
            constraint = Constraint("action_grammar", None, self._action_grammar)
        if constraint.gbnf is not None:
            return constraint.gbnf
        assert constraint.profile is not None
        return get_profile(constraint.profile).grammar(screen)

    def decode_options(self, s: Sampling, on_token: Callable[[int], None] | None,
                       grammar: str | None = None,
                       grammar_budget: GrammarBudget | None = None) -> StepOptions:
        """The request's decoding: its budget (at most half the context: the prompt needs
        room too), sampling, grammar (a client's: matched within ``grammar_budget``) and
        stop strings."""
        seed = s.seed if s.seed is not None else 0
        return StepOptions(decode_tokens=min(s.max_tokens, self._n_ctx // 2), stop_at_eog=True,
                           stop=s.stop,
                           sampling=SamplingParams(temperature=s.temperature, top_p=s.top_p,
                                                   seed=seed % (1 << 63), grammar=grammar,
                                                   grammar_budget=grammar_budget),
                           on_token=on_token)

    def finish_reason(self, step: DriverStep, options: StepOptions) -> str:
        """OpenAI's: ``stop`` (end of generation or a stop string), ``length`` (the budget)."""
        tokens = step.act.record.output_tokens
        if tokens and self._is_end_of_generation(tokens[-1]):
            return "stop"
        return "stop" if len(tokens) < options.decode_tokens else "length"
