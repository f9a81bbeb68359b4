"""Import OSWorld's own agents (``mm_agents``, shipped in the ``desktop-env`` wheel).

The wheel leaves out ``mm_agents/utils``, which ``mm_agents.qwen3vl_agent`` imports for one
function: ``qwen_vl_utils.smart_resize(height, width, factor, min_pixels, max_pixels)`` —
Qwen-VL's published resize rule.  When that module is missing, a stand-in computing the same
rule with kvagent's own implementation (``runtime.profiles.resize``) is registered; an OSWorld
checkout that has the module uses its own.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType

from runtime.profiles import resize


#: qwen_vl_utils' published defaults (Qwen2-VL: 4 to 16384 merged 28x28 patches)
QWEN_VL_MIN_PIXELS = 4 * 28 * 28
QWEN_VL_MAX_PIXELS = 16384 * 28 * 28


def _smart_resize(height: int, width: int, factor: int = 28,
                  min_pixels: int = QWEN_VL_MIN_PIXELS,
                  max_pixels: int = QWEN_VL_MAX_PIXELS) -> tuple[int, int]:
    w, h = resize.smart_resize((width, height), unit=factor, min_pixels=min_pixels,
                               max_pixels=max_pixels)
    return h, w


def load_qwen3vl_agent() -> ModuleType:
    """``mm_agents.qwen3vl_agent`` (needs dashscope, backoff, google-api-core, openai)."""
    name = "mm_agents.utils.qwen_vl_utils"
    try:
        found = importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # no mm_agents.utils package at all
        found = False
    if not found and name not in sys.modules:
        package = ModuleType("mm_agents.utils")
        package.__path__ = []  # a namespace for the stand-in only
        utils = ModuleType(name)
        utils.smart_resize = _smart_resize  # type: ignore[attr-defined]
        sys.modules["mm_agents.utils"], sys.modules[name] = package, utils
    return importlib.import_module("mm_agents.qwen3vl_agent")
