"""The scheduler's one-line state summary, for progress output, logs and tests."""

from __future__ import annotations

from scheduler.ledger import LedgerSnapshot

_GIB, _MIB = 2**30, 2**20


def _unit(budget: int) -> tuple[int, str]:
    return (_GIB, "GiB") if budget >= _GIB else (_MIB, "MiB")


def summary_line(running: int, waiting: int, checkpoints: int, snap: LedgerSnapshot) -> str:
    """``episodes: 3 running, 1 waiting | budget: 1.2/2.0 GiB, peak 1.9 GiB | checkpoints: 7``"""
    div, unit = _unit(snap.budget)
    used = (snap.held + snap.reserved) / div
    return (f"episodes: {running} running, {waiting} waiting | budget: {used:.1f}/"
            f"{snap.budget / div:.1f} {unit}, peak {snap.peak / div:.1f} {unit} | "
            f"checkpoints: {checkpoints}")
