"""``kvagent bench --decode-arms``: terminal-slot with overlap replayed once per decode
variant, side by side — how much of the critical path the decode takes, and whether the
actions stay the same.

The variants (one engine; the decode shape is switched between arms):

* ``lanes-fixed`` — every decode call feeds the 4 lanes, idle ones padded: the engine before
  its decode shapes (a lone generation pays 3 pad rows);
* ``lanes`` — lane calls padded only to the smallest row count of their class;
* ``runs`` — one generation's tokens per call, a lone token paired with a guess (plain
  decoding in the runs shape: no jump-forward, no drafts);
* ``runs+drafts`` — the same with jump-forward and prompt-lookup drafts;
* ``runs+drafts+guess`` — and the unchanged-screenshot guess (``--guess`` auto).

``lanes-fixed`` and ``lanes`` compute in one lane class, so their actions are bitwise equal;
so are the three runs variants among themselves.  On models whose one-token calls take
other kernels than runs (a hybrid's per-sequence output projection, attention's one-query
kernel) the two groups may decode other bits: each is exact in itself (``check-exact``).
Rounds alternate the order (forward, then backward); each variant's numbers are medians over
its rounds; the decode share is the decode's seconds over the critical path's, steps after
the first (which prefills the system prompt).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cachepolicy.engine import Engine
from cachepolicy.engine.drafts import PLAIN, Drafting
from cachepolicy.engine.row_classes import DecodeMode, DecodeShape
from runtime.arg_parsers import parse_names
from runtime.bench.arms import ArmResult, run_arm
from runtime.config import AgentConfig
from runtime.run.agents import EpisodeEvent
from vmenv.trajectory import Trajectory

ARM = "terminal-slot+overlap"
#: the lanes before decode shapes: every call fed this many rows
FIXED_LANES = 4


@attrs.frozen
class DecodeVariant:
    name: str
    runs: bool | None  # the engine's shape: lanes (False), runs (True); None: fixed lanes
    drafting: Drafting
    guess: str  # AgentConfig.guess


VARIANTS = {
    "lanes-fixed": DecodeVariant("lanes-fixed", None, PLAIN, "off"),
    "lanes": DecodeVariant("lanes", False, PLAIN, "off"),
    "runs": DecodeVariant("runs", True, PLAIN, "off"),
    "runs+drafts": DecodeVariant("runs+drafts", True, Drafting(), "off"),
    "runs+drafts+guess": DecodeVariant("runs+drafts+guess", True, Drafting(), "auto"),
}
DEFAULT = tuple(VARIANTS)


def parse_variants(text: str) -> tuple[str, ...]:
    return parse_names(text, VARIANTS, option="--decode-arms", what="variant(s)")


def shape_of(engine: Engine, variant: DecodeVariant) -> DecodeShape:
    if variant.runs is None:
        lanes = min(FIXED_LANES, len(engine.decode_lanes()))
        return DecodeShape(DecodeMode.LANES, lanes, (lanes,), why="every call feeds all lanes")
    return engine.shape_for(variant.runs)


@attrs.frozen
class VariantRun:
    variant: str
    round: int
    arm: ArmResult
    decode: dict[str, float]  # the engine's decode counters over the arm


def run_variants(engine: Engine, traj: Trajectory, agent: AgentConfig, names: Sequence[str],
                 *, rounds: int, vm_seconds: float,
                 on_event: Callable[[str, EpisodeEvent], None] | None = None,
                 ) -> list[VariantRun]:
    """Every variant once per round (forward, then backward order), on one engine."""
    import anyio

    async def main() -> list[VariantRun]:
        out = []
        own = engine.decode_shape
        try:
            for rnd in range(rounds):
                for name in (names if rnd % 2 == 0 else tuple(reversed(names))):
                    v = VARIANTS[name]
                    engine.set_decode_shape(shape_of(engine, v))
                    cfg = attrs.evolve(agent, jump_forward=v.drafting.jump_forward,
                                       drafts=v.drafting.lookup, guess=v.guess)

                    def event(e: EpisodeEvent, label: str = f"{name} r{rnd}") -> None:
                        if on_event is not None:
                            on_event(label, e)

                    before = engine.decode_stats()
                    arm = await run_arm(engine, ARM, traj, cfg, vm_seconds=vm_seconds,
                                        on_event=event)
                    out.append(VariantRun(name, rnd, arm,
                                          (engine.decode_stats() - before).as_dict()))
        finally:
            engine.set_decode_shape(own)
        return out

    return anyio.run(main)


def summarize(runs: Sequence[VariantRun]) -> dict[str, dict[str, Any]]:
    """Per variant: medians over rounds of the decode share, critical path and decode
    seconds per step (steps after the first), the output hashes, guess hits and drafts."""
    by: dict[str, list[VariantRun]] = {}
    for r in runs:
        by.setdefault(r.variant, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name, rs in by.items():
        shares, crit, dec = [], [], []
        for r in rs:
            steps = r.arm.episode.steps[1:] if r.arm.episode else ()
            c = sum(s.critical_path_s for s in steps)
            d = sum(s.decode_s for s in steps)
            shares.append(d / c if c else 0.0)
            crit.append(c / max(1, len(steps)))
            dec.append(d / max(1, len(steps)))
        steps = rs[0].arm.episode.steps if rs[0].arm.episode else ()
        out[name] = {
            "decode_share": statistics.median(shares), "critical_path_s": statistics.median(crit),
            "decode_s": statistics.median(dec),
            "output_sha256": sorted({r.arm.output_sha256 or "" for r in rs}),
            "guess_hits": sum(s.guess == "hit" for s in steps),
            "guess_misses": sum(s.guess == "miss" for s in steps),
            "decode_calls": rs[0].decode["calls"], "decode_tokens": rs[0].decode["tokens"],
            "drafted": rs[0].decode["drafted"], "accepted": rs[0].decode["accepted"],
            "pad_rows": rs[0].decode["pad_rows"],
            "rounds": len(rs)}
    return out


def table(summary: dict[str, dict[str, Any]], baseline: str = "lanes-fixed") -> str:
    """The variants side by side, the decode share against ``baseline``'s."""
    base = summary.get(baseline, {}).get("decode_share")
    lines = ["| variant | decode share of the critical path | vs " + baseline + " | decode s / "
             "step | critical path s / step | decode calls | drafts confirmed | pad rows | "
             "guess hits / misses | `output_sha256` |", "|" + "---|" * 10]
    for name, s in summary.items():
        rel = f"{s['decode_share'] / base:.2f}" if base else "-"
        drafts = f"{s['accepted']}/{s['drafted']}" if s["drafted"] else "-"
        hashes = ", ".join(f"`{h[:12]}…`" for h in s["output_sha256"])
        lines.append(f"| {name} | {s['decode_share']:.3f} | {rel} | {s['decode_s']:.3f} | "
                     f"{s['critical_path_s']:.3f} | {s['decode_calls']} | {drafts} | "
                     f"{s['pad_rows']} | {s['guess_hits']} / {s['guess_misses']} | {hashes} |")
    return "\n".join(lines)
