"""Leases: an episode's client says it is alive by holding one long request open.

OSWorld's workers end with ``os._exit`` — no ``close``, no atexit hook, no finalizer — so the
only trace a vanished worker leaves is the kernel closing its sockets.  ``KvAgent(server=URL)``
therefore holds one request per episode open (``GET /v1/episodes/{id}/lease``, a heartbeat
stream, on a thread the client owns), and the host reads its end as the client's:

- while at least one lease request of an episode is open, the lease is **held**;
- when the last one closes, the lease is **dropped**: the episode may give its slot to a new
  episode or conversation at once (``slots.py``), and ``grace_s`` later, unless a lease came
  back, the host ends it — never while a step runs (it waits for the step to finish);
- an episode that never had a lease (a client speaking the API by hand) is not concerned: it
  gives its slot away only after ``--idle-seconds`` idle, as before.

The ends run in the leases' own task group (``run``), owned by the model host.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import anyio.abc
import attrs
import structlog

log = structlog.get_logger("kvagent.serve")

#: How often a waiting end looks again whether the episode's step is over.
BUSY_POLL_S = 0.25


@attrs.define
class _Lease:
    held: int = 0  # open lease requests
    dropped_at: float | None = None  # time.monotonic() the last one closed


class Leases:
    """``end(episode_id)`` ends an episode whose lease dropped; ``busy(episode_id)`` says
    whether its step is running (None: it is no longer open)."""

    def __init__(self, *, grace_s: float, end: Callable[[str], Awaitable[None]],
                 busy: Callable[[str], bool | None]) -> None:
        self.grace_s = grace_s
        self._end, self._busy = end, busy
        self._leases: dict[str, _Lease] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._stopping: anyio.Event | None = None

    def summary(self) -> str:
        """One line for logs and tests: ``Leases: 2 held, 1 dropped``."""
        held = sum(1 for x in self._leases.values() if x.held)
        return f"Leases: {held} held, {len(self._leases) - held} dropped"

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Own the task group the ends wait in, until ``stop``."""
        self._stopping = anyio.Event()
        async with anyio.create_task_group() as tg:
            self._tg = tg
            task_status.started()
            await self._stopping.wait()
            tg.cancel_scope.cancel()  # the host closes every episode anyway
        self._tg = None

    def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()

    @asynccontextmanager
    async def hold(self, episode_id: str) -> AsyncIterator[None]:
        """The lease of ``episode_id`` is held while this context is open (one lease
        request); the caller checked that the episode is open and the caller's."""
        lease = self._leases.setdefault(episode_id, _Lease())
        lease.held += 1
        lease.dropped_at = None
        log.info("serve_lease_held", episode_id=episode_id, held=lease.held)
        try:
            yield
        finally:
            lease.held -= 1
            if lease.held == 0 and self._leases.get(episode_id) is lease:
                lease.dropped_at = time.monotonic()
                log.info("serve_lease_dropped", episode_id=episode_id, grace_s=self.grace_s)
                if self._tg is not None:  # (the drop's time: the task may start later)
                    self._tg.start_soon(self._end_after_grace, episode_id, lease,
                                        lease.dropped_at)

    def dropped(self, episode_id: str) -> bool:
        """Did ``episode_id``'s client hold a lease and let it go (its process ended)?"""
        lease = self._leases.get(episode_id)
        return lease is not None and lease.held == 0

    def forget(self, episode_id: str) -> None:
        """The episode ended: its lease (held or not) no longer matters."""
        self._leases.pop(episode_id, None)

    async def _end_after_grace(self, episode_id: str, lease: _Lease,
                               dropped_at: float | None) -> None:
        await anyio.sleep(self.grace_s)
        while True:
            if self._leases.get(episode_id) is not lease or lease.dropped_at != dropped_at:
                return  # held again (a reconnect), or ended meanwhile
            busy = self._busy(episode_id)
            if busy is None:  # closed meanwhile (ended, evicted)
                self.forget(episode_id)
                return
            if not busy:
                break
            await anyio.sleep(BUSY_POLL_S)  # never end an episode in the middle of a step
        log.info("serve_lease_expired", episode_id=episode_id,
                 reason="its client's lease request closed (the client ended) and did not "
                        f"come back in {self.grace_s:g} s")
        self.forget(episode_id)
        await self._end(episode_id)
