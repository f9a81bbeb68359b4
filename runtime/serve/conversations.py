"""The open chat conversations of a host, each one an episode of the pool under the same id.

A conversation belongs to the key that opened it (``owners.py``): ``get`` and ``named`` find
only the caller's, and a client's names (its conversation header or ``user``) are its own —
two keys naming "agent-1" hold two conversations.

Invariants: a conversation is added only once its episode is open (``open``) and removed
with it (``close``).  The pool may close a conversation's episode on its own — chat
conversations have no end, so an idle one that has answered at least once gives its slot to
a new episode (the host's slot rule, ``slots.py``) — and ``prune`` forgets those before a
request is matched, so a match always names an open episode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from runtime.actions import Screen
from runtime.config import AgentConfig
from runtime.pool import EpisodePool, PooledEpisode
from runtime.serve.conversation import Conversation
from runtime.serve.owners import Owner


class Conversations:
    """``evictable(pooled)``: the host's slot rule, asked when an open finds every slot
    taken."""

    def __init__(self, pool: EpisodePool, evictable: Callable[[PooledEpisode], bool]) -> None:
        self._pool, self._evictable = pool, evictable
        self._by_id: dict[str, Conversation] = {}
        self._by_name: dict[tuple[Owner, str], str] = {}

    def __contains__(self, conversation_id: object) -> bool:
        return conversation_id in self._by_id

    def get(self, conversation_id: str, owner: Owner | None = None) -> Conversation | None:
        """The conversation ``conversation_id`` — None unless it is open and, when ``owner``
        is given, ``owner``'s."""
        conv = self._by_id.get(conversation_id)
        return conv if conv is not None and owner in (None, conv.owner) else None

    def named(self, owner: Owner, name: str) -> Conversation | None:
        """``owner``'s conversation called ``name`` (None: none yet)."""
        cid = self._by_name.get((owner, name))
        return self._by_id.get(cid) if cid is not None else None

    def implicit(self, mode: str, owner: Owner) -> Iterator[Conversation]:
        """``owner``'s conversations of ``mode`` that it did not name (a request may be
        matched to one by its content), oldest first."""
        return (c for c in list(self._by_id.values())
                if not c.explicit and c.mode == mode and c.owner == owner)

    def pooled(self, conversation_id: str) -> PooledEpisode | None:
        """The conversation's open episode (None once the pool closed it)."""
        return self._pool.episodes.get(conversation_id)

    async def open(self, conversation: Conversation, config: AgentConfig,
                   screen: Screen) -> PooledEpisode:
        """Open ``conversation``'s episode (seed 0: a request and its seed alone decide the
        sampling, whatever the conversation) and hold the conversation."""
        pooled = await self._pool.open(conversation.conversation_id, config,
                                       conversation.instruction, screen, seed=0,
                                       evictable=self._evictable)
        self._by_id[conversation.conversation_id] = conversation
        if conversation.name is not None:
            self._by_name[(conversation.owner, conversation.name)] = (
                conversation.conversation_id)
        return pooled

    async def close(self, conversation_id: str) -> None:
        self._forget(conversation_id)
        await self._pool.close(conversation_id)

    def prune(self) -> None:
        """Forget conversations whose episode the pool closed (evicted for a new one)."""
        for cid in [c for c in self._by_id if c not in self._pool.episodes]:
            self._forget(cid)

    def _forget(self, conversation_id: str) -> None:
        conv = self._by_id.pop(conversation_id, None)
        if conv is not None and conv.name is not None:
            if self._by_name.get((conv.owner, conv.name)) == conversation_id:
                del self._by_name[(conv.owner, conv.name)]
