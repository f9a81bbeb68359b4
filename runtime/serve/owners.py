"""Who owns what on a model host: every episode and chat conversation belongs to the API key
that opened it (its key id, never the key: ``runtime/serve/http/auth.py``).

The domain checks ownership where an id becomes an object — ``EpisodeService.get``,
``Conversations.get`` / ``named`` — and answers another owner exactly as it answers an
unknown id (``UnknownEpisodeError``, a 404): whether an id exists is not revealed.  A server
without keys has one tenant, ``ANONYMOUS``.
"""

from __future__ import annotations

#: An API key's id (``key-1``, …), or ``ANONYMOUS``.
Owner = str

#: The one tenant of a server run without keys.
ANONYMOUS: Owner = "anonymous"


class OwnedIds:
    """Open ids by owner (the episodes of the episode API; conversations keep their own)."""

    def __init__(self) -> None:
        self._owner: dict[str, Owner] = {}

    def record(self, item_id: str, owner: Owner) -> None:
        self._owner[item_id] = owner

    def owns(self, item_id: str, owner: Owner) -> bool:
        return self._owner.get(item_id) == owner

    def forget(self, item_id: str) -> None:
        self._owner.pop(item_id, None)

    def prune(self, open_ids: object) -> None:
        """Forget ids that are no longer open (``open_ids`` supports ``in``)."""
        for item_id in [i for i in self._owner if i not in open_ids]:  # type: ignore[operator]
            del self._owner[item_id]
