"""The episode API's domain: kvagent's own agent, hosted (what ``KvAgent(server=URL)``
drives through ``runtime/serve/http``).

An episode is opened with an agent configuration, an instruction and, optionally, the
client's screen (the VM's: generated code is scaled onto it); it decides in the pixels of
each screenshot it sees.  Overlap happens here: after answering a step, the pool prefetches
the next one while the client's VM executes the action.  Every id becomes an episode through
``get`` (an unknown one raises ``UnknownEpisodeError``).

Episodes idle longer than ``idle_s`` give their slot to a new episode when every slot is
taken (a client that vanished without ending its episode, e.g. an OSWorld worker ended with
``os._exit``); a later step of such an episode finds it unknown.
"""

from __future__ import annotations

import time

import attrs

from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.driver import DriverStep
from runtime.metrics import StepMetrics
from runtime.pool import EpisodePool, PooledEpisode
from runtime.serve.conversations import Conversations
from runtime.serve.ids import NewId
from runtime.serve.prometheus import ServeMetrics
from runtime.session import Teacher


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


class EpisodeService:
    """``screen``: what an episode's prompt assumes until its first screenshot when the
    client gives none; ``conversations``: the chat conversations (episodes too, listed as
    such)."""

    def __init__(self, pool: EpisodePool, conversations: Conversations, *, screen: Screen,
                 idle_s: float, new_id: NewId, metrics: ServeMetrics) -> None:
        self._pool, self._conversations = pool, conversations
        self._screen, self._idle_s = screen, idle_s
        self._new_id, self._metrics = new_id, metrics

    async def create(self, config: AgentConfig, instruction: str, screen: Screen | None, *,
                     number: int | None = None, teacher: Teacher | None = None) -> str:
        """Open an episode; returns its id.  ``number`` (a cluster's front door numbering
        episodes across its hosts) replaces the host's own count as the id and the sampling
        seed; ``teacher`` forces the history text of the first steps (a replay)."""
        episode_id, n = self._new_id("ep") if number is None else (f"ep-{number}", number)
        # the prompt's screen size until the first screenshot says otherwise (the model
        # decides in the pixels of the screenshot it sees)
        pooled = await self._pool.open(episode_id, config, instruction, screen or self._screen,
                                       seed=n, teacher=teacher, evictable=self.idle_too_long)
        pooled.screen = screen
        return episode_id

    def get(self, episode_id: str) -> PooledEpisode:
        """The open episode ``episode_id`` names (``UnknownEpisodeError`` if none)."""
        return self._pool.get(episode_id)

    async def step(self, episode_id: str, png: bytes, size: Screen, *,
                   arrived_at: float) -> EpisodeStep:
        """Decide on screenshot ``png`` of ``size`` pixels, whose bytes were in hand at
        ``arrived_at`` (``time.perf_counter``: the critical path starts there)."""
        pooled = self.get(episode_id)
        pooled.driver.session.resize(size)  # the model decides in the pixels it sees
        step = await self._pool.step(episode_id, png, arrived_at=arrived_at)
        self._metrics.step("episode", step.metrics)
        return EpisodeStep(episode_id, step, pooled.driver.session.history_text, size,
                           pooled.screen if pooled.screen is not None else size)

    async def end(self, episode_id: str) -> None:
        self.get(episode_id)  # unknown: raises
        await self._pool.close(episode_id)

    def describe(self, episode_id: str) -> EpisodeView:
        return self._view(self.get(episode_id))

    def listing(self) -> list[EpisodeView]:
        """Every open episode and chat conversation."""
        return [self._view(pooled) for pooled in self._pool.episodes.values()]

    def idle_too_long(self, pooled: PooledEpisode) -> bool:
        """May ``pooled`` give its slot to a new episode?  (Idle longer than ``idle_s``.)"""
        return time.monotonic() - pooled.last_used > self._idle_s

    def _view(self, pooled: PooledEpisode) -> EpisodeView:
        kind = "chat" if pooled.episode_id in self._conversations else "episode"
        return EpisodeView(pooled.episode_id, kind, pooled.config.policy,
                           pooled.config.profile, pooled.busy, tuple(pooled.recent))
