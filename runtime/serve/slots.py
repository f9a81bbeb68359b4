"""Which open episode or conversation may give its slot to a new one — ONE rule, asked by
every open, episode or chat alike, when every slot is taken (the pool then closes the least
recently used idle one the rule allows; a busy one never):

- a chat conversation, once it has answered (chats have no end; a conversation that is still
  being told its earlier turns is not idle, it is being opened);
- an episode whose client's lease dropped (``leases.py``: the client ended);
- any episode idle longer than ``idle_s`` (``--idle-seconds``: a client that vanished
  without a lease, or one that thinks longer than any VM action takes).

With none allowed, the open is refused (429, with ``Retry-After``).
"""

from __future__ import annotations

import time

from runtime.pool import PooledEpisode
from runtime.serve.conversations import Conversations
from runtime.serve.leases import Leases


class SlotRule:
    def __init__(self, conversations: Conversations, leases: Leases, *, idle_s: float) -> None:
        self._conversations, self._leases, self.idle_s = conversations, leases, idle_s

    def evictable(self, pooled: PooledEpisode) -> bool:
        conv = self._conversations.get(pooled.episode_id)
        if conv is not None:
            return conv.stepped
        if self._leases.dropped(pooled.episode_id):
            return True
        return time.monotonic() - pooled.last_used > self.idle_s
