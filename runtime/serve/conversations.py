"""The open chat conversations of a host, each one an episode of the pool under the same id.

Invariants: a conversation is added only once its episode is open (``open``) and removed
with it (``close``).  The pool may close a conversation's episode on its own — chat
conversations have no end, so an idle one gives its slot to a new episode (``evictable``) —
and ``prune`` forgets those before a request is matched, so a match always names an open
episode.
"""

from __future__ import annotations

from collections.abc import Iterator

from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.pool import EpisodePool, PooledEpisode
from runtime.serve.conversation import Conversation


class Conversations:
    def __init__(self, pool: EpisodePool) -> None:
        self._pool = pool
        self._by_id: dict[str, Conversation] = {}

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._by_id

    def get(self, conversation_id: str) -> Conversation | None:
        return self._by_id.get(conversation_id)

    def implicit(self, mode: str) -> Iterator[Conversation]:
        """The conversations of ``mode`` that no client named (a request may be matched to
        one by its content), oldest first."""
        return (c for c in list(self._by_id.values()) if not c.explicit and c.mode == mode)

    def pooled(self, conversation_id: str) -> PooledEpisode | None:
        """The conversation's open episode (None once the pool closed it)."""
        return self._pool.episodes.get(conversation_id)

    def evictable(self, pooled: PooledEpisode) -> bool:
        """May the pool give ``pooled``'s slot to a new episode when idle?  Chat
        conversations have no end: yes, for every conversation."""
        return pooled.episode_id in self._by_id

    async def open(self, conversation: Conversation, config: AgentConfig,
                   screen: Screen) -> PooledEpisode:
        """Open ``conversation``'s episode (seed 0: a request and its seed alone decide the
        sampling, whatever the conversation) and hold the conversation."""
        pooled = await self._pool.open(conversation.conversation_id, config,
                                       conversation.instruction, screen, seed=0,
                                       evictable=self.evictable)
        self._by_id[conversation.conversation_id] = conversation
        return pooled

    async def close(self, conversation_id: str) -> None:
        self._by_id.pop(conversation_id, None)
        await self._pool.close(conversation_id)

    def prune(self) -> None:
        """Forget conversations whose episode the pool closed (evicted for a new one)."""
        for cid in [c for c in self._by_id if c not in self._pool.episodes]:
            del self._by_id[cid]
