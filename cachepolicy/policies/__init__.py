"""The built-in cache policies; importing this package registers them by name.

``names()`` lists every registered policy (built-in and user-registered), which is where the
command line takes its choices from.
"""

from cachepolicy.base import POLICIES
from cachepolicy.policies.evict import EvictPolicy
from cachepolicy.policies.faithful import FaithfulPolicy
from cachepolicy.policies.noevict import NoEvictPolicy
from cachepolicy.policies.relocate import RelocatePolicy
from cachepolicy.policies.terminal_scratch import TerminalScratchPolicy
from cachepolicy.policies.terminal_slot import TerminalSlotPolicy

#: The built-in policies in the order the bench and the docs show them.
BUILTIN = ("evict", "noevict", "terminal-scratch", "terminal-slot", "relocate")


def names() -> tuple[str, ...]:
    """Every registered policy: the built-ins first (in ``BUILTIN`` order), then others."""
    return BUILTIN + tuple(sorted(n for n in POLICIES if n not in BUILTIN))


__all__ = ["BUILTIN", "EvictPolicy", "FaithfulPolicy", "NoEvictPolicy", "RelocatePolicy", "TerminalScratchPolicy",
           "TerminalSlotPolicy", "names"]
