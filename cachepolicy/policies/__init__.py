"""The built-in cache policies; importing this package registers them by name."""

from cachepolicy.policies.evict import EvictPolicy
from cachepolicy.policies.noevict import NoEvictPolicy
from cachepolicy.policies.relocate import RelocatePolicy
from cachepolicy.policies.terminal_scratch import TerminalScratchPolicy
from cachepolicy.policies.terminal_slot import TerminalSlotPolicy

__all__ = ["EvictPolicy", "NoEvictPolicy", "RelocatePolicy", "TerminalScratchPolicy",
           "TerminalSlotPolicy"]
