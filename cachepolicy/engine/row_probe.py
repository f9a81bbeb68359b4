"""Measure an engine's row classes (``row_classes.RowClasses``), and cache them by the model
file's identity and the CPU.

Teacher-forced, so nothing depends on sampling: a probe prompt is prefilled into a scratch
sequence and copied into the lanes, then fixed tokens are fed in the shapes to compare and
every row's logits are compared bitwise:

* lane calls of R = 1..n lanes (lane i feeds its own tokens), 4 calls each: R and R' are in
  one class when every lane both have computed the same bits at every step;
* runs: each feed (``MAX_RUN_ROWS`` tokens) two tokens per call is the reference; a run of
  k tokens is in its class when its k rows equal the reference's first k on every feed (a
  one-token call is not measured: it is never in the run class, see ``row_classes``).

Many rows of several texts per comparison, because two kernels that sum in another order
still agree on some rows (``PROBE_TEXTS``).  ``check-exact``'s ``decode_runs`` and
``speculative_generation`` compare on other tokens again.  The cache
(``<kvagent cache>/row-classes/<key>.json``) is keyed by the model file's identity, the
kernels (repacked or not), the lanes measured, the probe's version, llama-cpp-python's
version, the CPU's model name and flags and the backend that computes the layers ("CPU", or
the GPU devices and how many layers they hold: ``devices.Offload.cache_key`` — a GPU's
kernels form other classes); a file that does not parse is measured again.
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
PROBE_VERSION = 3
#: Texts of what agents read and write: two kernels that sum in another order may agree on
#: most rows of some texts and differ on others (measured: a K-quant model's one-token calls
#: matched its runs on every row of one text and differed on 2 of 16 of another).
PROBE_TEXTS = (
    "The agent looks at the screen, clicks the terminal icon at (412, 388), types "
    "'ls -la /home/user/Documents' and presses enter; then it waits for the output.",
    " click(120, 340) and then type the word hello into the box",
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", '
    '"coordinate": [512, 77]}}\n</tool_call>',
    "Step 7: press('ctrl+s')\nStep 8: double_click(1033, 9)\nStep 9: scroll(-3)\n",
)
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
            lanes: Sequence[int], prompt: Sequence[int],
            feeds: Sequence[Sequence[int]], max_run: int = MAX_RUN_ROWS) -> RowClasses:
    """The row classes of lane calls over 1..len(lanes) lanes and of runs of 2..``max_run``
    tokens (at most a call's rows: a mixture-of-experts model's prefill cap), each feed (16
    tokens of its own text) compared separately.  ``scratch`` is an empty sequence, emptied
    again with ``clear``; the lanes are left empty."""
    if any(len(f) != MAX_RUN_ROWS for f in feeds) or not feeds:
        raise ValueError(f"probe feeds are {MAX_RUN_ROWS} tokens each")
    if not 2 <= max_run <= MAX_RUN_ROWS:
        raise ValueError(f"runs of 2..{max_run} tokens: max_run must be 2..{MAX_RUN_ROWS}")
    decoder.prefill_tokens(scratch, prompt, logits=False)
    lane_feed = [t for f in feeds for t in f]
    try:
        lane_rows = {r: _lane_calls(decoder, scratch, lanes[:r], lane_feed)
                     for r in range(1, len(lanes) + 1)}
        refs = [_runs(decoder, scratch, lanes[0], f, [2] * (len(f) // 2)) for f in feeds]
        runs = [k for k in range(2, max_run + 1)
                if all(_same(_runs(decoder, scratch, lanes[0], f[:k], [k]), ref[:k])
                       for f, ref in zip(feeds, refs))]
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
    return RowClasses(lanes=classes, runs=runs)


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


def probe_tokens(tokenize: Callable[[str], Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """The probe's prompt and feeds (``MAX_RUN_ROWS`` tokens of each text), from the model's
    tokenizer."""
    def first(text: str, n: int, skip: int = 0) -> list[int]:
        toks = list(tokenize(text))
        while len(toks) < skip + n:
            toks += toks
        return toks[skip:skip + n]

    return (first(PROBE_TEXTS[0], 48),
            [first(t, MAX_RUN_ROWS, 48 if i == 0 else 0) for i, t in enumerate(PROBE_TEXTS)])


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


def cache_key(model_id: str, *, fast_kernels: bool, lanes: int,
              max_run: int = MAX_RUN_ROWS, backend: str = "CPU") -> str:
    """The cache entry's name for these measured facts (``backend``: what computes the
    layers, ``Offload.cache_key``)."""
    import llama_cpp

    raw = json.dumps([PROBE_VERSION, model_id, fast_kernels, lanes, max_run,
                      llama_cpp.__version__, cpu_signature(), backend])
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


def store(key: str, classes: RowClasses, *, model: str, backend: str = "CPU") -> None:
    """Write atomically (a temp file renamed into place); failures are only logged."""
    folder = cache_dir()
    body = json.dumps({"classes": classes.as_dict(), "model": model, "cpu": cpu_signature(),
                       "backend": backend, "probe_version": PROBE_VERSION}, indent=1)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}-", dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, folder / f"{key}.json")
    except OSError as exc:
        log.warning("row_classes_cache_unwritable", path=str(folder), reason=str(exc))
