"""What the bench decodes: the ``AgentConfig`` every bench arm starts from (``kvagent bench``,
the benches beside it, and scripts that run arms themselves, e.g. examples/custom_policy.py)."""

from __future__ import annotations

import attrs

from runtime.config import AgentConfig


def bench_agent_defaults() -> AgentConfig:
    """What the bench decodes: 16 tokens every step, greedy, no grammar, end-of-generation
    ignored — a fixed amount of decode work per step, so arms compare; and no
    unchanged-screenshot guess (the policies' own work: ``--decode-arms`` measures it)."""
    return attrs.evolve(AgentConfig(), grammar=False, decode_tokens=16, stop_at_eog=False,
                        guess="off")
