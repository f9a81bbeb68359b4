"""The critical path's fixed costs, measured side by side in one process (``kvagent
bench-encode``):

* the vision encoder's seconds per screenshot with flash attention off and on (two engines
  on the same files, ``EngineConfig.encoder_flash_attn``), alternated ABBA, each through
  ``Engine.encode_image`` past the cache; whether every repeat gave the same bits;
* the LLM's seconds to prefill one encoded screenshot after another one — what a prefetch
  pays per retained screenshot, hence the VM time overlap needs per retained screenshot;
* one overlapped episode (terminal-slot+overlap, a replayed trajectory) with the VM quicker
  than the prefetch, with ``AgentConfig.encode_ahead`` off and on (ABBA): the critical path,
  the wait for the prefetch, and whether the outputs are identical.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs
import numpy as np

from cachepolicy.engine import Engine
from runtime.bench.arms import run_arm
from runtime.bench.order import abba
from runtime.bench.trajectory import screenshot, trajectory
from runtime.config import AgentConfig

#: the encoder variants compared, in the order of the first repeat
VARIANTS = ("flash_off", "flash_on")
ARM = "terminal-slot+overlap"


@attrs.frozen
class EncodeTiming:
    """One screenshot size: encoder seconds per variant, prefill seconds (flash on)."""

    width: int
    height: int
    tokens: int
    encode_s: dict[str, list[float]]
    deterministic: dict[str, bool]  # every repeat bitwise the first, per variant
    max_abs_diff_off_on: float  # the two kernels' embeddings differ by this much
    prefill_s: list[float]  # one screenshot prefilled after another

    def median(self, variant: str) -> float:
        return statistics.median(self.encode_s[variant])

    def as_dict(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d.update({f"encode_s_median_{v}": self.median(v) for v in VARIANTS})
        d["speedup"] = self.median(VARIANTS[0]) / self.median(VARIANTS[1])
        d["prefill_s_median"] = statistics.median(self.prefill_s)
        return d


def time_encoders(engines: Sequence[Engine], size: tuple[int, int],
                  repeats: int) -> EncodeTiming:
    """``engines``: flash attention off, on (same model and projector)."""
    w, h = size
    png = screenshot(1, w, h)
    seconds: list[list[float]] = [[], []]
    first: list[np.ndarray | None] = [None, None]
    same = [True, True]
    for _, v in abba(repeats):
        t = time.perf_counter()
        rows = engines[v].encode_image(png, use_cache=False).embeddings
        seconds[v].append(time.perf_counter() - t)
        ref = first[v]
        if ref is None:
            first[v] = rows
        elif not np.array_equal(ref, rows):
            same[v] = False
    off, on = first
    assert off is not None and on is not None
    diff = float(np.max(np.abs(off.astype(np.float64) - on.astype(np.float64))))
    return EncodeTiming(w, h, int(on.shape[0]), dict(zip(VARIANTS, seconds, strict=True)),
                        dict(zip(VARIANTS, same, strict=True)), diff,
                        prefill_seconds(engines[1], png, repeats))


def prefill_seconds(engine: Engine, png: bytes, repeats: int) -> list[float]:
    """Seconds to prefill ``png``'s embedding after a caption and one screenshot already in
    the sequence (a retained screenshot's place in a prefetch), ``repeats`` times."""
    img = engine.encode_image(png)
    caption = engine.tokenize("Screenshot 0:")
    out = []
    for _ in range(repeats):
        engine.clear(0)
        engine.prefill_tokens(0, caption, logits=False)
        engine.prefill_image(0, img)
        engine.prefill_tokens(0, caption, logits=False)
        t = time.perf_counter()
        engine.prefill_image(0, img)
        out.append(time.perf_counter() - t)
    engine.clear(0)
    return out


@attrs.frozen
class AheadRun:
    """One overlapped episode with encode_ahead off or on."""

    encode_ahead: bool
    steps: tuple[dict[str, Any], ...]
    output_sha256: str

    def mean(self, key: str, first: int) -> float:
        values = [s[key] for s in self.steps[first:]] or [s[key] for s in self.steps]
        return sum(values) / len(values)


def encode_ahead_runs(engine: Engine, agent: AgentConfig, size: tuple[int, int], *,
                      steps: int, vm_seconds: float, repeats: int,
                      progress: Callable[[str], None] = lambda _: None) -> list[AheadRun]:
    """``repeats`` pairs of terminal-slot+overlap episodes (ABBA), encode_ahead off / on."""
    traj = trajectory(steps, *size)
    out = []
    for r, v in abba(repeats):
        ahead = bool(v)
        config = attrs.evolve(agent, encode_ahead=ahead)
        res = anyio.run(lambda: run_arm(engine, ARM, traj, config, vm_seconds=vm_seconds))
        assert res.episode is not None, res.refused
        run = AheadRun(ahead, res.steps, res.output_sha256 or "")
        progress(f"[encode_ahead {'on' if ahead else 'off'}, repeat {r + 1}] critical path "
                 f"{run.mean('critical_path_s', agent.window):.3f} s, waited "
                 f"{run.mean('prefetch_wait_s', agent.window):.3f} s for the prefetch")
        out.append(run)
    return out


def ahead_summary(runs: Sequence[AheadRun], window: int) -> dict[str, Any]:
    """Means over the steps after the window filled, per setting, and their ratio."""
    keys = ("critical_path_s", "prefetch_wait_s", "encode_s", "encode_ahead_s", "prefetch_s")
    per: dict[str, dict[str, float]] = {}
    for ahead in (False, True):
        mine = [r for r in runs if r.encode_ahead is ahead]
        per["on" if ahead else "off"] = {
            k: statistics.mean(r.mean(k, window) for r in mine) for k in keys}
    return {"off": per["off"], "on": per["on"],
            "critical_path_ratio_on_off": (per["on"]["critical_path_s"]
                                           / per["off"]["critical_path_s"]),
            "outputs_identical": len({r.output_sha256 for r in runs}) == 1}
