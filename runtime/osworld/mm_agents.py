"""OSWorld's own agents (``mm_agents``, shipped in the ``desktop-env`` wheel) pointed at
``kvagent serve``'s chat API — what the wheel, as published, needs to run them.

``mm_agents.qwen3vl_agent`` (``Qwen3VLAgent``) needs two things the wheel does not give:

- the module ``mm_agents.utils.qwen_vl_utils`` it imports ``smart_resize`` from is not in the
  wheel (OSWorld's repository has it).  ``install_qwen_vl_utils`` registers a stand-in
  computing Qwen-VL's published resize rule with kvagent's own implementation
  (``runtime.profiles.resize``) — only when the module is missing: a checkout's own wins;
- its ``reset(self, _logger=None)`` takes no ``vm_ip``, which OSWorld's
  ``lib_run_single.run_single_example`` passes (``agent.reset(runtime_logger,
  vm_ip=env.vm_ip)``, then ``agent.reset(vm_ip=...)``: both raise ``TypeError``).
  ``qwen3vl_agent_class()`` returns a subclass whose ``reset`` accepts and ignores it.

Everything else is the agent as published: its prompt, its parser, its OpenAI backend
(``api_backend="openai"``: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` from the environment; its
default backend is DashScope's cloud).

OSWorld's UI-TARS agents (``mm_agents.uitars15_v1`` / ``uitars15_v2`` / ``uitars_agent``;
they import ``loguru``) have the same ``reset`` without ``vm_ip`` (``uitars_agent``'s even
requires the logger): ``uitars_agent_class()`` gives the same fix.  See docs/serving.md.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType
from typing import Any

from runtime.profiles import resize

#: qwen_vl_utils' published defaults (Qwen2-VL: 4 to 16384 merged 28x28 patches).
QWEN_VL_MIN_PIXELS = 4 * 28 * 28
QWEN_VL_MAX_PIXELS = 16384 * 28 * 28
QWEN_VL_UTILS = "mm_agents.utils.qwen_vl_utils"


def _smart_resize(height: int, width: int, factor: int = 28,
                  min_pixels: int = QWEN_VL_MIN_PIXELS,
                  max_pixels: int = QWEN_VL_MAX_PIXELS) -> tuple[int, int]:
    w, h = resize.smart_resize((width, height), unit=factor, min_pixels=min_pixels,
                               max_pixels=max_pixels)
    return h, w


def install_qwen_vl_utils() -> bool:
    """Register the ``mm_agents.utils.qwen_vl_utils`` stand-in if the module is missing;
    True when it did."""
    if QWEN_VL_UTILS in sys.modules:  # (imported, or the stand-in registered already)
        return False
    try:
        found = importlib.util.find_spec(QWEN_VL_UTILS) is not None
    except ModuleNotFoundError:  # no mm_agents.utils package at all
        found = False
    if found:
        return False
    package = ModuleType("mm_agents.utils")
    package.__path__ = []  # a namespace for the stand-in only
    utils = ModuleType(QWEN_VL_UTILS)
    utils.smart_resize = _smart_resize  # type: ignore[attr-defined]
    sys.modules["mm_agents.utils"], sys.modules[QWEN_VL_UTILS] = package, utils
    return True


def load_qwen3vl_agent() -> ModuleType:
    """``mm_agents.qwen3vl_agent`` (needs dashscope, backoff, google-api-core, openai)."""
    install_qwen_vl_utils()
    return importlib.import_module("mm_agents.qwen3vl_agent")


def qwen3vl_agent_class() -> type:
    """OSWorld's ``Qwen3VLAgent``, with a ``reset`` that takes what runners pass."""
    return runner_reset(load_qwen3vl_agent().Qwen3VLAgent)


#: OSWorld's UI-TARS agent modules (``mm_agents.<module>``) and their classes' names
UITARS_MODULES = {"uitars15_v1": "UITARSAgent", "uitars15_v2": "UITarsAgent",
                  "uitars_agent": "UITARSAgent"}


def uitars_agent_class(module: str = "uitars15_v1") -> type:
    """OSWorld's UI-TARS agent of ``mm_agents.<module>`` (``UITARS_MODULES``; needs openai and
    loguru), with a ``reset`` that takes what runners pass."""
    if module not in UITARS_MODULES:
        raise ValueError(f"unknown UI-TARS module {module!r} (known: "
                         f"{', '.join(UITARS_MODULES)})")
    base = getattr(importlib.import_module(f"mm_agents.{module}"), UITARS_MODULES[module])
    return runner_reset(base)


def runner_reset(base: Any) -> type:
    """A subclass of the OSWorld agent class ``base`` whose ``reset`` accepts every form
    runners use — ``reset()``, ``reset(logger)``, ``reset(logger, vm_ip=...)``,
    ``reset(vm_ip=...)``, ``reset(runtime_logger=...)`` — and calls the published ``reset``
    with the logger alone (positionally: some require it).  Nothing else changes."""

    def reset(self: Any, _logger: Any = None, vm_ip: str | None = None,
              **kwargs: Any) -> None:
        if _logger is None:
            _logger = kwargs.get("runtime_logger")
        base.reset(self, _logger)

    return type(base.__name__, (base,), {
        "reset": reset, "__module__": __name__,
        "__doc__": f"OSWorld's {base.__name__}; ``reset`` also accepts ``vm_ip`` (and other "
                   f"keywords runners pass), which the published one refuses."})
