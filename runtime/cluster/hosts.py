"""The cluster's model hosts as the front door sees them: alive or lost, and replaced.

A host is lost when its actor's long-running ``serve`` call ends (Ray saw the process or the
node die, or it stopped) or when a request to it fails in transport (``forward.py`` reports
it).  Losing a host cancels its in-flight requests, kills its actor (a host the front door
cannot reach must not keep episodes it cannot serve) and starts a replacement, which Ray
puts on a free ``kvagent_host`` unit — the lost one's, if its node is alive.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import structlog

from runtime.cluster.placement import HostLoad
from runtime.cluster.spawn import HostHandle

log = structlog.get_logger("kvagent.cluster")

STATUS_TIMEOUT_S = 10.0


class HostPool:
    """``on_lost(host)`` lets the router forget what lived there; it returns how many
    episodes were on the host (for the log)."""

    def __init__(self, hosts: list[HostHandle], *,
                 start_host: Callable[[str], Awaitable[HostHandle]],
                 kill_host: Callable[[HostHandle], None],
                 on_lost: Callable[[HostHandle], int], replace_lost: bool = True) -> None:
        self.hosts: dict[str, HostHandle] = {h.name: h for h in hosts}
        self.lost = 0
        self.replacing = 0  # replacement hosts being started
        self._start_host, self._kill_host, self._on_lost = start_host, kill_host, on_lost
        self._replace_lost = replace_lost
        self._closing = False
        self._host_added = anyio.Event()
        self._names = itertools.count(len(hosts))
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Watch every host (and start replacements) until cancelled."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                for host in self.hosts.values():
                    tg.start_soon(self._watch, host)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._tg = None

    def closing(self) -> None:
        """The front door is shutting down: hosts that end now are not replaced."""
        self._replace_lost = False
        self._closing = True

    def alive(self) -> list[HostHandle]:
        return [h for h in self.hosts.values() if h.alive]

    async def _watch(self, host: HostHandle) -> None:
        try:
            await host.done
            reason = "the host stopped"
        except Exception as exc:  # noqa: BLE001  RayActorError & co: the host died
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
        self.host_lost(host, reason)

    def host_lost(self, host: HostHandle, reason: str) -> None:
        """Mark ``host`` lost (idempotent): cancel its requests, end its actor, replace it."""
        if not host.alive:
            return
        host.alive = False
        if self._closing:  # stopped on purpose (or did not stop in time): no replacement
            self._kill_host(host)
            return
        self.lost += 1
        episodes = self._on_lost(host)
        log.warning("cluster_host_lost", host=host.name, reason=reason, episodes=episodes)
        for scope in list(host.inflight):
            scope.cancel()
        self._kill_host(host)
        if self._replace_lost and self._tg is not None:
            self._tg.start_soon(self._replace, f"host-{next(self._names)}")

    async def _replace(self, name: str) -> None:
        self.replacing += 1
        try:
            host = await self._start_host(name)
        except Exception as exc:  # noqa: BLE001  no room for it now: the cluster runs on
            log.warning("cluster_host_not_replaced", host=name, error=repr(exc)[:300])
            return
        finally:
            self.replacing -= 1
            self._host_added.set()  # wake rebuilds waiting for room (also on failure)
            self._host_added = anyio.Event()
        self.hosts[name] = host
        if self._tg is not None:
            self._tg.start_soon(self._watch, host)

    async def wait_for_host(self, deadline: float) -> bool:
        """Wait until a replacement host started (or failed to), or ``deadline`` (anyio
        time); False when the deadline passed."""
        added = self._host_added
        with anyio.move_on_after(deadline - anyio.current_time()):
            await added.wait()
        return anyio.current_time() < deadline

    async def loads(self) -> list[HostLoad]:
        """Every live host's report, asked now (a host that cannot answer is lost)."""
        out: list[HostLoad] = []

        async def ask(host: HostHandle) -> None:
            try:
                with anyio.fail_after(STATUS_TIMEOUT_S):
                    status = await host.actor.status.remote()
            except Exception as exc:  # noqa: BLE001
                self.host_lost(host, f"status failed: {type(exc).__name__}")
                return
            out.append(HostLoad.from_status(host.name, status))

        async with anyio.create_task_group() as tg:
            for host in self.alive():
                tg.start_soon(ask, host)
        return out
