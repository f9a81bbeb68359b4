"""``kvagent serve``: one model host (engine, scheduler, memory ledger) for many agents.

Two layers, imports pointing down only (``tests/test_import_layers.py`` checks it):

- **HTTP** (``runtime/serve/http/``): the Starlette app and its route table (shared with the
  cluster's front door), request parsing, response bodies, server-sent events, and the ONE
  mapping of failures to OpenAI-shaped errors with their status and ``Retry-After``;
- **the domain** (here), which knows no HTTP: ``host.py`` (``ModelHost``: the running parts
  and the services over them), ``episodes.py`` (the episode API's service),
  ``chat.py`` (chat completions) with its two strategies ``terminal.py`` and
  ``faithful.py``, ``conversation.py`` / ``conversations.py`` (what a host holds of a chat
  and the open ones), ``messages.py`` (a chat request as values), ``json_schema.py`` (JSON
  schema → GBNF for constrained answers), ``owners.py`` (every episode and conversation
  belongs to an API key), ``slots.py`` (the one rule of which idle episode gives its slot),
  ``leases.py`` (clients saying they are alive), ``config.py``, ``ids.py`` (unguessable ids,
  the episodes' numbers) and ``prometheus.py`` (the counters behind ``GET /metrics``).
"""

from runtime.serve.config import Limits, ServeConfig
from runtime.serve.host import ModelHost

__all__ = ["Limits", "ModelHost", "ServeConfig"]
