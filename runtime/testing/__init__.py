"""kvagent.testing: what a test of an agent or a cache policy built on kvagent needs — the pytest
plugin's fixtures (``runtime.testing.plugin``, registered as the ``pytest11`` entry point
``kvagent``) and the helpers behind them, importable for tests that want them directly.

The names below are loaded on first use (PEP 562): pytest imports this package for every run
(the plugin lives in it), and most runs never touch an engine.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name → the module of this package that defines it
_EXPORTS = {
    "FIXED_DECODE": "exactness", "NotExactError": "exactness", "SAMPLED_DECODE": "exactness",
    "assert_engine_exact": "exactness", "assert_exact": "exactness",
    "assert_same_outputs": "exactness",
    "FORGED_CONFIG": "engines", "SHIPPED_CONFIG": "engines", "Shelf": "engines",
    "forged_files": "engines",
    "DEFAULT_SCREEN": "scheduling", "LedgerLeakError": "scheduling",
    "check_ledger_empty": "scheduling", "open_scheduler": "scheduling",
    "LoopbackServer": "serving", "UncleanExitError": "serving", "keyed_server": "serving",
    "kvagent_serve": "serving",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # loaded here, on first use: see the module docstring
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
