"""The scheduler's one-line state summary, for progress output, logs and tests."""

from __future__ import annotations

from scheduler.ledger import LedgerSnapshot
from scheduler.sizes import format_bytes


def summary_line(running: int, waiting: int, checkpoints: int, snap: LedgerSnapshot) -> str:
    """``episodes: 3 running, 1 waiting | budget: 1.2 GiB of 2.0 GiB, peak 1.9 GiB |
    checkpoints: 7``"""
    return (f"episodes: {running} running, {waiting} waiting | budget: "
            f"{format_bytes(snap.held + snap.reserved)} of {format_bytes(snap.budget)}, peak "
            f"{format_bytes(snap.peak)} | checkpoints: {checkpoints}")
