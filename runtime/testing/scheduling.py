"""A scheduler a test owns: an engine, a memory budget, and the ledger checked on the way out.

``open_scheduler`` is an async context manager, so it runs in whichever event loop the test
runs in (pytest-asyncio's or anyio's); it checks integrity (ledger against the engine)
whenever the scheduler goes idle; when the block ends it asserts that no episode is left open
(nothing but the embedding cache holds bytes, nothing is reserved), and once the scheduler
closed, that the ledger holds nothing and never went past its budget — a test whose episodes
leak memory fails.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from cachepolicy.segments import SegmentFactory
from runtime.config import AgentConfig
from scheduler.ledger import MemoryLedger
from scheduler.release import STALL_TIMEOUT_S
from scheduler.scheduler import Scheduler
from scheduler.sizes import UNLIMITED_BYTES
from scheduler.slots import IMAGE_CACHE

if TYPE_CHECKING:  # the engine's module loads libllama: only a load needs it
    from cachepolicy.engine import Engine

__all__ = ["DEFAULT_SCREEN", "LedgerLeakError", "check_ledger_empty", "open_scheduler"]

#: The screen tests use unless they say otherwise: small, so steps are quick.
DEFAULT_SCREEN = (320, 240)


class LedgerLeakError(AssertionError):
    """The ledger did not return to zero, or went past its budget."""


@asynccontextmanager
async def open_scheduler(engine: Engine, *, budget: int = UNLIMITED_BYTES,
                         agent: AgentConfig | None = None,
                         screen: tuple[int, int] = DEFAULT_SCREEN,
                         wait_s: float = STALL_TIMEOUT_S) -> AsyncIterator[Scheduler]:
    """A ``Scheduler`` over ``engine`` with a ledger of ``budget`` bytes, set up as
    ``kvagent run`` sets one up for ``agent`` (default ``AgentConfig()``) on ``screen``:
    its step options, and a spare sequence if the agent's policy needs one.  Its ledger is
    ``scheduler.ledger``.  Raises ``LedgerLeakError`` at the end of a block that did not
    raise if an episode is still open, or after closing if the ledger still holds or
    reserves bytes, or its peak passed the budget."""
    agent = agent if agent is not None else AgentConfig()
    factory = SegmentFactory(engine)
    policy = agent.make_policy(factory, screen)  # a policy this model cannot run: refused here
    ledger = MemoryLedger(budget)
    async with Scheduler(engine, ledger, factory, options=agent.step_options(screen),
                         wait_s=wait_s, spare_sequence=policy.manifest.needs_scratch_sequence,
                         debug=True) as sched:
        yield sched
        left = {o: n for o, n in ledger.holdings().items() if o != IMAGE_CACHE and n}
        if left or ledger.reservations():
            raise LedgerLeakError(f"episodes left open at the end of the block: holdings "
                                  f"{left}, reservations {ledger.reservations()} "
                                  f"({sched.summary()})")
    check_ledger_empty(ledger)


def check_ledger_empty(ledger: MemoryLedger) -> None:
    """``LedgerLeakError`` unless ``ledger`` holds and reserves nothing and its peak stayed
    within its budget."""
    snap = ledger.snapshot()
    if snap.held or snap.reserved or snap.peak > snap.budget:
        raise LedgerLeakError(f"the ledger did not return to zero: held {snap.held} B, "
                              f"reserved {snap.reserved} B, peak {snap.peak} B of a "
                              f"{snap.budget} B budget")
