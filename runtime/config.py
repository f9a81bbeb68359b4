"""One agent configuration for every path: ``kvagent run``, ``KvAgent`` (OSWorld) and the bench.

``AgentConfig`` says how an agent decides: the cache policy and window, overlap, sampling,
the action grammar and coordinate convention, how many tokens an action may take, the
system prompt.  It has ONE set of defaults; a path that needs another value (the bench
decodes a fixed number of tokens without the grammar, so arms compare) sets it explicitly.
What to run (episodes, tasks, steps) and where (model files, budget) belong to the caller.
"""

from __future__ import annotations

import math

import attrs

from cachepolicy.base import CachePolicy, make_policy
from cachepolicy.sampling import MAX_TEMPERATURE, SamplingParams
from cachepolicy.segments import SegmentFactory, model_info
from runtime.actions import CoordConvention, action_grammar, max_action_chars
from scheduler.transaction import StepOptions

#: Tokens an action may take when the grammar is off (the grammar bounds it otherwise).
FREE_DECODE_TOKENS = 64
#: No agent step decodes more than this (the context must hold the prompt as well).
MAX_DECODE_TOKENS = 4096
#: More screenshots than this in one prompt is a typo (each costs hundreds of tokens).
MAX_WINDOW = 64


def _convention(value: CoordConvention | str) -> CoordConvention:
    return value if isinstance(value, CoordConvention) else CoordConvention(value)


def _known_policy(_: object, attribute: attrs.Attribute, name: str) -> None:
    from cachepolicy.policies import names

    if name not in names():
        raise ValueError(f"unknown cache policy {name!r}; known: {', '.join(names())}")


def _finite_temperature(_: object, attribute: attrs.Attribute, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} "
                         f"(0 = greedy), got {value}")


@attrs.frozen
class AgentConfig:
    """How an agent decides.  Every field has the one default all paths share."""

    policy: str = attrs.field(default="terminal-slot", validator=_known_policy)
    window: int = attrs.field(default=3, validator=[attrs.validators.ge(1),
                                                    attrs.validators.le(MAX_WINDOW)])
    overlap: bool = True  # prefetch the next step while the env executes the action
    temperature: float = attrs.field(default=0.0, converter=float,
                                     validator=_finite_temperature)
    seed: int = 0
    grammar: bool = True  # constrain decoding to the action language (every output parses)
    convention: CoordConvention = attrs.field(default=CoordConvention.ABSOLUTE,
                                              converter=_convention)
    #: tokens an action may take; None: what the grammar can need (or FREE_DECODE_TOKENS)
    decode_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([
            attrs.validators.ge(1), attrs.validators.le(MAX_DECODE_TOKENS)]))
    stop_at_eog: bool = True  # False: always decode ``decode_tokens`` (benchmarks)
    system_prompt: str | None = None  # None: the runtime's prompt for the screen size

    @property
    def max_tokens(self) -> int:
        """Tokens decoded at most per step."""
        if self.decode_tokens is not None:
            return self.decode_tokens
        # the grammar bounds an action's characters; a token is at least one character,
        # plus the end-of-generation token
        return max_action_chars(self.convention) + 1 if self.grammar else FREE_DECODE_TOKENS

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, seed=self.seed,
                              grammar=action_grammar(self.convention) if self.grammar else None)

    def step_options(self, scratch_seq: int | None = None) -> StepOptions:
        """The scheduler's per-step options; ``scratch_seq`` is the spare sequence relocate
        measures its drift on."""
        return StepOptions(decode_tokens=self.max_tokens, stop_at_eog=self.stop_at_eog,
                           sampling=self.sampling(),
                           scratch_seq=scratch_seq if self.policy == "relocate" else None)

    def make_policy(self, factory: SegmentFactory, *, policy: str | None = None) -> CachePolicy:
        """The episode's cache policy for ``factory``'s model (raises PolicyRefusedError for
        e.g. relocate on a hybrid model)."""
        return make_policy(policy or self.policy, model_info(factory.engine), factory.kit,
                           window=self.window, decode_tokens=self.max_tokens)
