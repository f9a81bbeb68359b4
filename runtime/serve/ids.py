"""The ids a model host hands out, and the numbers behind its episodes' sampling.

An id is unguessable — ``ep-<22 url-safe characters>``, ``chat-…`` (``secrets``: 128 bits) —
so holding one is no way into another client's episode (ownership is checked besides, see
``runtime/serve/owners.py``).  Episodes and chat conversations have separate prefixes, hence
separate namespaces: a chat ``user`` naming an episode's id names a conversation.

The sampling seed is NOT the id: episodes are numbered 1, 2, 3, … in the order the host opens
them (``IdCounter.next_number``), and that number is the episode's seed, as it always was —
the same number gives the same outputs, on one host or a cluster (whose front door numbers
its episodes itself).  Chat conversations sample with the request's seed and draw no number.
"""

from __future__ import annotations

import secrets


#: Bytes of randomness in an id (``secrets.token_urlsafe``: 22 characters).
ID_BYTES = 16


def new_id(prefix: str) -> str:
    """A fresh unguessable id: ``prefix`` + '-' + 22 url-safe characters."""
    return f"{prefix}-{secrets.token_urlsafe(ID_BYTES)}"


class IdCounter:
    """The episodes' numbers (their sampling seeds), in the order they are opened."""

    def __init__(self) -> None:
        self._last = 0

    def next_number(self) -> int:
        self._last += 1
        return self._last
