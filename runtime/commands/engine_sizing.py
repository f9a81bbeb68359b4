"""Sizing the engine of a command before it loads: every size that reaches llama.cpp or
memory is checked first, with a message naming what to change.

``EngineConfig`` bounds each field (threads, batch, sequences, context per sequence);
``check_memory`` refuses a context whose KV cache and attention workspace would not fit in
the memory available now (``cachepolicy.engine.sizing``'s estimate from the GGUF metadata) —
a context sized from a long step limit is then an error message, not an OOM kill.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cachepolicy.engine import EngineConfig
from cachepolicy.engine.records import MAX_DECODE_ROWS
from cachepolicy.engine.sizing import context_cost
from scheduler.sizes import UNLIMITED_BYTES, format_bytes


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (``UNLIMITED_BYTES`` where it cannot be read)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return UNLIMITED_BYTES


def check_memory(model: Path, config: EngineConfig, *, what: str,
                 available: int | None = None) -> None:
    """ValueError if llama.cpp's allocation for ``config`` would exceed the memory available
    (``what`` names the options that sized it, for the message)."""
    cost = context_cost(model, config)
    avail = available_memory() if available is None else available
    if cost is not None and cost.total_bytes > avail:
        raise ValueError(
            f"{what} size the context to {config.n_seq_max} sequence(s) x "
            f"{config.n_ctx_per_seq} tokens: llama.cpp would allocate about "
            f"{format_bytes(cost.total_bytes)} (KV cache {format_bytes(cost.kv_bytes)}, "
            f"attention workspace {format_bytes(cost.workspace_bytes)}), more than the "
            f"{format_bytes(avail)} available")


def add_decode_rows_argument(p: Any) -> None:
    """``--decode-rows``: the engine's decode lanes (``EngineConfig.decode_rows``)."""
    p.add_argument("--decode-rows", type=int, default=None,
                   help=f"decode lanes, 1..{MAX_DECODE_ROWS}: every decode call feeds this "
                        "many rows, so up "
                        "to this many concurrent generations share a call and each pays "
                        "for all of them (default 4; mixture-of-experts models at most 7; "
                        "see docs/benchmarks.md section 4)")


def check_decode_rows(rows: int | None) -> str | None:
    if rows is not None and not 1 <= rows <= MAX_DECODE_ROWS:
        return f"--decode-rows must be 1..{MAX_DECODE_ROWS}, got {rows}"
    return None


def engine_config(model: Path, *, what: str, **fields: Any) -> EngineConfig:
    """An ``EngineConfig`` that passes its bounds and ``check_memory``; ValueError (with
    ``what`` in the message) otherwise."""
    try:
        config = EngineConfig(**fields)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    check_memory(model, config, what=what)
    return config

