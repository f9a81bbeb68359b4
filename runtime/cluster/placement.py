"""Where a new episode (or conversation) goes: a pure decision over the hosts' reports.

A host can take one when it has a free sequence (open episodes < its slots).  Among those,
the most free ledger bytes (budget − held − reserved) wins: memory is what a host runs out
of first, and an episode's checkpoints and KV stay where it is placed for its whole life.
Ties (e.g. several idle hosts) go to the fewest open episodes, then the name, so the
decision is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs


@attrs.frozen
class HostLoad:
    """What one host reported (``ModelHost.status``), reduced to what placement reads."""

    name: str
    free_bytes: int
    open: int
    slots: int

    @property
    def has_free_sequence(self) -> bool:
        return self.open < self.slots

    @classmethod
    def from_status(cls, name: str, status: Mapping[str, Any]) -> HostLoad:
        ledger, episodes = status["ledger"], status["episodes"]
        free = ledger["budget_bytes"] - ledger["held_bytes"] - ledger["reserved_bytes"]
        return cls(name, max(0, int(free)), int(episodes["open"]), int(episodes["max"]))


def placement_order(loads: Iterable[HostLoad]) -> list[str]:
    """The hosts that can take a new episode, best first (see the module docstring)."""
    ready = [load for load in loads if load.has_free_sequence]
    ready.sort(key=lambda load: (-load.free_bytes, load.open, load.name))
    return [load.name for load in ready]
