"""Measure an engine's row classes (``row_classes.RowClasses``), and cache them by the model
file's identity and the CPU.

Teacher-forced, so nothing depends on sampling: a probe prompt is prefilled into a scratch
sequence and copied into the lanes, then fixed tokens are fed in the shapes to compare and
every row's logits are compared bitwise:

* lane calls of R = 1..n lanes (lane i feeds its own tokens), 4 calls each: R and R' are in
  one class when every lane both have computed the same bits at every step;
* runs: the feed (``MAX_RUN_ROWS`` tokens) two tokens per call is the reference; a run of k
  tokens is in its class when its k rows equal the reference's first k; a one-token call
  alone is in it when every one-token row equals the reference's.

Many rows per comparison, because two kernels that sum in another order still agree on
some rows (measured: a K-quant run of 3 matched a one-token call on 2 of 3 rows).  The cache
(``<kvagent cache>/row-classes/<key>.json``) is keyed by the model file's identity, the
kernels (repacked or not), the lanes measured, the probe's version, llama-cpp-python's
version and the CPU's model name and flags; a file that does not parse is measured again.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import structlog

from cachepolicy.engine.cache_dir import cache_root
from cachepolicy.engine.row_classes import MAX_RUN_ROWS, RowClasses

log = structlog.get_logger("kvagent.engine")

#: Bump when the probe changes what it measures (old cache entries are then ignored).
PROBE_VERSION = 1
PROBE_TEXT = ("The agent looks at the screen, clicks the terminal icon at (412, 388), types "
              "'ls -la /home/user/Documents' and presses enter; then it waits for the output.")
LANE_STEPS = 4


class ProbeDecoder(Protocol):
    """What the probe needs of the engine's decoder."""

    def prefill_tokens(self, seq: int, tokens: Sequence[int], *, logits: bool = True,
                       allow_single: bool = False, all_logits: bool = False,
                       ) -> np.ndarray | None: ...

    def copy_to_lane(self, seq: int, lane: int) -> int: ...

    def clear_lane(self, lane: int) -> None: ...

    def run_lanes(self, rows: Sequence[tuple[int, int | None, int]],
                  ) -> tuple[list[np.ndarray | None], float]: ...

    def run_tokens(self, lane: int, tokens: Sequence[int], pos0: int,
                   ) -> tuple[list[np.ndarray], float]: ...


def measure(decoder: ProbeDecoder, *, scratch: int, clear: Callable[[int], None],
            lanes: Sequence[int], prompt: Sequence[int], feed: Sequence[int]) -> RowClasses:
    """The row classes of lane calls over 1..len(lanes) lanes and of runs of 2..len(feed)
    tokens.  ``scratch`` is an empty sequence, emptied again with ``clear``; the lanes are
    left empty."""
    if len(feed) < max(LANE_STEPS + 3 * len(lanes), 4):
        raise ValueError("the probe feed is too short")
    decoder.prefill_tokens(scratch, prompt, logits=False)
    try:
        lane_rows = {r: _lane_calls(decoder, scratch, lanes[:r], feed)
                     for r in range(1, len(lanes) + 1)}
        reference = _runs(decoder, scratch, lanes[0], feed, [2] * (len(feed) // 2))
        runs = [k for k in range(2, len(feed) + 1)
                if _same(_runs(decoder, scratch, lanes[0], feed[:k], [k]), reference[:k])]
        single = _same(_runs(decoder, scratch, lanes[0], feed, [1] * len(feed)), reference)
    finally:
        clear(scratch)
        for lane in lanes:
            decoder.clear_lane(lane)
    classes: list[list[int]] = []
    for r in sorted(lane_rows):
        home = next((c for c in classes if _lanes_agree(lane_rows[c[0]], lane_rows[r])), None)
        if home is None:
            classes.append([r])
        else:
            home.append(r)
    return RowClasses(lanes=classes, runs=runs, single_run=single)


def _lane_calls(decoder: ProbeDecoder, scratch: int, lanes: Sequence[int],
                feed: Sequence[int]) -> list[list[np.ndarray]]:
    """Per lane, its rows over ``LANE_STEPS`` calls of ``len(lanes)`` rows (lane i feeds
    the feed from offset 3i: other tokens in every row)."""
    pos = [decoder.copy_to_lane(scratch, lane) for lane in lanes]
    out: list[list[np.ndarray]] = [[] for _ in lanes]
    for step in range(LANE_STEPS):
        rows = [(lane, int(feed[step + 3 * i]), pos[i] + step) for i, lane in enumerate(lanes)]
        logits, _ = decoder.run_lanes(rows)
        for i, row in enumerate(logits):
            assert row is not None
            out[i].append(row)
    for lane in lanes:
        decoder.clear_lane(lane)
    return out


def _runs(decoder: ProbeDecoder, scratch: int, lane: int, feed: Sequence[int],
          sizes: Sequence[int]) -> list[np.ndarray]:
    """The feed's rows on a fresh copy of the prompt, in calls of ``sizes`` tokens."""
    pos = decoder.copy_to_lane(scratch, lane)
    out: list[np.ndarray] = []
    start = 0
    for size in sizes:
        rows, _ = decoder.run_tokens(lane, [int(t) for t in feed[start:start + size]],
                                     pos + start)
        out += rows
        start += size
    decoder.clear_lane(lane)
    return out


def _same(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _lanes_agree(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    """Every lane both calls had computed the same rows."""
    return all(_same(x, y) for x, y in zip(a, b))


def probe_tokens(tokenize: object) -> tuple[list[int], list[int]]:
    """The probe's prompt and feed (``MAX_RUN_ROWS`` tokens), from the model's tokenizer."""
    toks = list(tokenize(PROBE_TEXT))  # type: ignore[operator]
    while len(toks) < 48 + MAX_RUN_ROWS:
        toks += toks
    return toks[:48], toks[48:48 + MAX_RUN_ROWS]


# ---------------------------------------------------------------------- the cache

def cpu_signature() -> str:
    """The CPU as far as kernels care: its model name and feature flags."""
    name, flags = platform.machine(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = " ".join(sorted(value.split()))
    except OSError:
        pass
    return f"{name}|{hashlib.blake2b(flags.encode(), digest_size=8).hexdigest()}"


def cache_key(model_id: str, *, fast_kernels: bool, lanes: int) -> str:
    import llama_cpp

    raw = json.dumps([PROBE_VERSION, model_id, fast_kernels, lanes, MAX_RUN_ROWS,
                      llama_cpp.__version__, cpu_signature()])
    return hashlib.blake2b(raw.encode(), digest_size=12).hexdigest()


def cache_dir() -> Path:
    return cache_root() / "row-classes"


def load(key: str) -> RowClasses | None:
    path = cache_dir() / f"{key}.json"
    try:
        return RowClasses.from_dict(json.loads(path.read_text())["classes"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("row_classes_cache_unreadable", path=str(path), reason=str(exc))
        return None


def store(key: str, classes: RowClasses, *, model: str) -> None:
    """Write atomically (a temp file renamed into place); failures are only logged."""
    folder = cache_dir()
    body = json.dumps({"classes": classes.as_dict(), "model": model, "cpu": cpu_signature(),
                       "probe_version": PROBE_VERSION}, indent=1)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}-", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, folder / f"{key}.json")
    except OSError as exc:
        log.warning("row_classes_cache_unwritable", path=str(folder), reason=str(exc))
