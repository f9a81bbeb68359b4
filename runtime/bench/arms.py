"""Run one bench arm: a cache policy replaying the bench trajectory on one engine sequence.

Teacher forcing: every arm appends the same action texts, whatever it decoded, so all arms
see the same content and their outputs are comparable step by step.
"""

from __future__ import annotations

import hashlib
import resource
import time
from collections.abc import Callable, Sequence

import attrs

from cachepolicy.base import make_policy
from cachepolicy.engine import Engine
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.segments import SegmentFactory, model_info
from runtime.bench.trajectory import BenchStep
from scheduler.ledger import MemoryLedger
from scheduler.records import StepRecord
from scheduler.transaction import EpisodeCache, StepOptions, run_step

SYSTEM = "You are a GUI agent. Look at the screenshots and reply with the next action."
INSTRUCTION = "Save the quarterly report and close the editor."


@attrs.frozen
class ArmResult:
    arm: str
    policy: str
    overlap: bool
    refused: str | None
    steps: tuple[dict[str, object], ...]
    wall_s: float
    ledger_peak_bytes: int

    @property
    def output_sha256(self) -> str | None:
        if self.refused:
            return None
        h = hashlib.sha256()
        for s in self.steps:
            for tok in s["output_tokens"]:  # type: ignore[attr-defined]
                h.update(int(tok).to_bytes(4, "little"))
        return h.hexdigest()


def rss_bytes() -> int:
    """The process's current resident set size (peak so far where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_segments(factory: SegmentFactory, traj: Sequence[BenchStep], i: int) -> tuple:
    segs: tuple = ()
    if i == 0:
        segs = (factory.preamble(SYSTEM), factory.instruction(INSTRUCTION))
    else:
        segs = (factory.action(i - 1, traj[i - 1].action),)
    return segs + (factory.screenshot(i, traj[i].png),)


def run_arm(engine: Engine, factory: SegmentFactory, policy_name: str,
            traj: Sequence[BenchStep], *, window: int, decode_tokens: int,
            seq: int = 0, scratch_seq: int | None = None, budget_bytes: int = 1 << 40,
            vm_seconds: float = 0.0,
            on_step: Callable[[StepRecord], None] | None = None) -> ArmResult:
    """Replay ``traj`` through ``policy_name``; each step is one transaction."""
    try:
        policy = make_policy(policy_name, model_info(engine), factory.kit, window=window,
                             decode_tokens=decode_tokens)
    except PolicyRefusedError as exc:
        return ArmResult(policy_name, policy_name, False, str(exc), (), 0.0, 0)
    engine.clear(seq)
    episode = EpisodeCache(f"bench-{policy_name}", seq, policy)
    ledger = MemoryLedger(budget_bytes)
    options = StepOptions(decode_tokens=decode_tokens, scratch_seq=scratch_seq)
    steps = []
    t_arm = time.perf_counter()
    for i in range(len(traj)):
        t0 = time.perf_counter()
        record = run_step(engine, episode, step_segments(factory, traj, i), ledger, options)
        critical = time.perf_counter() - t0  # screenshot in hand → action ready
        ledger.check_integrity()
        if vm_seconds > 0 and i < len(traj) - 1:  # the VM executes the action
            time.sleep(vm_seconds)
        row = record.as_dict()
        row.update(rss_bytes=rss_bytes(), vm_s=vm_seconds if i < len(traj) - 1 else 0.0,
                   step_wall_s=time.perf_counter() - t0, critical_path_s=critical)
        steps.append(row)
        if on_step is not None:
            on_step(record)
    wall_arm = time.perf_counter() - t_arm
    peak = ledger.snapshot().peak
    ledger.drop(episode.episode_id)
    engine.clear(seq)
    return ArmResult(policy_name, policy_name, False, None, tuple(steps), wall_arm, peak)
