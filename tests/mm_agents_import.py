"""Import OSWorld's own agents (``mm_agents``, shipped in the ``desktop-env`` wheel) the way
docs/serving.md tells users to: through ``runtime.osworld.mm_agents`` (the stand-in for the
wheel's missing ``mm_agents.utils.qwen_vl_utils``, a ``reset`` that takes ``vm_ip``)."""

from __future__ import annotations

from runtime.osworld.mm_agents import load_qwen3vl_agent, qwen3vl_agent_class

__all__ = ["load_qwen3vl_agent", "qwen3vl_agent_class"]
