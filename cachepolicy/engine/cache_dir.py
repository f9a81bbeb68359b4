"""Where kvagent keeps what it computes once per machine: forged models and measured facts.

One rule for every user of the cache (the forge above the engine, the engine's measured row
classes): ``$KVAGENT_CACHE_DIR`` if set, else ``~/.cache/kvagent/models``.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "KVAGENT_CACHE_DIR"


def cache_root() -> Path:
    """``$KVAGENT_CACHE_DIR`` if set, else ``~/.cache/kvagent/models``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kvagent" / "models"
