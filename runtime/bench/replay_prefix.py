"""Prefill tokens and seconds to the first token at matched prefixes of growing length:
a full re-prefill, an exact checkpoint at the prefix's end and tail replays, side by side on
one engine (``kvagent bench-replay-prefix``; issue 23).

For each prefix (``runtime.bench.agent_prefix.Case``) the sequence is brought to the same
state before every measurement — it holds the prefix and then what the new prompt no longer
has there (restored from a FULL checkpoint, untimed) — and one arm runs the step's engine
work through the shipping path: the policy plans it (``CachePolicy.plan_reusing`` on the
sequence's real ``SeqInfo``), ``cachepolicy.executor.prefill`` carries the plan out, and the
first token is chosen greedily from the prompt's last logits.  The arms:

* ``full`` — noevict planning with no reuse: a CLEAR start, the whole prompt prefilled
  (exact; the reference);
* ``exact`` — noevict with a PARTIAL_ONLY checkpoint at the prefix's end (what terminal-slot
  and noevict keep): a TRUNCATE start (restore the recurrent state, trim the attention KV),
  only the suffix prefilled; bitwise ``full``'s logits (checked);
* ``tail@r`` — noevict-tail with replay budget r (tokens, or a share of the prefix) from the
  zero recurrent state and no checkpoint: ``tail_start`` plans a REPLAY at ``L - r`` (a
  screenshot straddling the cut is replayed whole), ``Engine.replay_cut`` keeps the
  attention KV before it, the r rows and the suffix are prefilled.  A budget reaching
  position 0 is a CLEAR start (a full prefill, exact).

Seconds to the first token: from planning to the first token chosen, the vision encoder
excluded (``Execution.encode_s``: the screenshots' embeddings are cached before, as the
runtime's ``prefill_s`` excludes it).  Each arm runs ``repeats`` times, the arms in one order
on even repeats and the reverse on odd ones; a ratio to ``full`` is taken within a repeat
and the median of those is reported, so a drift in the machine's load weighs on both sides
alike.  Next-token KL and top-1 of each arm's first-token distribution are taken against
``full``'s (deterministic: every repeat of an arm must give the same logits, checked).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from cachepolicy.base import CachePolicy
from cachepolicy.engine import Engine
from cachepolicy.executor import kl_divergence, prefill
from cachepolicy.plan import CacheState, CacheView, NamedCheckpoint, Plan
from cachepolicy.policies.noevict import PROMPT_END
from cachepolicy.segments import SegmentFactory
from cachepolicy.tail import ReplayBudget
from runtime.actions import Screen
from runtime.bench.agent_prefix import AgentPrompt, Case
from runtime.config import AgentConfig

#: the exact arms, before the tail arms
FULL, EXACT = "full", "exact"
#: the paper's budgets and the issue's: tokens, and shares of the matched prefix
DEFAULT_BUDGETS = ("0", "16", "64", "256", "5%", "10%")
#: the anchor the exact arm's checkpoint is published under (noevict's)
ANCHOR = PROMPT_END


def arm_name(budget: ReplayBudget) -> str:
    return f"tail@{budget}"


@attrs.frozen
class Sample:
    """One arm, one repeat."""

    arm: str
    repeat: int
    seconds: float  # planning to the first token, the vision encoder excluded
    prefill_tokens: int
    replay_tokens: int
    start: str  # the plan's start kind
    approximate: bool
    first_token: int
    logits_sha: str


class PrefixArms:
    """The arms' policies for one engine and agent configuration."""

    def __init__(self, factory: SegmentFactory, config: AgentConfig, screen: Screen,
                 budgets: Sequence[ReplayBudget]) -> None:
        self.exact: CachePolicy = config.make_policy(factory, screen, policy="noevict")
        self.tails: dict[str, CachePolicy] = {}
        for b in budgets:
            twin = attrs.evolve(config, replay_budget=str(b), replay_base="zero")
            self.tails[arm_name(b)] = twin.make_policy(factory, screen, policy="noevict-tail")
        self.names = (FULL, EXACT, *self.tails)

    def plan(self, arm: str, case: Case, view: CacheView) -> Plan:
        """What the arm's policy plans for the case's prompt on ``view``."""
        if arm == FULL:
            return self.exact.plan_reusing(case.log, view, case.pieces, reuse=False)
        if arm == EXACT:
            return self.exact.plan_reusing(case.log, view, case.pieces)
        return self.tails[arm].plan_reusing(case.log, view, case.pieces)


@attrs.frozen
class CaseResult:
    """Every sample of one prefix, and what the arms gave."""

    length: int
    prefix_rows: int
    suffix_rows: int
    screenshots: int
    checkpoint_bytes: int  # the exact arm's recurrent checkpoint
    samples: tuple[Sample, ...]
    kl: dict[str, float]
    top1: dict[str, bool]
    bitwise: dict[str, bool]  # the arm's first-token logits are full's, bit for bit
    deterministic: dict[str, bool]  # every repeat of the arm gave the same logits
    #: the probability full's first token has under full's logits (how certain the exact
    #: next token is: a KL reads against it)
    top1_p: float = 0.0

    def of(self, arm: str) -> list[Sample]:
        return sorted((s for s in self.samples if s.arm == arm), key=lambda s: s.repeat)

    def median_s(self, arm: str) -> float:
        return statistics.median(s.seconds for s in self.of(arm))

    def speedup(self, arm: str) -> float:
        """The median over repeats of full's seconds / the arm's, in the same repeat."""
        return statistics.median(f.seconds / a.seconds
                                 for f, a in zip(self.of(FULL), self.of(arm), strict=True))

    def summary(self, arm: str) -> dict[str, Any]:
        s = self.of(arm)[0]
        return {"prefill_tokens": s.prefill_tokens, "replay_tokens": s.replay_tokens,
                "start": s.start, "approximate": s.approximate,
                "seconds": [x.seconds for x in self.of(arm)],
                "seconds_median": self.median_s(arm), "speedup_vs_full": self.speedup(arm),
                "kl": self.kl[arm], "top1_agree": self.top1[arm], "bitwise": self.bitwise[arm],
                "deterministic": self.deterministic[arm],
                "checkpoint_bytes": self.checkpoint_bytes if arm == EXACT else 0,
                "checkpoint_bytes_saved": 0 if arm in (FULL, EXACT) else self.checkpoint_bytes}

    def as_dict(self, arms: Sequence[str]) -> dict[str, Any]:
        return {"length": self.length, "prefix_rows": self.prefix_rows,
                "suffix_rows": self.suffix_rows, "screenshots": self.screenshots,
                "checkpoint_bytes": self.checkpoint_bytes, "top1_p": self.top1_p,
                "arms": {a: self.summary(a) for a in arms}}


def measure_case(engine: Engine, arms: PrefixArms, case: Case, repeats: int, *,
                 seq: int = 0) -> CaseResult:
    """Every arm ``repeats`` times on ``case`` (see the module docstring); ``seq`` is
    cleared after."""
    # the starting state, through the shipping path too: the prefix (a checkpoint at its
    # end, where noevict anchors one), then the detour
    engine.clear(seq)
    empty = CacheView(CacheState(), engine.seq_info(seq))
    setup = arms.exact.plan_reusing(case.log, empty, case.prefix + case.detour, reuse=False,
                                    decode=False, anchors=[(len(case.prefix), ANCHOR)])
    made = prefill(engine, setup, seq)
    (ckpt,) = made.new_checkpoints
    state = engine.checkpoint(seq)  # FULL: the prefix and the detour
    published = {EXACT: CacheState(checkpoints=(NamedCheckpoint(ANCHOR, ckpt.checkpoint),))}
    samples: list[Sample] = []
    logits: dict[str, np.ndarray] = {}
    shas: dict[str, set[str]] = {a: set() for a in arms.names}
    try:
        for r in range(repeats):
            order = arms.names if r % 2 == 0 else tuple(reversed(arms.names))
            for arm in order:
                engine.restore(seq, state)
                t0 = time.perf_counter()
                view = CacheView(published.get(arm, CacheState()), engine.seq_info(seq))
                plan = arms.plan(arm, case, view)
                exe = prefill(engine, plan, seq)
                assert exe.logits is not None
                first = int(np.argmax(exe.logits))  # greedy: the first token
                seconds = time.perf_counter() - t0 - exe.encode_s
                _check_plan(arm, plan, case)
                sha = hashlib.sha256(np.ascontiguousarray(exe.logits).tobytes()).hexdigest()
                shas[arm].add(sha)
                logits.setdefault(arm, np.array(exe.logits, copy=True))
                samples.append(Sample(arm, r, seconds, exe.prefill_tokens, exe.replay_tokens,
                                      plan.start.kind.value, exe.approximate, first, sha))
    finally:
        engine.clear(seq)
    ref = logits[FULL]
    return CaseResult(
        case.length, case.prefix_rows, case.suffix_rows, case.screenshots,
        ckpt.checkpoint.nbytes, tuple(samples),
        kl={a: kl_divergence(ref, x) for a, x in logits.items()},
        top1={a: int(np.argmax(x)) == int(np.argmax(ref)) for a, x in logits.items()},
        bitwise={a: bool(np.array_equal(x, ref)) for a, x in logits.items()},
        deterministic={a: len(s) == 1 for a, s in shas.items()}, top1_p=_top_p(ref))


def _top_p(logits: np.ndarray) -> float:
    """The softmax probability of the most likely token."""
    z = logits.astype(np.float64) - logits.max()
    return float(1.0 / np.exp(z).sum())


def _check_plan(arm: str, plan: Plan, case: Case) -> None:
    """The plan is the one the arm stands for (else the bench would measure something
    else): a tail arm's replay ends at the prefix's end, the true point of divergence."""
    if arm == EXACT and plan.reused_tokens != case.prefix_rows:
        raise AssertionError(f"exact arm reused {plan.reused_tokens} rows, not the prefix's "
                             f"{case.prefix_rows}: its checkpoint was not found")
    if plan.replay is not None and plan.replay.matched != case.prefix_rows:
        raise AssertionError(f"{arm}: the prompt matched {plan.replay.matched} rows, not the "
                             f"prefix's {case.prefix_rows}")


@attrs.frozen
class PrefixReport:
    """One run: every prefix length's result."""

    arms: tuple[str, ...]
    cases: tuple[CaseResult, ...]
    suffix: str
    repeats: int
    context: int  # the engine's context per sequence (the model's training context)
    episode_steps: int  # steps of the episode the prefixes are cut from

    @property
    def ok(self) -> bool:
        """Every arm that did not replay (full, exact, a budget reaching position 0) gave
        full's logits bit for bit, every arm the same logits in every repeat, and every
        arm's tokens add up."""
        return all(all(c.bitwise[a] or c.of(a)[0].start == "replay" for a in self.arms)
                   and all(c.deterministic.values())
                   and all(tokens_add_up(c, a) for a in self.arms) for c in self.cases)

    def as_dict(self) -> dict[str, Any]:
        return {"arms": list(self.arms), "suffix": self.suffix, "repeats": self.repeats,
                "context": self.context, "episode_steps": self.episode_steps, "ok": self.ok,
                "cases": [c.as_dict(self.arms) for c in self.cases]}


def tokens_add_up(c: CaseResult, arm: str) -> bool:
    """The arm prefilled what it stands for: the whole prompt (full, and a tail arm whose
    cut reached position 0), the suffix (exact), or the replayed rows and the suffix."""
    s = c.of(arm)[0]
    whole = c.prefix_rows + c.suffix_rows
    if arm == FULL or s.start == "clear":
        return s.prefill_tokens == whole and s.replay_tokens == 0
    if arm == EXACT:
        return s.prefill_tokens == c.suffix_rows and s.replay_tokens == 0
    return s.prefill_tokens == s.replay_tokens + c.suffix_rows and s.start == "replay"


def run(engine: Engine, factory: SegmentFactory, prompt: AgentPrompt, cases: Sequence[Case],
        budgets: Sequence[ReplayBudget], *, config: AgentConfig, screen: Screen,
        suffix: str, repeats: int,
        progress: Callable[[CaseResult, PrefixArms], None] = lambda *_: None) -> PrefixReport:
    """Every case, one after another, each with every arm side by side."""
    arms = PrefixArms(factory, config, screen, budgets)
    out = []
    for c in cases:
        res = measure_case(engine, arms, c, repeats)
        progress(res, arms)
        out.append(res)
    return PrefixReport(arms.names, tuple(out), suffix, repeats, engine.config.n_ctx_per_seq,
                        prompt.steps)
