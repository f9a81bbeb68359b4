"""The server-wide budget for request bodies being read: bytes in flight across every
request, so that many large bodies at once cannot take more memory than
``Limits.body_budget_bytes`` (sixteen 60 MB bodies used to peak at 1.5 GB).

A reader reserves a body's declared size before reading a byte of it (a body without a
declared size reserves as its chunks arrive). On a model host the reservation lasts until
the handler returns (``request_reservation``, opened by the app's guard): what a request
parsed from its body (texts, images) lives that long, so the budget bounds it too — a body
costs at most twice its bytes while it is parsed, about its bytes afterwards. Elsewhere (the
cluster's front door) it ends once the body is read or parsed (``body.py``). A streamed
answer's own memory is not counted. A reservation that does not fit waits until others
release — at most ``Limits.body_budget_wait_s``, then the request is refused with a 503
(retry later); one larger than the whole budget could never fit and is a 413 at once. While
a body waits its bytes stay in the client's socket: nothing is read.

Invariant (``check_integrity``): ``reserved`` equals the sum of the live reservations, an
independent count kept by each ``Reservation``; it never exceeds ``capacity``, so
``peak`` never does either.  One budget per app (= per server): ``budget_of``.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import attrs
from starlette.requests import Request

from runtime.serve.config import Limits
from runtime.serve.http.errors import ApiError, too_large, unavailable


@attrs.define(eq=False)
class BodyBudget:
    """Bytes of request bodies being read, server-wide (mutated by ``Reservation``)."""

    capacity: int
    reserved: int = 0
    peak: int = 0
    #: requests refused because their body did not fit in time (503)
    num_refused: int = 0
    _live: set[Reservation] = attrs.field(factory=set, repr=False)
    _released: anyio.Event | None = attrs.field(default=None, repr=False)

    @asynccontextmanager
    async def reservation(self, wait_s: float) -> AsyncIterator[Reservation]:
        """A reservation of no bytes yet (``Reservation.grow``), released — all of it —
        when the block ends, however it ends."""
        held = Reservation(self, wait_s)
        self._live.add(held)
        try:
            yield held
        finally:
            self._live.discard(held)
            self._give_back(held.num_bytes)
            held.num_bytes = 0

    def check_integrity(self) -> None:
        """``reserved`` is the sum of what the live reservations hold, within
        ``capacity``; the peak too."""
        held = sum(r.num_bytes for r in self._live)
        assert self.reserved == held, (self.reserved, held)
        assert 0 <= self.reserved <= self.peak <= self.capacity, (
            self.reserved, self.peak, self.capacity)

    def _fits(self, num_bytes: int) -> bool:
        return self.reserved + num_bytes <= self.capacity

    def _take(self, num_bytes: int) -> None:
        assert self._fits(num_bytes)
        self.reserved += num_bytes
        self.peak = max(self.peak, self.reserved)

    def _give_back(self, num_bytes: int) -> None:
        self.reserved -= num_bytes
        if num_bytes and self._released is not None:
            self._released.set()  # wake every waiter: each re-checks whether it fits
            self._released = None

    async def _wait_for_release(self) -> None:
        if self._released is None:
            self._released = anyio.Event()
        await self._released.wait()


@attrs.define(eq=False)
class Reservation:
    """One request's share of a ``BodyBudget`` (made by ``BodyBudget.reservation``)."""

    budget: BodyBudget
    wait_s: float
    num_bytes: int = 0

    async def grow(self, num_bytes: int) -> None:
        """Hold ``num_bytes`` more, waiting (at most ``wait_s`` in all for this call) until
        they fit.  413 when they could never fit; 503 when they did not in time."""
        budget = self.budget
        if self.num_bytes + num_bytes > budget.capacity:
            raise too_large(f"the request body needs more than the server's budget for "
                            f"bodies being read ({budget.capacity} bytes)")
        with anyio.move_on_after(self.wait_s):
            while not budget._fits(num_bytes):
                await budget._wait_for_release()
        if not budget._fits(num_bytes):
            budget.num_refused += 1
            raise _budget_full(budget, self.wait_s)
        budget._take(num_bytes)
        self.num_bytes += num_bytes


def _budget_full(budget: BodyBudget, wait_s: float) -> ApiError:
    return unavailable(f"the server is reading {budget.reserved} bytes of other requests' "
                       f"bodies (its budget: {budget.capacity}) and this body did not fit "
                       f"within {wait_s:g} s; retry later", retry_after=max(1, math.ceil(wait_s)))


#: Where a request's reservation for its handler's life rides (``request_reservation``).
RESERVATION_SCOPE_KEY = "kvagent.body_reservation"


@asynccontextmanager
async def request_reservation(request: Request, limits: Limits) -> AsyncIterator[None]:
    """A reservation for ``request``'s body that lasts the block (its handler): ``body.py``
    grows it as it reads, so what the handler parsed stays reserved until it returns."""
    budget = budget_of(request, limits)
    async with budget.reservation(limits.body_budget_wait_s) as held:
        request.scope[RESERVATION_SCOPE_KEY] = held
        try:
            yield
        finally:
            request.scope.pop(RESERVATION_SCOPE_KEY, None)


@asynccontextmanager
async def reservation_for(request: Request, limits: Limits) -> AsyncIterator[Reservation]:
    """The request's reservation (``request_reservation``) if its app opened one, else one
    for the block."""
    held = request.scope.get(RESERVATION_SCOPE_KEY)
    if isinstance(held, Reservation):
        yield held
        return
    async with budget_of(request, limits).reservation(limits.body_budget_wait_s) as held:
        yield held


#: Where an app keeps its budget (``app.state``).
_STATE_KEY = "body_budget"


def budget_of(request: Request, limits: Limits) -> BodyBudget:
    """The budget of the app serving ``request`` — one per app, made on first use (in the
    event loop: no race), so every app that reads bodies with ``body.py`` has one."""
    state = request.app.state
    budget = getattr(state, _STATE_KEY, None)
    if not isinstance(budget, BodyBudget):
        budget = BodyBudget(limits.body_budget_bytes)
        setattr(state, _STATE_KEY, budget)
    return budget
