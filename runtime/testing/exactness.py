"""The exactness oracle as assertions: a policy's outputs against its exact reference's, and
an engine's edits against one uninterrupted prefill.

* ``assert_same_outputs`` — two runs decoded the same tokens at every step (what
  ``kvagent bench`` compares as ``output_sha256``), said with the first step that differs;
* ``assert_exact`` — replays the bench trajectory through a policy and its reference on one
  engine (the loop that ships; a fixed number of tokens, sampled) and asserts the above;
* ``assert_engine_exact`` — ``kvagent check-exact``'s checks (``cachepolicy.oracle``) on an
  engine: every logits comparison bitwise.

A run with no steps, a refused policy or a failed step never passes: a comparison of
nothing checks nothing.  Nor do outputs that are one token repeated: greedy decoding on a
forged model (random weights) picks the same token whatever the prompt — evict and
terminal-scratch, whose prompts differ, "agree" — so ``assert_exact`` samples
(``SAMPLED_DECODE``: temperature 1, a fixed seed): each token is drawn from the whole
distribution, and the same logits give the same draw.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from cachepolicy.oracle.checks import run_checks
from runtime.bench.arms import ArmResult, run_arm
from runtime.bench.trajectory import trajectory
from runtime.config import AgentConfig
from runtime.bench.agent_defaults import bench_agent_defaults
from runtime.metrics import EpisodeResult

if TYPE_CHECKING:
    from cachepolicy.engine import Engine

__all__ = ["FIXED_DECODE", "NotExactError", "SAMPLED_DECODE", "assert_engine_exact", "assert_exact",
           "assert_same_outputs"]

#: What ``kvagent bench`` decodes (``bench_agent_defaults``): a fixed number of greedy tokens
#: a step, no grammar, no stop at the end of generation, no guess — the same decode work in
#: every arm, so outputs compare.
FIXED_DECODE = bench_agent_defaults()
#: ``FIXED_DECODE`` sampled at temperature 1 with seed 0 (both runs draw from the same seed).
SAMPLED_DECODE = attrs.evolve(FIXED_DECODE, temperature=1.0, seed=0)


class NotExactError(AssertionError):
    """Two runs that must agree bitwise did not (or one of them did not run)."""


def _episode(run: EpisodeResult | ArmResult, name: str) -> EpisodeResult:
    if isinstance(run, ArmResult):
        if run.episode is None:
            raise NotExactError(f"{name} ({run.arm}) did not run: {run.refused}")
        run = run.episode
    if run.status == "error" or not run.steps:
        raise NotExactError(f"{name} has nothing to compare: status {run.status}, "
                            f"{run.n_steps} steps {run.error}".rstrip())
    return run


def assert_same_outputs(got: EpisodeResult | ArmResult,
                        reference: EpisodeResult | ArmResult) -> None:
    """``NotExactError`` unless both runs decoded the same tokens at every step (and ran at
    least one step each, none of them failed)."""
    a, b = _episode(got, "the run"), _episode(reference, "the reference")
    failed = [s.step for s in a.steps + b.steps if s.status == "failed"]
    if failed:
        raise NotExactError(f"failed steps {failed}: nothing to compare there")
    if a.n_steps != b.n_steps:
        raise NotExactError(f"{a.n_steps} steps against the reference's {b.n_steps}")
    tokens = {t for s in b.steps for t in s.output_tokens}
    if not tokens:
        raise NotExactError("no step decoded a token: nothing to compare")
    if len(tokens) == 1 and sum(len(s.output_tokens) for s in b.steps) > 1:
        raise NotExactError(f"the reference decoded token {tokens.pop()} over and over: "
                            f"outputs that do not depend on the prompt compare nothing "
                            f"(sample them: SAMPLED_DECODE)")
    for sa, sb in zip(a.steps, b.steps, strict=True):
        if tuple(sa.output_tokens) != tuple(sb.output_tokens):
            raise NotExactError(f"step {sa.step} differs: {list(sa.output_tokens)} against the "
                                f"reference's {list(sb.output_tokens)}")
    assert a.output_sha256 == b.output_sha256  # internal: same tokens, same hash


async def assert_exact(engine: Engine, policy: str, reference: str, *, steps: int = 6,
                       screen: tuple[int, int] = (128, 96), window: int = 3,
                       agent: AgentConfig = SAMPLED_DECODE,
                       ) -> tuple[ArmResult, ArmResult]:
    """Replay a ``steps``-step bench trajectory of ``screen``-sized screenshots through
    ``policy`` and through ``reference`` (bench arm names: ``"terminal-slot+overlap"`` works)
    on ``engine`` with a ``window``-screenshot window (``agent``'s decode: sampled), and
    assert they decoded the same tokens at every step.  Returns (policy's run, reference's run) for further checks."""
    traj = trajectory(steps, *screen)
    config = attrs.evolve(agent, window=window)
    runs = [await run_arm(engine, arm, traj, config) for arm in (policy, reference)]
    assert_same_outputs(runs[0], runs[1])
    return runs[0], runs[1]


def assert_engine_exact(engine: Engine, *, only: Sequence[str] | None = None) -> None:
    """``kvagent check-exact`` on ``engine`` (blocking; seconds on a tiny model): every check
    (or those named in ``only``) bitwise.  The engine needs two sequences."""
    results = [r for r in run_checks(engine) if only is None or r.name in only]
    if not results:
        raise NotExactError(f"no check named {list(only or ())}")
    failed = [f"{r.name} (max |diff| {r.max_abs_diff}) {r.detail}".rstrip()
              for r in results if not r.bitwise]
    if failed:
        raise NotExactError("not bitwise: " + "; ".join(failed))
