"""The front door's bookkeeping: which host has which episode, and what to do when one dies.

- **Placement**: a new episode goes to the host that reports the most free ledger bytes and
  has a free sequence (``placement.py``), asked afresh for every placement; placements are
  serialized (one lock), so each one sees the previous one's episode.  A host that refuses
  (429 / 503: it filled up meanwhile) passes the episode to the next.
- **Affinity**: the front door names episodes (unguessable ids, as a single host's) and
  numbers them (N, the sampling seed, as a single host numbers its own), and keeps
  ``episode → host``: every later step goes there, where its checkpoints and KV are.  Chat
  conversations stick to a host by an affinity key (per API key).
- **Ownership**: an episode belongs to the client's key id; another key's requests get 404
  here, and the hosts check the same (the front door names the owner to them).
- **Leases**: a client holding its episode's lease through the front door (``lease.py``)
  holds it on the host; when the client's lease request closes and does not come back
  within the grace, the front door forgets the episode (its host ends it on its own).
- **Failure**: a host is lost when its actor's ``serve`` call ends (Ray saw the process or
  node die) or a request to it fails in transport; its in-flight requests are cancelled,
  its actor killed and a replacement started.  Its episodes keep their record (the create
  request and every step's screenshot and history text): the next step rebuilds the episode
  on another host (``resume.py``: re-prefilled, teacher-forced) and then runs — the client
  sees no error.  With every host lost, the step waits for a replacement (bounded); only
  when none can take the episode in time does it get one retryable 503.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import attrs
import structlog

from runtime.cluster.forward import Forwarded, Forwarder, HostLost
from runtime.cluster.hosts import HostPool
from runtime.cluster.placement import placement_order
from runtime.cluster.resume import RecordedStep
from runtime.cluster.spawn import HostHandle
from runtime.serve.http.errors import ApiError, busy, not_found, unavailable
from runtime.serve.ids import new_id
from runtime.serve.owners import Owner

log = structlog.get_logger("kvagent.cluster")

#: Conversations remembered for chat affinity (least recently used forgotten first).
MAX_CONVERSATIONS = 4096


@attrs.define(eq=False)
class RoutedEpisode:
    episode_id: str
    number: int
    owner: Owner
    body: dict[str, Any]  # the create request, for a rebuild
    host: HostHandle | None
    steps: list[RecordedStep] = attrs.Factory(list)
    busy: bool = False
    last_used: float = attrs.Factory(time.monotonic)
    leases: int = 0  # the client's lease requests open through the front door
    lease_dropped_at: float | None = None  # when the last one closed


class Router:
    """See the module docstring.  ``start_host(name)`` starts a replacement host;
    ``kill_host`` ends a lost one's actor."""

    def __init__(self, hosts: list[HostHandle], *,
                 start_host: Callable[[str], Awaitable[HostHandle]],
                 kill_host: Callable[[HostHandle], None], read_timeout_s: float = 600.0,
                 replace_lost: bool = True, rebuild_wait_s: float = 300.0,
                 idle_s: float = 300.0, lease_grace_s: float = 10.0,
                 internal_key: str | None = None) -> None:
        self.pool = HostPool(hosts, start_host=start_host, kill_host=kill_host,
                             on_lost=self._on_lost, replace_lost=replace_lost)
        self.episodes: dict[str, RoutedEpisode] = {}
        self.conversations: OrderedDict[str, HostHandle] = OrderedDict()
        self.failovers = 0
        self._rebuild_wait_s, self._idle_s = rebuild_wait_s, idle_s
        self.lease_grace_s = lease_grace_s
        self._numbers = itertools.count(1)
        self._place_lock = anyio.Lock()
        self.http = Forwarder(self.pool.host_lost, internal_key=internal_key,
                              read_timeout_s=read_timeout_s)

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        """Watch every host until cancelled."""
        try:
            await self.pool.run(task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):
                await self.http.aclose()

    @property
    def hosts(self) -> dict[str, HostHandle]:
        return self.pool.hosts

    @property
    def lost(self) -> int:
        return self.pool.lost

    def alive(self) -> list[HostHandle]:
        return self.pool.alive()

    def closing(self) -> None:
        self.pool.closing()

    def _on_lost(self, host: HostHandle) -> int:
        """The router's part of a host's loss: its conversations are forgotten (their next
        request is placed anew); its episodes are rebuilt by their next step."""
        for key in [k for k, h in self.conversations.items() if h is host]:
            del self.conversations[key]
        return sum(1 for ep in self.episodes.values() if ep.host is host)

    async def _place_when_possible(self, episode: RoutedEpisode) -> tuple[int, dict[str, Any]]:
        """``_place``, waiting (up to ``rebuild_wait_s``) for replacement hosts while none
        can take the episode: a lost host's episode waits for its successor rather than
        fail while one is loading."""
        deadline = anyio.current_time() + self._rebuild_wait_s
        while True:
            status, answer = await self._place(episode)
            if status == 201 or status not in (429, 503) or not self.pool.replacing:
                return status, answer
            if not await self.pool.wait_for_host(deadline):
                return status, answer

    # ------------------------------------------------------------------ placement

    async def best_host(self) -> HostHandle:
        """The host a new conversation goes to (429 when none has a free sequence)."""
        order = placement_order(await self.pool.loads())
        if not order:
            raise self._full()
        return self.hosts[order[0]]

    def _full(self) -> ApiError:
        if not self.alive():
            return unavailable("no model host is running (one is being started)")
        return busy("every host's episode slots are in use")

    async def create(self, body: dict[str, Any], owner: Owner,
                     ) -> tuple[int, dict[str, Any], str]:
        """A new episode of ``owner``'s: placed, created there under a fresh id and the
        next number."""
        self._forget_idle()
        episode = RoutedEpisode(new_id("ep"), next(self._numbers), owner, body, None)
        status, answer = await self._place(episode)
        if status == 201:
            self.episodes[episode.episode_id] = episode
        assert episode.host is not None or status != 201
        return status, answer, episode.host.name if episode.host else ""

    async def _place(self, episode: RoutedEpisode) -> tuple[int, dict[str, Any]]:
        """Open ``episode`` on the best host that takes it (rebuilt from its steps)."""
        async with self._place_lock:
            loads = await self.pool.loads()
            refused: dict[str, Any] | None = None
            # hosts with a free sequence by headroom, then the full ones: a full host may
            # give an idle episode's slot away (--idle-seconds), or answers 429
            order = placement_order(loads)
            order += [x.name for x in sorted(loads, key=lambda x: -x.free_bytes)
                      if x.name not in order]
            for name in order:
                host = self.hosts[name]
                try:
                    with anyio.fail_after(self._rebuild_timeout(episode)):
                        reply = await host.actor.open_episode.remote(
                            episode.body, episode.number, episode.steps,
                            episode_id=episode.episode_id, owner=episode.owner)
                except Exception as exc:  # noqa: BLE001  died meanwhile: try the next
                    self.pool.host_lost(host, f"open failed: {type(exc).__name__}")
                    continue
                if reply.status == 201:
                    episode.host = host
                    if episode.steps:
                        self.failovers += 1
                        log.info("cluster_episode_moved", episode_id=episode.episode_id,
                                 host=name, replayed=reply.body["replayed"],
                                 diverged=reply.body["diverged"])
                    return 201, reply.body
                if reply.status not in (429, 503):
                    return reply.status, reply.body  # the request itself is wrong
                refused = reply.body
            error = self._full()
            return error.status, refused or error.body()

    def _forget_idle(self) -> None:
        """Drop the records of episodes idle longer than ``idle_s`` (a client that vanished
        without ending its episode; its host gives the slot away after as long) or whose
        lease dropped longer than the grace ago (the client ended): a later step of one
        gets 404, as from a single host."""
        now = time.monotonic()
        for episode_id, ep in list(self.episodes.items()):
            if not ep.busy and (now - ep.last_used > self._idle_s or self._lease_gone(ep)):
                del self.episodes[episode_id]
                log.info("cluster_episode_forgotten", episode_id=episode_id,
                         idle_s=round(now - ep.last_used),
                         lease_dropped=ep.lease_dropped_at is not None)

    def _lease_gone(self, ep: RoutedEpisode) -> bool:
        return (ep.leases == 0 and ep.lease_dropped_at is not None
                and time.monotonic() - ep.lease_dropped_at > self.lease_grace_s)

    @staticmethod
    def _rebuild_timeout(episode: RoutedEpisode) -> float:
        return 60.0 + 120.0 * len(episode.steps)

    # ------------------------------------------------------------------ forwarding

    def episode(self, episode_id: str, owner: Owner) -> RoutedEpisode:
        """``owner``'s routed episode ``episode_id`` (404 if none — or another's)."""
        ep = self.episodes.get(episode_id)
        if ep is None or ep.owner != owner or (not ep.busy and self._lease_gone(ep)):
            raise not_found(f"no open episode {episode_id!r}", param="episode_id",
                            code="episode_not_found")
        return ep

    async def step(self, episode_id: str, owner: Owner, raw: bytes,
                   screenshot: str) -> Forwarded:
        """Forward a step to the episode's host; rebuild it elsewhere first if that host is
        lost (also when it dies during this step: the step is sent again)."""
        ep = self.episode(episode_id, owner)
        if ep.busy:
            raise ApiError(409, f"a step of episode {episode_id} is already running",
                           "invalid_request_error", None, "episode_busy")
        ep.busy = True
        try:
            for _ in range(2):
                if ep.host is None or not ep.host.alive:
                    ep.host = None
                    status, answer = await self._place_when_possible(ep)
                    if status != 201:
                        raise ApiError(503, f"episode {episode_id}'s host was lost and no "
                                       f"host can take it now: "
                                       f"{answer.get('error', {}).get('message', '')}",
                                       "server_error", None, "host_lost", retry_after=5.0)
                assert ep.host is not None
                try:
                    out = await self.http.forward(ep.host, "POST",
                                                  f"/v1/episodes/{episode_id}/step", raw,
                                                  owner)
                except HostLost:
                    continue
                if out.status == 200:
                    data = json.loads(out.content)
                    ep.steps.append(RecordedStep(screenshot, data["response"],
                                                 data.get("history")))
                elif out.status == 404 and _code(out) == "episode_not_found":
                    # the host gave an idle episode's slot away (--idle-seconds): the
                    # front door still has its record, so rebuild it rather than lose it
                    log.info("cluster_episode_evicted", episode_id=episode_id, host=out.host)
                    ep.host = None
                    continue
                return out
            raise ApiError(503, f"episode {episode_id} lost two hosts in one step; retry",
                           "server_error", None, "host_lost", retry_after=5.0)
        finally:
            ep.busy, ep.last_used = False, time.monotonic()

    async def end(self, episode_id: str, owner: Owner) -> Forwarded | None:
        ep = self.episode(episode_id, owner)
        del self.episodes[episode_id]
        if ep.host is None or not ep.host.alive:
            return None  # nothing held anywhere
        try:
            return await self.http.forward(ep.host, "DELETE", f"/v1/episodes/{episode_id}",
                                           b"", owner)
        except HostLost:
            return None

    def conversation_host(self, key: str) -> HostHandle | None:
        host = self.conversations.get(key)
        if host is None or not host.alive:
            return None
        self.conversations.move_to_end(key)
        return host

    def remember_conversation(self, key: str, host: HostHandle) -> None:
        self.conversations[key] = host
        self.conversations.move_to_end(key)
        while len(self.conversations) > MAX_CONVERSATIONS:
            self.conversations.popitem(last=False)


def _code(out: Forwarded) -> str | None:
    try:
        return json.loads(out.content)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None
