"""The episode API's domain: kvagent's own agent, hosted (what ``KvAgent(server=URL)``
drives through ``runtime/serve/http``).

An episode is opened with an agent configuration, an instruction and, optionally, the
client's screen (the VM's: generated code is scaled onto it); it decides in the pixels of
each screenshot it sees.  Overlap happens here: after answering a step, the pool prefetches
the next one while the client's VM executes the action.  Every id becomes an episode through
``get``, which checks that the caller owns it: an unknown id and another key's both raise
``UnknownEpisodeError`` (404 — whether an id exists is not revealed).

When every slot is taken, a new episode takes the slot of an idle one the host's slot rule
allows (``slots.py``: an answered chat conversation, an episode whose client's lease dropped,
or one idle past ``--idle-seconds``); a later step of such an episode finds it unknown.  An
episode whose lease dropped is ended by the host after a grace (``leases.py``).
"""

from __future__ import annotations

import attrs
import structlog

from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.driver import DriverStep
from runtime.metrics import StepMetrics
from runtime.pool import EpisodePool, PooledEpisode, UnknownEpisodeError
from runtime.serve.conversations import Conversations
from runtime.serve.ids import IdCounter, new_id
from runtime.serve.leases import Leases
from runtime.serve.owners import OwnedIds, Owner
from runtime.serve.prometheus import ServeMetrics
from runtime.serve.slots import SlotRule
from runtime.session import Teacher


log = structlog.get_logger("kvagent.serve")


@attrs.frozen
class EpisodeCreated:
    episode_id: str
    number: int  # its number on the host (or cluster): its sampling seed


@attrs.frozen
class EpisodeStep:
    """A decided step of an episode."""

    episode_id: str
    step: DriverStep
    history: str | None  # the text the step leaves in the history (what a replay forces)
    screenshot_size: Screen  # the pixels the model decided in
    screen: Screen  # the client's screen (its own, or the screenshot's size)


@attrs.frozen
class EpisodeView:
    """An open episode (or chat conversation) and its recent steps' measurements."""

    episode_id: str
    kind: str  # episode | chat
    policy: str
    profile: str
    busy: bool
    recent: tuple[StepMetrics, ...]
    window: int = 0  # screenshots the prompt shows
    pinned: int = 0  # of those, the episode's first ones kept to its end


class EpisodeService:
    """``screen``: what an episode's prompt assumes until its first screenshot when the
    client gives none; ``conversations``: the chat conversations (episodes too, listed as
    such); ``numbers``: the host's episode numbers (sampling seeds)."""

    def __init__(self, pool: EpisodePool, conversations: Conversations, leases: Leases,
                 slots: SlotRule, *, screen: Screen, numbers: IdCounter,
                 metrics: ServeMetrics) -> None:
        self._pool, self._conversations = pool, conversations
        self._leases, self._slots = leases, slots
        self._screen, self._numbers, self._metrics = screen, numbers, metrics
        self._owners = OwnedIds()

    async def create(self, config: AgentConfig, instruction: str, screen: Screen | None,
                     owner: Owner, *, number: int | None = None, episode_id: str | None = None,
                     teacher: Teacher | None = None) -> EpisodeCreated:
        """Open an episode for ``owner``.  ``number`` / ``episode_id`` (a cluster's front
        door numbering and naming episodes across its hosts) replace the host's own;
        ``teacher`` forces the history text of the first steps (a replay)."""
        if number is None:
            number = self._numbers.next_number()
        if episode_id is None:
            episode_id = new_id("ep")
        elif not episode_id.startswith("ep-") or episode_id in self._pool.episodes:
            raise ValueError(f"episode id {episode_id!r} is not a free episode id")
        # the prompt's screen size until the first screenshot says otherwise (the model
        # decides in the pixels of the screenshot it sees)
        pooled = await self._pool.open(episode_id, config, instruction, screen or self._screen,
                                       seed=number, teacher=teacher,
                                       evictable=self._slots.evictable)
        pooled.screen = screen
        self._owners.prune(self._pool.episodes)  # (an open may have closed idle ones)
        self._owners.record(episode_id, owner)
        self._conversations.prune()
        return EpisodeCreated(episode_id, number)

    def get(self, episode_id: str, owner: Owner) -> PooledEpisode:
        """``owner``'s open episode (or chat conversation) ``episode_id``;
        ``UnknownEpisodeError`` if there is none — or it is another owner's."""
        pooled = self._pool.episodes.get(episode_id)
        if pooled is not None:
            conv = self._conversations.get(episode_id)
            mine = (conv.owner == owner if conv is not None
                    else self._owners.owns(episode_id, owner))
            if mine:
                return pooled
        raise UnknownEpisodeError(f"no open episode {episode_id!r}")

    async def step(self, episode_id: str, owner: Owner, png: bytes, size: Screen, *,
                   arrived_at: float) -> EpisodeStep:
        """Decide on screenshot ``png`` of ``size`` pixels, whose bytes were in hand at
        ``arrived_at`` (``time.perf_counter``: the critical path starts there)."""
        pooled = self.get(episode_id, owner)
        pooled.driver.session.resize(size)  # the model decides in the pixels it sees
        step = await self._pool.step(episode_id, png, arrived_at=arrived_at)
        self._metrics.step("episode", step.metrics)
        return EpisodeStep(episode_id, step, pooled.driver.session.history_text, size,
                           pooled.screen if pooled.screen is not None else size)

    async def end(self, episode_id: str, owner: Owner) -> None:
        self.get(episode_id, owner)  # unknown or not the caller's: raises
        if episode_id in self._conversations:
            await self._conversations.close(episode_id)
        else:
            await self._close(episode_id)

    def describe(self, episode_id: str, owner: Owner) -> EpisodeView:
        return self._view(self.get(episode_id, owner))

    def listing(self, owner: Owner) -> list[EpisodeView]:
        """``owner``'s open episodes and chat conversations."""
        self._owners.prune(self._pool.episodes)
        out = []
        for pooled in list(self._pool.episodes.values()):
            try:
                out.append(self._view(self.get(pooled.episode_id, owner)))
            except UnknownEpisodeError:
                continue
        return out

    def busy(self, episode_id: str) -> bool | None:
        """Is a step of ``episode_id`` running?  None: it is not open (the leases ask)."""
        pooled = self._pool.episodes.get(episode_id)
        return None if pooled is None else pooled.busy

    async def expire(self, episode_id: str) -> None:
        """End ``episode_id`` on the host's own account (its lease dropped): no owner."""
        await self._close(episode_id)

    async def _close(self, episode_id: str) -> None:
        self._owners.forget(episode_id)
        self._leases.forget(episode_id)
        await self._pool.close(episode_id)

    def _view(self, pooled: PooledEpisode) -> EpisodeView:
        kind = "chat" if pooled.episode_id in self._conversations else "episode"
        return EpisodeView(pooled.episode_id, kind, pooled.config.policy,
                           pooled.config.profile, pooled.busy, tuple(pooled.recent),
                           window=pooled.config.window, pinned=pooled.config.pinned)
