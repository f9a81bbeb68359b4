"""One agent configuration for every path: ``kvagent run``, ``KvAgent`` (OSWorld) and the bench.

``AgentConfig`` says how an agent decides: the agent profile (the model family's prompt,
output format and history layout: ``runtime.profiles``), the cache policy and window,
overlap, sampling, whether decoding is constrained to the profile's grammar, how many tokens
an action may take, the system prompt.  It has ONE set of defaults; a path that needs another
value (the bench decodes a fixed number of tokens without the grammar, so arms compare) sets
it explicitly.  What to run (episodes, tasks, steps) and where (model files, budget) belong
to the caller.

What depends on the screenshot's size (a profile's grammar may bound coordinates by it, and
with it the tokens an action may take) takes ``screen``: the (width, height) of the image the
model sees.
"""

from __future__ import annotations

import math

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.engine.drafts import Drafting
from cachepolicy.engine.sampling import MAX_TEMPERATURE, SamplingParams
from cachepolicy.policies import POLICIES, make_policy, names, pinning_policies
from cachepolicy.segments import SegmentFactory, model_info
from cachepolicy.tail import BASES, DEFAULT_BUDGET, ReplayBudget
from runtime.actions import CoordConvention, Screen
from runtime.profiles import Profile, get
from runtime.profiles.registry import PROFILES, SERVING_PROFILES
from scheduler.transaction import StepOptions

#: Tokens an action may take when the grammar is off (the grammar bounds it otherwise).
FREE_DECODE_TOKENS = 64
#: No agent step decodes more than this (the context must hold the prompt as well).
MAX_DECODE_TOKENS = 4096
#: More screenshots than this in one prompt is a typo (each costs hundreds of tokens).
MAX_WINDOW = 64
#: The profile whose language kvagent's own prompt explains (the only one with a choice of
#: coordinate convention).
DEFAULT_PROFILE = "kvagent"
#: The screen an agent's prompt assumes until its first screenshot says otherwise (OSWorld's
#: VMs: 1920x1080); what a server checks its policy and sizes its default steps for.
DEFAULT_SCREEN: Screen = (1920, 1080)


def _convention(value: CoordConvention | str) -> CoordConvention:
    return value if isinstance(value, CoordConvention) else CoordConvention(value)


def _known_policy(_: object, attribute: attrs.Attribute, name: str) -> None:
    POLICIES.get(name)  # the registry's own error (a ValueError) lists the known names


def _known_profile(_: object, attribute: attrs.Attribute, name: str) -> None:
    if name not in SERVING_PROFILES:
        PROFILES.get(name)  # as above


def _budget(_: object, attribute: attrs.Attribute, value: str) -> None:
    ReplayBudget.parse(value)  # ValueError naming the value


def _finite_temperature(_: object, attribute: attrs.Attribute, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= MAX_TEMPERATURE):
        raise ValueError(f"temperature must be a number from 0 to {MAX_TEMPERATURE:g} "
                         f"(0 = greedy), got {value}")


class PinningError(ValueError):
    """``AgentConfig.pinned`` is not a count of screenshots, or not one the policy and the
    window can pin (callers that took it from an option name that option)."""


def _check_pinned(value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise PinningError(f"pinned screenshots must be a whole number from 0, got {value!r}")


#: ``AgentConfig.guess``
GUESS_MODES = ("auto", "always", "off")


@attrs.frozen
class AgentConfig:
    """How an agent decides.  Every field has the one default all paths share."""

    #: the model family's prompt, output format and history layout (``runtime.profiles``)
    profile: str = attrs.field(default=DEFAULT_PROFILE, validator=_known_profile)
    policy: str = attrs.field(default="terminal-slot", validator=_known_policy)
    #: screenshots the model sees (K); default: the window the profile's model was trained
    #: with (``layout.window``: 3 for kvagent, 5 for qwen3vl and uitars), resolved when the
    #: config is made (``attrs.evolve(c, profile=...)`` keeps ``c``'s window)
    window: int = attrs.field(
        default=attrs.Factory(lambda self: get(self.profile).layout.window, takes_self=True),
        validator=[attrs.validators.ge(1), attrs.validators.le(MAX_WINDOW)])
    #: the episode's first ``pinned`` screenshots stay in the window to its end, beside
    #: the newest ``window - pinned`` (a look-back: the task's starting screen; the terminal
    #: layouts only — terminal-slot, terminal-scratch, tail-replay, relocate and the
    #: splicing policies).  The shipped agents were trained without it
    pinned: int = attrs.field(default=0, validator=lambda _s, _a, v: _check_pinned(v))
    overlap: bool = True  # prefetch the next step while the env executes the action
    #: with overlap: a screenshot that arrives while the prefetch still runs is encoded at
    #: once, beside the prefetch's last pieces, instead of after it — if the engine's encoder
    #: runs beside the llama context (cores to spare: ``Engine.encoder_runs_beside``); its
    #: result is a pure function of the pixels, so outputs do not change
    encode_ahead: bool = True
    temperature: float = attrs.field(default=0.0, converter=float,
                                     validator=_finite_temperature)
    seed: int = 0
    grammar: bool = True  # constrain decoding to the profile's format (every output parses)
    #: how the kvagent profile's model writes coordinates (other profiles fix their own)
    convention: CoordConvention = attrs.field(default=CoordConvention.ABSOLUTE,
                                              converter=_convention)
    #: tokens an action may take; None: what the grammar can need (or FREE_DECODE_TOKENS)
    decode_tokens: int | None = attrs.field(
        default=None, validator=attrs.validators.optional([
            attrs.validators.ge(1), attrs.validators.le(MAX_DECODE_TOKENS)]))
    stop_at_eog: bool = True  # False: always decode ``decode_tokens`` (benchmarks)
    system_prompt: str | None = None  # None: the profile's prompt for the screen size
    #: tail replay (hybrid models; ``cachepolicy.tail``): how much of a matched prefix an
    #: approximate step re-prefills — tokens (``64``) or a share of the prefix (``10%``) —
    #: for the approximate policies (tail-replay, noevict-tail, faithful-tail) and the
    #: replay rung
    replay_budget: str = attrs.field(default=str(DEFAULT_BUDGET), validator=_budget)
    #: where a replay's recurrent state starts: ``checkpoint`` (the nearest older checkpoint
    #: of the sequence's history, else zero) or ``zero``
    replay_base: str = attrs.field(default="checkpoint", validator=attrs.validators.in_(BASES))
    #: allow approximation under memory pressure: the fallback ladder may drop this
    #: episode's checkpoints and recurrent state instead of its whole cache, and its next
    #: steps then replay a tail (marked ``approximate``).  Off: the ladder stays exact
    replay_rung: bool = False
    #: an approximate policy measures each step against its exact prompt prefilled from
    #: scratch on a spare sequence (next-token KL and top-1: ``drift_kl``,
    #: ``drift_top1_agree``) — a full prefill more per step, for benchmarks
    replay_drift: bool = False
    #: the option of a policy that takes one (``kamera``: the patch rank, ``m32`` or
    #: ``full``; ``random-evict`` / ``recency-evict``: the share of the retained
    #: screenshots' tokens kept, ``50%``); None: the policy's default
    policy_option: str | None = None
    #: where the engine decodes in runs: feed text the grammar forces (jump-forward) and
    #: prompt-lookup drafts for verification in one call; speed only — the tokens are those
    #: of plain decoding (``cachepolicy.engine.generation``)
    jump_forward: bool = True
    drafts: bool = True
    #: with overlap, after the prefetch: prefill the next step's prompt with the current
    #: screenshot as the guess for the next one (a wait, a click that changed nothing);
    #: when the next screenshot's pixels are the same, the step's critical path is the
    #: decode (and its closing text).  auto: only when the VM's past actions took long
    #: enough for the guess to finish; always: whenever the prefetch ends first; off.
    guess: str = attrs.field(default="auto", validator=attrs.validators.in_(GUESS_MODES))

    def __attrs_post_init__(self) -> None:
        policy = POLICIES[self.policy]
        if (problem := policy.pinning_problem(self.window, self.pinned)) is not None:
            which = "" if policy.pins else f" (these can pin: {pinning_policies()})"
            raise PinningError(problem + which)
        if self.profile != DEFAULT_PROFILE and self.convention is not CoordConvention.ABSOLUTE:
            raise ValueError(f"the coordinate convention is the {DEFAULT_PROFILE} profile's "
                             f"choice; profile {self.profile!r} fixes its own")
        if self.policy_option is not None:
            cls = POLICIES[self.policy]
            if not cls.takes_option:
                raise ValueError(f"policy {self.policy!r} takes no option "
                                 f"(got {self.policy_option!r})")
            cls.parse_option(self.policy_option)

    @property
    def window_label(self) -> str:
        """The window for banners: ``3``, or ``3 (first 1 pinned)``."""
        return f"{self.window} (first {self.pinned} pinned)" if self.pinned else str(self.window)

    def make_profile(self) -> Profile:
        """The profile object (an immutable value; one per session is enough)."""
        if self.profile == DEFAULT_PROFILE:
            return get(self.profile, coords=self.convention)
        return get(self.profile)

    def max_tokens(self, screen: Screen) -> int:
        """Tokens decoded at most per step on a ``screen``-sized screenshot."""
        if self.decode_tokens is not None:
            return self.decode_tokens
        if not self.grammar:
            return FREE_DECODE_TOKENS
        # the grammar bounds a response's characters; a token is at least one character,
        # plus the end-of-generation token
        return self.make_profile().max_output_chars(screen) + 1

    def sampling(self, screen: Screen) -> SamplingParams:
        grammar = self.make_profile().grammar(screen) if self.grammar else None
        return SamplingParams(temperature=self.temperature, seed=self.seed, grammar=grammar)

    def step_options(self, screen: Screen) -> StepOptions:
        """The scheduler's options for a step on a ``screen``-sized screenshot."""
        return StepOptions(decode_tokens=self.max_tokens(screen), stop_at_eog=self.stop_at_eog,
                           sampling=self.sampling(screen), drafting=self.drafting)

    @property
    def drafting(self) -> Drafting:
        return Drafting(jump_forward=self.jump_forward, lookup=self.drafts)

    def make_policy(self, factory: SegmentFactory, screen: Screen, *,
                    policy: str | None = None) -> CachePolicy:
        """The episode's cache policy for ``factory``'s model (raises PolicyRefusedError for
        e.g. relocate on a hybrid model); an approximate one replays with this config's
        budget."""
        name = policy or self.policy
        options: dict[str, object] = (
            {"tail": self.tail()} if POLICIES[name].default_tail is not None else {})
        if POLICIES[name].manifest.quality == "approximate":
            options["measure_drift"] = self.replay_drift
        if POLICIES[name].takes_option:
            options["option"] = self.policy_option
        if self.pinned:
            options["pinned"] = self.pinned
        return make_policy(name, model_info(factory.engine), factory.kit, window=self.window,
                           decode_tokens=self.max_tokens(screen), **options)

    def tail(self) -> ReplayBudget:
        """The replay budget (``replay_budget`` from ``replay_base``)."""
        return ReplayBudget.parse(self.replay_budget, self.replay_base)

    def replay_twin(self, policy: CachePolicy) -> CachePolicy | None:
        """What the replay rung plans an episode of ``policy`` with after it struck: the
        policy's tail-replay variant, when ``replay_rung`` allows it (else None)."""
        if not self.replay_rung:
            return None
        return policy if policy.tail is not None else policy.with_tail(self.tail())


#: ``<policy>@<budget or option>``: a policy with its replay budget (an approximate one on
#: hybrids: ``tail-replay@10%``, ``tail-replay@64``) or the option of one that takes one
#: (``kamera@m32``, ``random-evict@50%``)
POLICY_SEPARATOR = "@"


@attrs.frozen
class PolicyChoice:
    """A policy as spelled by ``--policy``, the episode API's ``policy`` option and bench
    arms (``runtime.bench.arms``, which add ``+overlap``): ``<policy>[@<budget or option>]``
    — the one reading of that spelling."""

    policy: str
    budget: str | None = None  # None: the agent config's replay budget
    option: str | None = None  # None: the agent config's policy option

    @classmethod
    def parse(cls, text: str, *, what: str = "policy") -> PolicyChoice:
        """The choice ``text`` spells; ValueError (naming it as ``what``) for an unknown
        policy, or a budget or option that does not parse or that the policy does not take."""
        policy, sep, rest = text.strip().partition(POLICY_SEPARATOR)
        if policy not in POLICIES:
            raise ValueError(f"unknown {what} {text!r}: choose from {', '.join(names())} (each "
                             f"optionally {POLICY_SEPARATOR}<replay budget> if approximate, "
                             f"{POLICY_SEPARATOR}<option> if it takes one)")
        if not sep:
            return cls(policy)
        cls_ = POLICIES[policy]
        try:
            if cls_.takes_option:
                cls_.parse_option(rest)
                return cls(policy, option=rest)
            if cls_.default_tail is None:
                raise ValueError(f"policy {policy!r} is exact, it takes no replay budget")
            ReplayBudget.parse(rest)
        except ValueError as exc:
            raise ValueError(f"{what} {text!r}: {exc}") from None
        return cls(policy, budget=rest)

    def __str__(self) -> str:
        extra = self.budget or self.option
        return self.policy + (f"{POLICY_SEPARATOR}{extra}" if extra else "")

    def agent(self, agent: AgentConfig, **changes: object) -> AgentConfig:
        """``agent`` running this policy (its budget, its option or ``agent``'s own, none
        for a policy that takes none), with ``changes``; raises what ``AgentConfig`` does."""
        return attrs.evolve(agent, policy=self.policy,
                            **({"replay_budget": self.budget} if self.budget else {}),
                            policy_option=(self.option or agent.policy_option
                                           if POLICIES[self.policy].takes_option else None),
                            **changes)


def system_prompt(config: AgentConfig, screen: Screen) -> str:
    """The system prompt an agent with ``config`` sees on a ``screen``-sized screenshot."""
    if config.system_prompt is not None:
        return config.system_prompt
    return config.make_profile().system_prompt(*screen)
