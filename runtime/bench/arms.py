"""Run one bench arm: a cache policy replaying the bench trajectory on one engine sequence.

Teacher forcing: every arm appends the same action texts, whatever it decoded, so all arms
see the same content and their outputs are comparable step by step.
"""

from __future__ import annotations

import hashlib
import resource
import threading
import time
from collections.abc import Callable, Sequence

import attrs

from cachepolicy.base import make_policy
from cachepolicy.context_log import Segment
from cachepolicy.engine import Engine
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.segments import SegmentFactory, model_info
from runtime.bench.trajectory import BenchStep
from scheduler.ledger import MemoryLedger
from scheduler.records import StepRecord
from scheduler.transaction import (
    EpisodeCache, PrefetchRecord, StepOptions, run_prefetch, run_step,
)

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
        return rss_peak_bytes()


def rss_peak_bytes() -> int:
    """The process's resident-set high-water mark (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def step_segments(factory: SegmentFactory, traj: Sequence[BenchStep], i: int) -> tuple:
    segs: tuple = ()
    if i == 0:
        segs = (factory.preamble(SYSTEM), factory.instruction(INSTRUCTION))
    else:
        segs = (factory.action(i - 1, traj[i - 1].action),)
    return segs + (factory.screenshot(i, traj[i].png),)


OVERLAP_SUFFIX = "+overlap"


def split_arm(arm: str) -> tuple[str, bool]:
    """``terminal-slot+overlap`` → (``terminal-slot``, True)."""
    if arm.endswith(OVERLAP_SUFFIX):
        return arm[: -len(OVERLAP_SUFFIX)], True
    return arm, False


def run_arm(engine: Engine, factory: SegmentFactory, arm: str,
            traj: Sequence[BenchStep], *, window: int, decode_tokens: int,
            seq: int = 0, scratch_seq: int | None = None, budget_bytes: int = 1 << 40,
            vm_seconds: float = 0.0,
            on_step: Callable[[StepRecord], None] | None = None) -> ArmResult:
    """Replay ``traj`` through the arm's policy; each step is one transaction.

    Overlap arms (``<policy>+overlap``): after each action, a prefetch transaction (the action
    text, the retained screenshots) runs in a worker thread while the VM time passes; the
    critical path is then the new screenshot only, plus any prefetch work still running when
    the screenshot arrived.
    """
    policy_name, overlap = split_arm(arm)
    try:
        policy = make_policy(policy_name, model_info(engine), factory.kit, window=window,
                             decode_tokens=decode_tokens)
    except PolicyRefusedError as exc:
        return ArmResult(arm, policy_name, overlap, str(exc), (), 0.0, 0)
    engine.clear(seq)
    episode = EpisodeCache(f"bench-{arm}", seq, policy)
    ledger = MemoryLedger(budget_bytes)
    options = StepOptions(decode_tokens=decode_tokens, scratch_seq=scratch_seq)
    steps = []
    t_arm = time.perf_counter()
    for i in range(len(traj)):
        t_start = time.perf_counter()
        prefetch, waited, vm_s = None, 0.0, 0.0
        if overlap and i > 0:
            action = factory.action(i - 1, traj[i - 1].action)
            prefetch, waited, vm_s = _prefetch_during_vm(engine, episode, action, ledger,
                                                         vm_seconds)
            segments: tuple = (factory.screenshot(i, traj[i].png),)
            t0 = time.perf_counter()
        else:
            t0 = time.perf_counter()
            segments = step_segments(factory, traj, i)
        record = run_step(engine, episode, segments, ledger, options)
        critical = waited + time.perf_counter() - t0  # screenshot in hand → action ready
        ledger.check_integrity()
        if not overlap and vm_seconds > 0 and i < len(traj) - 1:  # the VM executes the action
            time.sleep(vm_seconds)
            vm_s = vm_seconds
        row = record.as_dict()
        if prefetch is not None:
            row.update(prefill_tokens=record.prefill_tokens + prefetch.prefill_tokens,
                       prefill_s=record.prefill_s + prefetch.prefill_s,
                       new_content_tokens=record.new_content_tokens + len(action.tokens),
                       reused_tokens=record.reused_tokens - prefetch.prefill_tokens,
                       prefetch_prefill_tokens=prefetch.prefill_tokens,
                       prefetch_s=prefetch.prefill_s)
        row.update(rss_bytes=rss_bytes(), vm_s=vm_s, step_wall_s=time.perf_counter() - t_start,
                   critical_path_s=critical)
        steps.append(row)
        if on_step is not None:
            on_step(record)
    wall_arm = time.perf_counter() - t_arm
    peak = ledger.snapshot().peak
    ledger.drop(episode.episode_id)
    engine.clear(seq)
    return ArmResult(arm, policy_name, overlap, None, tuple(steps), wall_arm, peak)


def _prefetch_during_vm(engine: Engine, episode: EpisodeCache, action: Segment,
                        ledger: MemoryLedger,
                        vm_seconds: float) -> tuple[PrefetchRecord, float, float]:
    """Run the prefetch in a worker thread while the VM time passes on this one.

    Returns the prefetch record, how long the screenshot waited for the prefetch to finish,
    and the VM seconds.
    """
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["record"] = run_prefetch(engine, episode, (action,), ledger)
        except BaseException as exc:  # handed to the main thread, re-raised there
            box["error"] = exc
        box["done_at"] = time.perf_counter()

    worker = threading.Thread(target=work, name="bench-prefetch")
    t0 = time.perf_counter()
    worker.start()
    time.sleep(vm_seconds)
    arrived = time.perf_counter()
    worker.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    waited = max(0.0, float(box["done_at"]) - arrived)  # type: ignore[arg-type]
    return box["record"], waited, arrived - t0  # type: ignore[return-value]
