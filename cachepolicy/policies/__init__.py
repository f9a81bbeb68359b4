"""The cache policies by name: the registry (``POLICIES``, ``register``, ``make_policy``) and
the built-in policies, which importing this package registers.

``names()`` lists every registered policy (built-in and user-registered), which is where the
command line takes its choices from.  A policy of your own subclasses
``cachepolicy.base.CachePolicy`` and is decorated with ``@register`` (from here).
"""

from cachepolicy.policies.registry import (
    POLICIES, UnknownPolicyError, make_policy, pinning_policies, register,
)
from cachepolicy.policies.chrono_slot import ChronoSlotPolicy
from cachepolicy.policies.evict import EvictPolicy
from cachepolicy.policies.faithful import FaithfulPolicy, FaithfulTailPolicy
from cachepolicy.policies.kamera import KameraPolicy
from cachepolicy.policies.noevict import NoEvictPolicy, NoEvictTailPolicy
from cachepolicy.policies.relocate import RelocatePolicy
from cachepolicy.policies.tail_replay import TailReplayPolicy
from cachepolicy.policies.terminal_scratch import TerminalScratchPolicy
from cachepolicy.policies.terminal_slot import TerminalSlotPolicy
from cachepolicy.policies.token_evict import RandomEvictPolicy, RecencyEvictPolicy
from cachepolicy.policies.window_replay import WindowReplayPolicy

#: The built-in policies in the order the bench and the docs show them.
BUILTIN = ("evict", "noevict", "terminal-scratch", "terminal-slot", "relocate")


def names() -> tuple[str, ...]:
    """Every registered policy: the built-ins first (in ``BUILTIN`` order), then others."""
    return BUILTIN + tuple(sorted(n for n in POLICIES if n not in BUILTIN))


__all__ = ["BUILTIN", "POLICIES", "ChronoSlotPolicy", "EvictPolicy", "FaithfulPolicy", "FaithfulTailPolicy",
           "KameraPolicy", "NoEvictPolicy", "RandomEvictPolicy", "RecencyEvictPolicy", "NoEvictTailPolicy", "RelocatePolicy", "TailReplayPolicy",
           "TerminalScratchPolicy", "TerminalSlotPolicy", "UnknownPolicyError", "WindowReplayPolicy", "make_policy", "names",
           "pinning_policies", "register"]
