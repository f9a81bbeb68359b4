"""Write a cache policy of your own and run it through the bench runner.

``pinned-first`` shows the *first* screenshot (the task's starting screen) for the whole
episode, plus the last K-1 screenshots:

    [head][first screenshot][action history...][last K-1 screenshots][generation prompt]

The first screenshot sits in the stable prefix, so it is never prefilled again; like
terminal-slot, a checkpoint at the start of the recent-screenshot region lets each step
prefill only the newest action and the window.  ``pinned-first-scratch`` shows the very same
pieces re-prefilled from scratch every step: the exactness reference.  Both are run on the
bench trajectory with a forged tiny model (random weights) and compared token for token.
(The built-in ``--pin-first 1`` keeps the first screenshot in the *window* instead, after the
history, as the terminal policies lay a window out: exact policies then re-prefill it every
step, and kamera reuses its rows.)

    python examples/custom_policy.py     # ~10 s on 2 cores
"""

from __future__ import annotations

import attrs

from cachepolicy.base import CachePolicy
from cachepolicy.engine.checkpoint import ModelKind
from cachepolicy.context_log import ContextLog, Segment
from cachepolicy.engine import EngineConfig
from cachepolicy.pieces import Piece, image_piece, merge_text, text_piece
from cachepolicy.plan import CacheView, Plan, PolicyManifest
from cachepolicy.policies import register
from runtime.bench.agent_defaults import bench_agent_defaults
from runtime.bench.arms import run_arms
from runtime.bench.trajectory import trajectory
from runtime.engine_setup import load_engine, resolve_model
from runtime.logs import configure_logging


def pinned_first_pieces(policy: CachePolicy,
                        log: ContextLog) -> tuple[tuple[Piece, ...], int]:
    """The layout above; returns (pieces, index where the recent-screenshot region starts)."""
    def shot(s: Segment) -> list[Piece]:
        return [text_piece(f"{s.key}:intro", s.intro, (s.key,)), image_piece(s),
                text_piece(f"{s.key}:outro", s.outro, (s.key,))]

    head = tuple(t for s in log.head for t in s.tokens)
    raw = [text_piece("head", head, tuple(s.key for s in log.head))]
    shots = log.screenshots
    if shots:  # the pinned first screenshot, then the append-only action history
        raw += shot(shots[0])
    raw += [text_piece(a.key, a.tokens, (a.key,)) for a in log.actions]
    region = len(raw)
    recent = shots[1:][-(policy.window - 1):] if policy.window > 1 else ()
    for s in recent:
        raw += shot(s)
    raw.append(text_piece("gen", policy.kit.generation_prompt))
    # Keep every piece up to the region start separate, so last step's checkpoint digest is
    # a prefix of this step's prompt (merge_text would otherwise fuse the history's text).
    return merge_text(raw, keep_before=frozenset(range(1, region + 1))), region


@register
class PinnedFirstPolicy(CachePolicy):
    name = "pinned-first"
    manifest = PolicyManifest(
        changes="the sequence after the recent-screenshot checkpoint; the checkpoint advances",
        evidence="digests of the sequence's runs and of the published checkpoint",
        adds_work="one checkpoint per step (recurrent state on hybrids)",
        omitted_recoverable=True, quality="exact", bounded=True,
        supports=frozenset(ModelKind))

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        pieces, region = pinned_first_pieces(self, log)
        return self.plan_reusing(log, view, pieces, anchors=[(region, "region")])


@register
class PinnedFirstScratchPolicy(PinnedFirstPolicy):
    name = "pinned-first-scratch"

    def select(self, log: ContextLog, view: CacheView, *,
               new: frozenset[str] = frozenset()) -> Plan:
        pieces, _ = pinned_first_pieces(self, log)
        return self.plan_reusing(log, view, pieces, reuse=False)


def main() -> None:
    configure_logging("warning")
    files = resolve_model(None, None)  # the default model
    print(f"model: {files.model}")
    config = EngineConfig(n_ctx_per_seq=4096, n_seq_max=2, n_threads=2)
    agent = attrs.evolve(bench_agent_defaults(), decode_tokens=8)  # fixed decode, greedy
    with load_engine(files, config) as engine:
        arms = ("pinned-first-scratch", "pinned-first")
        runs = dict(zip(arms, run_arms(engine, arms, trajectory(8, 320, 240), agent)))
    for name, res in runs.items():
        prefill = [s["prefill_tokens"] for s in res.steps]
        print(f"{name:>21}: prefill tokens per step {prefill}")
    same = runs["pinned-first"].output_sha256 == runs["pinned-first-scratch"].output_sha256
    print(f"outputs identical token for token: {'yes' if same else 'NO'}")
    if not same:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
